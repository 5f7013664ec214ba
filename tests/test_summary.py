"""The end-of-build summary says what the figures are: their data (GENERATED where it is not
the paper's), each model's baseline and DAREL span, and how many rows ran over budget."""

from __future__ import annotations

import pandas as pd

from darel.table1 import ADHERENCE_LIMIT
from darel.tools.summary import table1_glance

LABEL = "GENERATED: synth benchmark, cpu size (not a real data set)"


def _rows() -> pd.DataFrame:
    rows = [("resnet18", "baseline", 1.0, 0.0, float("nan"), 36.98),
            ("resnet18", "darel", 1.277, 3.9, 0.78, 33.08),
            ("resnet18", "darel", 1.98, 8.06, ADHERENCE_LIMIT + 0.001, 28.9),
            ("resnet18", "darel", 1.69, 10.45, 1.186, 26.5),
            ("resnet18", "darel", 1.5, 7.0, ADHERENCE_LIMIT, 30.0),  # at the limit: not over
            ("resnet18", "ids+adonis", 2.4, 6.8, float("nan"), 30.2),
            ("resnet18_hc", "baseline", 1.0, 0.0, float("nan"), 42.69),
            ("resnet18_hc", "darel", 1.48, 6.23, 0.67, 36.46)]
    table = pd.DataFrame(rows, columns=["model", "method", "boost", "acc_drop_pp", "budget_adherence", "top1"])
    table["dataset_label"] = LABEL
    return table


def test_glance_names_the_data_and_counts_rows_over_budget():
    lines = table1_glance(_rows())
    assert lines[0] == f"{'data':<16} {LABEL}"
    assert "not the paper's results" in lines[1]
    assert lines[2] == (f"{'resnet18':<16} baseline top-1 36.98 %; 4 DAREL rows: boost 1.28-1.98x, top-1 drop "
                        "3.9-10.4 pp; 2 of 4 over their time budget (measured time up to 1.19 x t T)")
    assert lines[3] == (f"{'resnet18_hc':<16} baseline top-1 42.69 %; 1 DAREL row: boost 1.48x, top-1 drop 6.2 pp; "
                        "0 of 1 over their time budget")


def test_glance_of_real_data_has_no_generated_note():
    table = _rows()
    table["dataset_label"] = "CIFAR-100 (torchvision files, sha256-checked)"
    lines = table1_glance(table)
    assert lines[0].endswith("CIFAR-100 (torchvision files, sha256-checked)")
    assert not any("not the paper's" in line for line in lines)
