"""The end-of-build summary says what the figures are: their data (GENERATED where it is not
the paper's), each model's baseline and DAREL span beside the paper's, how many rows ran over
budget and how busy the machine was beside them."""

from __future__ import annotations

import pandas as pd

from darel.table1 import ADHERENCE_LIMIT
from darel.tools.summary import table1_glance

LABEL = "GENERATED: synth benchmark, cpu size (not a real data set)"


def _rows() -> pd.DataFrame:
    nan = float("nan")
    rows = [("resnet18", "baseline", nan, nan, 1.0, 0.0, nan, 36.98, 0.3),
            ("resnet18", "darel", 1.0, 1.0, 1.277, 3.9, 0.78, 33.08, 0.1),
            ("resnet18", "darel", 0.8, 0.8, 1.98, 8.06, ADHERENCE_LIMIT + 0.001, 28.9, 1.4),
            ("resnet18", "darel", 0.7, 0.8, 1.69, 10.45, 1.186, 26.5, 0.2),
            ("resnet18", "darel", 0.5, 0.8, 1.5, 7.0, ADHERENCE_LIMIT, 30.0, 2.0),  # at the limit: not over
            ("resnet18", "ids+adonis", nan, nan, 2.4, 6.8, nan, 30.2, 0.0),
            ("resnet18_hc", "baseline", nan, nan, 1.0, 0.0, nan, 42.69, 0.0),
            ("resnet18_hc", "darel", 1.0, 1.0, 1.48, 6.23, 0.67, 36.46, 0.0)]
    table = pd.DataFrame(rows, columns=["model", "method", "t", "m", "boost", "acc_drop_pp", "budget_adherence", "top1",
                                        "cores_beside"])
    table["dataset_label"] = LABEL
    return table


def test_glance_names_the_data_puts_the_papers_figures_beside_and_the_load_of_rows_over_budget():
    lines = table1_glance(_rows())
    assert lines[0] == f"{'data':<16} {LABEL}"
    assert "not the paper's results" in lines[1]
    # The paper's B(1, 1), B(0.8, 0.8), B(0.7, 0.8), B(0.5, 0.8): boosts 1.46, 1.25, 1.43, 1.99; drops 3.01-11.43.
    assert lines[2:] == [
        f"{'resnet18':<16} baseline top-1 36.98 % (the paper's 75.86 %); 4 DAREL rows: boost 1.28-1.98x (the paper's "
        "1.25-1.99x), top-1 drop 3.9-10.4 pp (the paper's 3.0-11.4 pp)",
        f"{'':<16} 2 of 4 over their time budget (measured time up to 1.19 x t T; 0.2-1.4 other cores busy beside "
        "them, 0 on an idle machine)",
        f"{'resnet18_hc':<16} baseline top-1 42.69 % (the paper's 77.47 %); 1 DAREL row: boost 1.48x (the paper's "
        "2.09x), top-1 drop 6.2 pp (the paper's 3.0 pp)",
        f"{'':<16} 0 of 1 over their time budget"]


def test_glance_says_which_budgets_the_paper_lacks_and_a_load_not_recorded():
    table = _rows()
    table.loc[1, "t"] = 0.9  # B(0.9, 1) is not in the paper's Table 1
    table["cores_beside"] = float("nan")  # records older than the load measurement
    lines = table1_glance(table)
    assert "boost 1.28-1.98x (the paper's 1.25-1.99x over 3 of them)" in lines[2]
    assert "top-1 drop 3.9-10.4 pp (the paper's 4.6-11.4 pp over 3 of them)" in lines[2]
    assert lines[3].endswith("(measured time up to 1.19 x t T; the load beside them not recorded)")


def test_glance_of_real_data_has_no_generated_note():
    table = _rows()
    table["dataset_label"] = "CIFAR-100 (torchvision files, sha256-checked)"
    lines = table1_glance(table)
    assert lines[0].endswith("CIFAR-100 (torchvision files, sha256-checked)")
    assert not any("not the paper's" in line for line in lines)
