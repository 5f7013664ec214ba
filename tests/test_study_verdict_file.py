"""The verdict file's bytes, rendered from a committed study's rows (issue 50, item 4: the
split of ``verdict_markdown`` into named helpers changed no byte), and the parts of it that
depend on the data: the positive control on data without label noise (issue 50, item 5)."""

from __future__ import annotations

import pandas as pd
import pytest

from darel.study import (ACCOUNTINGS, TABLE1_METRICS, assess, neighbour_note, paired_differences, summarize,
                         validation_checks, validation_methods, verdict_markdown)
from tests.conftest import ROOT

ROWS = ROOT / "docs" / "studies" / "synth_study5_2026-11-28_rows.csv"
GOLDEN = ROOT / "tests" / "data" / "verdicts"
# The fifth quick study's verdict parameters (config.study_verdict_params of its declaration), fixed
# here so that a later declaration in params.yaml does not move the golden files.
PRIMARY = {"schedule": "matched", "metric": "top1", "accounting": "time_s", "budgets": "all", "methods": ["random"],
           "margin": 3.0, "cells": None}
VALIDATION = {"negative": "darel-restream", "positive": ["oracle-clean", "random"], "positive_cells": ["t0.80_m0.80"]}


def render(rows: pd.DataFrame, *, schedule: str = "matched", primary: dict | None = PRIMARY,
           validation: dict | None = VALIDATION, design: str | None = None) -> str:
    """The verdict file as stages/study_table.py writes it for ``--kind table1``."""
    level, power = 0.05, 0.8
    summary = summarize(rows, TABLE1_METRICS)
    compared = rows[~rows["method"].isin(validation_methods(validation))]
    checks = validation_checks(rows, "top1", validation, level=level, power=power) if design is None else None
    diffs = assess({figure: paired_differences(compared, metric=figure, level=level, power=power)
                    for figure in ("top1", "time_s", "time_total_s")},
                   primary=primary, schedule=schedule if design is None else None, margins={"top1": 1.0},
                   level=level, power=power)
    return verdict_markdown(diffs, summary, title="study_table1: DAREL against simple controls", profile="quick",
                            dataset=str(rows["dataset_label"].iloc[0]), seeds=sorted(set(rows["seed"])),
                            metric="top1", unit="percentage points of test top-1", schedule=schedule, margin=1.0,
                            level=level, power=power, primary=primary, design=design, accountings=ACCOUNTINGS,
                            checks=checks, validation=validation, neighbours=neighbour_note(rows))


VARIANTS = {
    "primary": {},
    "exploratory_paper_rule": {"schedule": "paper"},
    "no_declaration_no_controls": {"primary": None, "validation": None},
    "own_design": {"design": "Compared: the same runs under a design sentence of its own", "validation": None},
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_the_verdict_file_renders_the_committed_rows_byte_for_byte(name):
    # Golden files written by the verdict_markdown before its split (commit b7349ef).
    expected = (GOLDEN / f"study5_{name}.md").read_bytes()
    assert render(pd.read_csv(ROWS), **VARIANTS[name]).encode() == expected
