"""The verdict file's bytes, rendered from a committed study's rows (issue 50, item 4: the
split of ``verdict_markdown`` into named helpers changed no byte), and the parts of it that
depend on the data: the positive control on data without label noise (issue 50, item 5)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from darel.study import (ACCOUNTINGS, LABEL_NOISE_SHARE, NOT_APPLICABLE, TABLE1_METRICS, assess, fit_check, fit_rows,
                         holm, label_noise_share, last_quarter, neighbour_note, paired_differences, stage_comparisons,
                         stage_markdown, stage_methods, summarize, trustworthy, validation_checks, validation_methods,
                         variant_comparisons, variant_methods, verdict_markdown)
from tests.conftest import ROOT

ROWS = ROOT / "docs" / "studies" / "synth_study5_2026-11-28_rows.csv"
GOLDEN = ROOT / "tests" / "data" / "verdicts"
# The fifth quick study's verdict parameters (config.study_verdict_params of its declaration), fixed
# here so that a later declaration in params.yaml does not move the golden files.
PRIMARY = {"schedule": "matched", "metric": "top1", "accounting": "time_s", "budgets": "all", "methods": ["random"],
           "margin": 3.0, "cells": None}
VALIDATION = {"negative": "darel-restream", "positive": ["oracle-clean", "random"], "positive_cells": ["t0.80_m0.80"]}


# The fit regime's criteria (params.yaml, study.table1.fit_check.fit), fixed here for the same reason.
FIT_CRITERIA = {"train_top1_min": 95.0, "rise_max_pp": 2.0}
# The fit-regime pilot's measured baselines (bench/fit_regime_pilot.py --json): every candidate's
# curve and training top-1 on its whole training set.
PILOT = ROOT / "bench" / "results" / "fit_regime_pilot_candidates.json"


def pilot_fit_records(candidate: str = "c20n500w8e120") -> list[dict]:
    """The pilot's baselines of ``candidate`` as the baseline-fit stage records them."""
    found = [row for row in json.loads(PILOT.read_text())["rows"] if row["candidate"] == candidate]
    return [{"model": "resnet18", "seed": row["seed"], "train_top1": row["train_top1"],
             "train_clean_top1": row["train_clean_top1"], "train_noisy_top1": row["train_noisy_top1"],
             "last_quarter": last_quarter(row["curve"])} for row in found]


def render(rows: pd.DataFrame, *, schedule: str = "matched", primary: dict | None = PRIMARY,
           validation: dict | None = VALIDATION, design: str | None = None, fit: list[dict] | None = None) -> str:
    """The verdict file as stages/study_table.py writes it for ``--kind table1`` (``fit``: the
    baselines' fit records of a study declared in the fitting regime)."""
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
                            checks=checks, validation=validation, neighbours=neighbour_note(rows),
                            fit=None if fit is None else fit_rows(fit, rows), fit_criteria=FIT_CRITERIA if fit else None,
                            variants=variant_comparisons(rows, variant_methods(list(rows["method"].unique())), "top1",
                                                         margin=1.0, level=level, power=power)
                            if design is None else None, rows=rows,
                            stages=stage_comparisons(rows, stage_methods(list(rows["method"].unique())), "top1",
                                                     margin=1.0, level=level, power=power)
                            if design is None else None)


def with_a_variant(rows: pd.DataFrame) -> pd.DataFrame:
    """The study's rows plus its negative control's runs once more under the name of a DAREL
    variant (darel-floor): a layout fixture for the verdict's variant section, not a result."""
    twin = rows[rows["method"] == "darel-restream"].assign(method="darel-floor")
    return pd.concat([rows, twin], ignore_index=True)


