"""Stage "data card": what the active profile's image data is, for `make report`: the data
set's label (GENERATED where it was made on the machine) and, for the generated benchmark,
its data card (docs/data_card_synth.md)."""

from __future__ import annotations

from pathlib import Path

from darel import io, stagekit


def card_text(label: str, card: str | None) -> str:
    """The report's data page: the label first, then the card (None: a data set without one)."""
    head = f"# The data of this build\n\n**{label}**\n\n"
    return head + (card if card is not None else "No data card beyond this label: the data set is a public one.\n")


def main() -> None:
    ap = stagekit.parser(__doc__, "--meta", "--out")
    ap.add_argument("--card", help="the data set's card (Markdown), where it has one")
    args = ap.parse_args()
    _, log = stagekit.start(args, "data_card", writes=Path(args.out).parent)
    label = io.read_json(args.meta, kind="data set metadata")["label"]
    card = io.read_regular_bytes(args.card, io.RECORD_LIMIT, "data card").decode() if args.card else None
    io.write_text(args.out, card_text(label, card))
    log.info("data card for %s", label)


if __name__ == "__main__":
    main()
