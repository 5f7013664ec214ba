from __future__ import annotations

import pandas as pd
import pytest

from darel.nlg.tables import NLG_LEADING, build_nlg_table, compare_nlg_with_paper, load_paper_table


def _cell(model, alpha, time_s, bleu=0.6, variants=True):
    cell = {"table": "table2", "model": model, "cell": "lora" if alpha is None else f"a{alpha:.2f}",
            "method": "lora" if alpha is None else "darel", "alpha": alpha, "profile": "quick", "seed": 0,
            "dataset_label": "SYNTHETIC test", "BLEU": bleu, "TER": 40.0, "METEOR": 0.41, "NIST": 7.5,
            "ROUGE_L": 0.6, "CIDEr": 2.0, "time_s": time_s, "peak_mem_bytes": 10, "co2e_kg": 1e-6,
            "energy_kwh": 1e-5, "n_train": 10}
    if variants:
        cell.update({"METEOR_nltk_exact_x100": 70.0, "METEOR_sentavg_x100": 42.0, "NIST_nltk": 6.1,
                     "NIST_sentavg": 6.5})
    return cell


def test_rows_boost_and_order():
    cells = [_cell("gpt2-small", 0.7, 7.0), _cell("gpt2-small", None, 14.0), _cell("gpt2-small", 0.9, 10.0),
             _cell("gpt2-medium", None, 30.0), _cell("gpt2-medium", 0.8, 20.0)]
    table = build_nlg_table(cells)
    assert list(table.columns[: len(NLG_LEADING)]) == NLG_LEADING
    small = table[table["model"] == "gpt2-small"]
    assert small["method"].tolist() == ["lora", "darel", "darel"]
    assert small["alpha"].tolist()[1:] == [0.9, 0.7]  # baseline first, then alpha descending
    assert small["boost"].tolist() == pytest.approx([1.0, 1.4, 2.0])
    assert table[table["model"] == "gpt2-medium"]["boost"].tolist() == pytest.approx([1.0, 1.5])
    assert "NIST_nltk" in table.columns and "METEOR_nltk_exact_x100" in table.columns


def test_every_model_needs_one_baseline():
    with pytest.raises(ValueError, match="gpt2-large"):
        build_nlg_table([_cell("gpt2-large", 0.8, 5.0)])
    with pytest.raises(ValueError, match="no cells"):
        build_nlg_table([])


@pytest.mark.parametrize("table", ["table2", "table3"])
def test_paper_reference_tables_cover_every_cell(table):
    paper = load_paper_table(table)
    assert list(paper.columns) == NLG_LEADING
    for model in ("gpt2-small", "gpt2-medium", "gpt2-large"):
        rows = paper[paper["model"] == model]
        assert rows["method"].tolist() == ["lora", "darel", "darel", "darel"]
        assert rows["alpha"].tolist()[1:] == [0.9, 0.8, 0.7]


def test_comparison_puts_paper_beside_ours_with_scales_said():
    table = build_nlg_table([_cell("gpt2-small", None, 14.0, bleu=0.6512), _cell("gpt2-small", 0.8, 10.0)])
    text = compare_nlg_with_paper(table, load_paper_table("table2"), "Table 2 (E2E-NLG)")
    assert "WARNING: not the paper profile" in text
    baseline = next(line for line in text.splitlines() if line.startswith("| gpt2-small | LoRA |"))
    # paper boost (none for the baseline), ours 1.00; paper BLEU 67.30, ours x100
    assert "| — | 1.00 | 67.30 | 65.12 |" in baseline
    variants = text.split("## METEOR and NIST on the paper's scale")[1]
    assert "| gpt2-small | LoRA | 75.82 | 70.00 | 6.39 | 6.10 |" in variants


def test_comparison_leaves_out_variants_it_does_not_have():
    table = build_nlg_table([_cell("gpt2-small", None, 14.0, variants=False)])
    text = compare_nlg_with_paper(table, load_paper_table("table2"), "Table 2")
    assert "paper's scale (candidate" not in text
    assert isinstance(table, pd.DataFrame)


def test_csv_rounding_keeps_tiny_co2e_and_integer_counts():
    from darel.nlg.tables import CSV_DECIMALS, CSV_INTEGERS
    from darel.table1 import round_for_csv

    cell = _cell("gpt2-small", None, 7.36881)
    cell.update({"co2e_kg": 2.0367043e-05, "energy_kwh": 5.5124e-05, "BLEU": 0.427123, "n_outputs_cut": 3})
    out = round_for_csv(build_nlg_table([cell]), CSV_DECIMALS, CSV_INTEGERS)
    row = out.iloc[0]
    assert row["co2e_kg"] == 2.037e-05 and row["energy_kwh"] == 5.512e-05  # not rounded away to 0
    assert row["BLEU"] == 0.4271 and row["time_s"] == 7.37
    assert str(out["n_outputs_cut"].dtype) == "Int64" and row["n_outputs_cut"] == 3