VARIANTS = {
    "primary": {},
    "exploratory_paper_rule": {"schedule": "paper"},
    "no_declaration_no_controls": {"primary": None, "validation": None},
    "own_design": {"design": "Compared: the same runs under a design sentence of its own", "validation": None},
    "variant_and_fit": {"fit": pilot_fit_records()},
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_the_verdict_file_renders_the_committed_rows_byte_for_byte(name):
    # Golden files written by the verdict_markdown before its split (commit b7349ef); the study
    # without a variant or a fitting regime prints neither section, so those files did not change.
    # study5_variant_and_fit.md: the same rows with a variant (with_a_variant) and the fit pilot's
    # two baselines' fit.
    rows = pd.read_csv(ROWS)
    expected = (GOLDEN / f"study5_{name}.md").read_bytes()
    assert render(with_a_variant(rows) if name == "variant_and_fit" else rows, **VARIANTS[name]).encode() == expected


def test_the_least_squares_rise_and_the_fit_table_recompute_from_the_pilot_records():
    """The verdict's fit table from the pilot's recorded curves and training top-1: the rise is
    numpy's least-squares line through the last 30 of 120 epochs, over 29 epochs (the
    declaration's -0.62 and +0.11 pp); the training top-1 the record's."""
    records = pilot_fit_records()
    runs = {row["seed"]: row for row in json.loads(PILOT.read_text())["rows"] if row["candidate"] == "c20n500w8e120"}
    fit = fit_rows(records)
    assert list(fit["seed"]) == [300, 301]
    for row in fit.itertuples():
        curve = np.array(runs[row.seed]["curve"], dtype=float)
        slope, _ = np.polyfit(np.arange(91, 121), curve[90:], 1)
        assert row.lq_rise_pp == pytest.approx(29 * slope)
        assert row.lq_mean == pytest.approx(curve[90:].mean())
        assert row.lq_range_pp == pytest.approx(curve[90:].max() - curve[90:].min())
        assert (row.lq_from_epoch, row.lq_to_epoch) == (91, 120)
        assert row.train_top1 == runs[row.seed]["train_top1"]
    assert [round(r, 2) for r in fit["lq_rise_pp"]] == [0.11, -0.62]
    ok, line = fit_check(fit, FIT_CRITERIA)
    assert ok and "2 of 2 baselines reach training top-1 >= 95 %" in line and "(lowest 99.00 %)" in line
    # a candidate that underfits (60.9 % of its training set) fails, though its curve is flat
    underfit = fit_rows(pilot_fit_records("c20n1000w8e40"))
    ok, line = fit_check(underfit, FIT_CRITERIA)
    assert not ok and "FAILED" in line and "0 of 1 baselines reach" in line and "1 of 1 test curves are flat" in line
    # a rising curve is not flat
    rising = [{**records[0], "last_quarter": last_quarter(list(range(40)))}]
    assert fit_check(fit_rows(rising), FIT_CRITERIA)[0] is False
    # nor is a quarter of fewer than three evaluated epochs: no line to judge (a 3-epoch run's one point)
    short = [{**records[0], "last_quarter": last_quarter([10.0, 10.0, 10.0])}]
    ok, line = fit_check(fit_rows(short), FIT_CRITERIA)
    assert not ok and "0 of 1 test curves are flat" in line and "1 to 1 epochs" in line
    text = render(pd.read_csv(ROWS), fit=records)
    section = text.split("## The baselines' fit")[1].split("## Primary analysis")[0]
    assert "| resnet18 | 300 | 99.60 | 100.00 | 96.00 | — | 91-120 | 31.60 | 2.60 | +0.11 |" in section
    assert "## The baselines' fit" not in render(pd.read_csv(ROWS))  # a study that declares no fitting regime


def test_each_variant_is_compared_with_random_and_darel_in_families_of_its_own():
    rows = with_a_variant(pd.read_csv(ROWS))
    assert variant_methods(["darel", "random", "darel-history", "darel-bins", "darel-floor", "darel-restream",
                            "oracle-clean"]) == ["darel-history", "darel-bins", "darel-floor"]
    found = variant_comparisons(rows, ["darel-floor"], "top1", margin=1.0)
    assert set(zip(found["variant"], found["control"])) == {("darel-floor", "random"), ("darel-floor", "darel")}
    by_method = {method: group.set_index(["cell", "seed"])["top1"] for method, group in rows.groupby("method")}
    for other, family in found.groupby("control"):
        assert len(family) == 3  # one comparison a budget, Holm over the three
        for row in family.itertuples():
            expected = (by_method["darel-floor"].loc[row.cell] - by_method[other].loc[row.cell]).mean()
            assert row.mean_diff == pytest.approx(expected)
        assert list(family["p_holm"]) == pytest.approx(holm(list(family["p_value"])))
    # variant minus darel is the opposite of darel minus the variant, adjusted in its own family
    darel_minus = paired_differences(rows[rows["method"].isin(["darel", "darel-floor"])], "top1")
    mine = found[found["control"] == "darel"].set_index("cell")["mean_diff"]
    assert list(mine) == pytest.approx(list(-darel_minus.set_index("cell").loc[mine.index, "mean_diff"]))
    text = render(rows)
    section = text.split("## DAREL's variants")[1]
    assert section.count("| darel-floor | resnet18, ") == 6 and "| darel-floor - random |" in section
    assert "DAREL better" not in section and "DAREL worse" not in section
    assert "## DAREL's variants" not in render(pd.read_csv(ROWS))  # no variant in the study


def _controls_section(text: str) -> str:
    return text.split("## Primary analysis")[0]


def test_without_label_noise_the_positive_control_is_not_applicable_never_failed():
    rows = pd.read_csv(ROWS)
    assert label_noise_share(rows) == pytest.approx(0.1)
    # The same runs, recorded as if the data had no wrong labels, and the oracle's gain taken away:
    # judged, that gain's absence would fail the study; on such data it only says the control does not apply.
    clean = rows.assign(**{LABEL_NOISE_SHARE: 0.0})
    oracle = clean["method"] == "oracle-clean"
    random_top1 = clean[clean["method"] == "random"].set_index(["cell", "seed"])["top1"]
    clean.loc[oracle, "top1"] = [random_top1[(c, s)] for c, s in zip(clean.loc[oracle, "cell"], clean.loc[oracle, "seed"])]
    checks = validation_checks(clean, "top1", VALIDATION, level=0.05)
    positive = checks[checks["check"] == "positive"]
    assert len(positive) == 3 and not positive["applicable"].any() and positive["passed"].isna().all()
    assert (positive["mean_diff"] == 0).all()
    assert trustworthy(checks, VALIDATION) == (None, [NOT_APPLICABLE])
    head = _controls_section(render(clean))
    assert "not trustworthy" not in head and "The positive control is not applicable: the training data has no " \
        "label noise" in head
    assert "**This study is not validated**: no positive control applies to this data." in head
    assert head.count("| not applicable |") == 3 and head.count("| yes |") == 3  # the negative control still judged
    # With the label noise recorded, the same absent gain fails the study, as before.
    noisy = clean.assign(**{LABEL_NOISE_SHARE: 0.1})
    ok, reasons = trustworthy(validation_checks(noisy, "top1", VALIDATION, level=0.05), VALIDATION)
    assert ok is False and "did not find the gain that is there" in reasons[0]
    assert "**This study is not trustworthy**" in _controls_section(render(noisy))


def test_a_failed_negative_control_beside_an_inapplicable_positive_one_names_only_the_failure():
    rows = pd.read_csv(ROWS).assign(**{LABEL_NOISE_SHARE: 0.0})
    restream = rows["method"] == "darel-restream"
    rows.loc[restream, "top1"] -= 5 + 0.1 * rows.loc[restream, "seed"] % 3  # DAREL 5 pp above its own twin
    checks = validation_checks(rows, "top1", VALIDATION, level=0.05)
    ok, reasons = trustworthy(checks, VALIDATION)
    assert ok is False and reasons[0].startswith("the negative control") and reasons[1:] == [NOT_APPLICABLE]
    head = _controls_section(render(rows))
    failure = next(line for line in head.splitlines() if line.startswith("**This study is not trustworthy**"))
    assert "negative control" in failure and "not applicable" not in failure
    assert "The positive control is not applicable" in head


def test_runs_that_record_no_categories_leave_the_positive_control_as_it_was():
    rows = pd.read_csv(ROWS).drop(columns=[LABEL_NOISE_SHARE])
    assert label_noise_share(rows) is None
    assert validation_checks(rows, "top1", VALIDATION, level=0.05)["applicable"].all()
    assert label_noise_share(rows.assign(**{LABEL_NOISE_SHARE: float("nan")})) is None


def test_rare_and_common_top1_get_their_own_secondary_tables_when_recorded():
    """Rows with top1_rare/top1_common (evaluations that name the rare classes): one table each
    after the time tables, DAREL minus each control recomputed from the rows; rows without
    them render no such table (the golden files above)."""
    from darel.study import PER_CLASS_FIGURES

    rows = pd.read_csv(ROWS)
    rows = rows.assign(top1_rare=rows["top1"] - 10 * (rows["method"] == "darel"), top1_common=rows["top1"] + 1)
    level, power = 0.05, 0.8
    diffs = assess({figure: paired_differences(rows[rows["method"] != "darel-restream"], metric=figure, level=level,
                                               power=power)
                    for figure in ("top1", "time_s", "time_total_s", *PER_CLASS_FIGURES)},
                   primary=PRIMARY, schedule="matched", margins={"top1": 1.0}, level=level, power=power)
    rare = diffs["top1_rare"]
    assert set(rare["role"]) == {"secondary"}  # never in the primary family
    darel = rows[rows["method"] == "darel"].set_index(["cell", "seed"])["top1_rare"]
    random_ = rows[rows["method"] == "random"].set_index(["cell", "seed"])["top1_rare"]
    for row in rare[rare["control"] == "random"].itertuples():
        expected = (darel.loc[row.cell] - random_.loc[row.cell]).mean()
        assert row.mean_diff == pytest.approx(expected)
    text = verdict_markdown(diffs, summarize(rows, TABLE1_METRICS), title="t", profile="fit", dataset="d",
                            seeds=sorted(set(rows["seed"])), metric="top1", unit="pp", schedule="matched", margin=1.0,
                            level=level, power=power, primary=PRIMARY, accountings=ACCOUNTINGS)
    for heading in PER_CLASS_FIGURES.values():
        assert f"### {heading}" in text
    # every method's own per-class figures, means over the seeds
    table = render(rows).split("### Top-1 per method on the rare and the other classes")[1]
    for method in ("baseline", "darel", "random", "darel-restream", "oracle-clean"):
        chosen = rows[(rows["method"] == method) & (rows["cell"] == "t0.50_m0.80" if method != "baseline" else
                                                    rows["method"] == method)]
        budget = chosen["budget"].iloc[0]
        assert (f"| resnet18 | {budget} | {method} | 12 | {chosen['top1'].mean():.2f} | "
                f"{chosen['top1_rare'].mean():.2f} | {chosen['top1_common'].mean():.2f} |") in table
    assert text.index("### Time, `time_s`") < text.index("### Top-1 on the rare classes")
    assert "top1_rare" not in render(pd.read_csv(ROWS))


FIT_ROWS = ROOT / "docs" / "studies" / "fit_regime_2026-11-29_rows.csv"


def test_each_stage_alone_is_compared_with_random_in_families_of_its_own():
    """Issue 50 item 3: the offline and the online stage's shares are tested in the verdict file,
    each method minus random per budget, recomputed here from the fit-regime study's rows."""
    rows = pd.read_csv(FIT_ROWS)
    stages = stage_methods(list(rows["method"].unique()))
    assert stages == {"random-offline": "online", "uniform-online": "offline"}
    found = stage_comparisons(rows, stages, "top1", margin=3.0)
    assert list(found["variant"].unique()) == ["uniform-online", "random-offline"]  # offline first
    assert list(found["figure"].unique()) == ["top1", "top1_rare", "top1_common"]
    assert set(found["control"]) == {"random"}
    by_method = {method: group.set_index(["cell", "seed"]) for method, group in rows.groupby("method")}
    for (method, figure), family in found.groupby(["variant", "figure"]):
        assert len(family) == 2  # one comparison a budget, Holm over the two
        for row in family.itertuples():
            expected = (by_method[method].loc[row.cell, figure] - by_method["random"].loc[row.cell, figure]).mean()
            assert row.mean_diff == pytest.approx(expected)
        assert list(family["p_holm"]) == pytest.approx(holm(list(family["p_value"])))
        # the margin judges top-1 alone: a per-class figure is never "equivalent"
        assert all(("equivalent" in verdict) <= (figure == "top1") for verdict in family["verdict"])
    online = found[(found["variant"] == "random-offline") & (found["figure"] == "top1")].set_index("budget")
    assert round(online.loc["B(t=0.50, m=0.80)", "mean_diff"], 2) == -1.86
    text = "\n".join(stage_markdown(found, metric="top1", level=0.05, power=0.8))
    assert text.count("| offline only (") == 6 and text.count("| online only (") == 6
    assert "DAREL " not in text.split("| verdict |")[1]  # each verdict is the stage method's
    # in the verdict file: after every method's per-class top-1, before DAREL's variants
    verdict = render(rows)
    assert verdict.index("### Top-1 per method on the rare") < verdict.index("## Each of DAREL's stages alone") \
        < verdict.index("## DAREL's variants")
    assert stage_methods(["darel", "random", "darel-floor", "darel-restream", "oracle-clean"]) == {}
    assert stage_markdown(pd.DataFrame(), metric="top1", level=0.05, power=0.8) == []
