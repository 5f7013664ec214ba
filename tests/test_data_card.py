"""The report's data page (stages/data_card.py): the label first, then the card."""

from __future__ import annotations

from tests.conftest import load_script

data_card = load_script("stages/data_card.py", "stage_data_card")


def test_the_page_opens_with_the_label_and_holds_the_card_or_says_there_is_none():
    page = data_card.card_text("GENERATED: synth benchmark (not a real data set)", "## Sizes\n\n| a | b |\n")
    assert page == ("# The data of this build\n\n**GENERATED: synth benchmark (not a real data set)**\n\n"
                    "## Sizes\n\n| a | b |\n")
    assert data_card.card_text("CIFAR-100", None).endswith("the data set is a public one.\n")
