"""darel.study's statistics against scipy on fixed vectors, and the verdicts' words."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
from scipy import stats

from darel import config, study

VECTORS = [
    [0.5, 1.2, -0.3, 0.8, 1.1, 0.4, 0.9, 0.2, 0.7, 1.0],
    [-3.61, -7.78, -3.33],
    [0.01, -0.02, 0.03, 0.0, -0.01],
    [2.0, 2.0, 2.5],
]


@pytest.mark.parametrize("values", VECTORS)
def test_the_paired_test_is_scipys_one_sample_t_test_and_interval(values):
    test = study.paired_test(values)
    reference = stats.ttest_1samp(values, 0.0)
    low, high = stats.t.interval(0.95, len(values) - 1, loc=sum(values) / len(values), scale=stats.sem(values))
    assert test["p_value"] == pytest.approx(reference.pvalue, rel=1e-10)
    assert test["ci95_low"] == pytest.approx(low, rel=1e-10) and test["ci95_high"] == pytest.approx(high, rel=1e-10)
    assert test["n"] == len(values) and test["std_diff"] == pytest.approx(stats.tstd(values), rel=1e-12)


def test_holm_bonferroni_by_hand():
    # sorted: 0.01 (x4 = 0.04), 0.02 (x3 = 0.06), 0.03 (x2 = 0.06), 0.04 (x1 = 0.04 -> 0.06, monotone)
    assert study.holm([0.03, 0.01, 0.04, 0.02]) == pytest.approx([0.06, 0.04, 0.06, 0.06])
    assert study.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1
    adjusted = study.holm([0.02, math.nan, 0.01])  # NaN is no member of the family
    assert adjusted[0] == pytest.approx(0.02) and math.isnan(adjusted[1]) and adjusted[2] == pytest.approx(0.02)


def test_verdict_words():
    narrow = study.paired_test([0.1, -0.1, 0.05, -0.05, 0.0])
    assert study.verdict(narrow, 1.0, margin=1.0, level=0.05) == "equivalent within ±1"
    clear = study.paired_test([2.0, 2.2, 1.9, 2.1, 2.0])
    assert study.verdict(clear, 0.001, margin=1.0, level=0.05) == "DAREL better"
    worse = study.paired_test([-3.61, -7.78, -3.33])
    assert study.verdict(worse, 0.2, margin=1.0, level=0.05).startswith("inconclusive (95 % interval")
    assert study.verdict(worse, 0.01, margin=1.0, level=0.05) == "DAREL worse"
    assert study.verdict(study.paired_test([1.0]), math.nan, margin=1.0, level=0.05) == "no interval (one seed)"


def test_paired_differences_pairs_seeds_counts_wins_and_adjusts_over_the_family():
    rows = []
    for seed in range(5):
        rows += [{"model": "m", "cell": "c", "budget": "B", "method": "darel", "seed": seed, "top1": 90.0 + seed},
                 {"model": "m", "cell": "c", "budget": "B", "method": "random", "seed": seed, "top1": 89.0 + seed},
                 {"model": "m", "cell": "c", "budget": "B", "method": "rs2", "seed": seed,
                  "top1": 90.0 + seed + (0.5 if seed % 2 else -0.5)}]
    diffs = study.paired_differences(pd.DataFrame(rows), "top1", margin=1.0).set_index("control")
    assert diffs.loc["random", "wins"] == 5 and diffs.loc["random", "mean_diff"] == pytest.approx(1.0)
    assert diffs.loc["rs2", "wins"] == 3 and diffs.loc["rs2", "n"] == 5
    raw = list(diffs["p_value"])
    assert list(diffs["p_holm"]) == pytest.approx(study.holm(raw), nan_ok=True)
    # identical +1 differences: p = 0, and the interval [1, 1] lies on the margin
    assert diffs.loc["random", "verdict"] == "DAREL better (by less than the ±1 margin)"


# ---- power: against a reference computed here without scipy or statsmodels -------------

def _chi_weights(dof: int):
    """Quadrature nodes and weights of u = sqrt(V), V ~ chi-square(dof): E[g(V)] ~ sum w g(u^2)."""
    import numpy as np

    u = np.linspace(1e-9, math.sqrt(dof) + 12.0, 6_001)
    log_density = (math.log(2.0) + (dof - 1) * np.log(u) - u ** 2 / 2 - (dof / 2) * math.log(2.0)
                   - math.lgamma(dof / 2))
    weights = np.exp(log_density) * (u[1] - u[0])
    weights[[0, -1]] /= 2  # trapezoid
    return u, weights


def _upper_normal(x):
    import numpy as np

    return 0.5 * np.array([math.erfc(v / math.sqrt(2.0)) for v in np.ravel(x)])


def _reference_critical(dof: int, level: float) -> float:
    """The two-sided critical value of Student's t, by bisection on its tail integrated here."""
    u, weights = _chi_weights(dof)
    scale = u / math.sqrt(dof)
    low, high = 0.0, 200.0
    for _ in range(45):
        middle = (low + high) / 2
        low, high = (middle, high) if float((weights * _upper_normal(middle * scale)).sum()) > level / 2 else (low, middle)
    return (low + high) / 2


def _reference_power(difference: float, std: float, n: int, level: float, critical: float | None = None) -> float:
    """P(|T| > c) for T = (Z + shift) / sqrt(V / dof), integrated over V ~ chi-square(dof), so
    nothing here comes from a statistics library."""
    dof = n - 1
    critical = _reference_critical(dof, level) if critical is None else critical
    u, weights = _chi_weights(dof)
    scale = u / math.sqrt(dof)
    shift = difference * math.sqrt(n) / std
    upper = _upper_normal(critical * scale - shift)
    lower = 1 - _upper_normal(-critical * scale - shift)
    return float((weights * (upper + lower)).sum())


def _reference_mdd(std: float, n: int, level: float, power: float = 0.8) -> float:
    critical = _reference_critical(n - 1, level)
    low, high = 0.0, 20.0 * std
    for _ in range(30):
        middle = (low + high) / 2
        low, high = (middle, high) if _reference_power(middle, std, n, level, critical) < power else (low, middle)
    return (low + high) / 2


@pytest.mark.parametrize("std, n, level", [(1.0, 10, 0.05), (2.1, 8, 0.05 / 3), (0.5, 4, 0.025), (3.0, 25, 0.01)])
def test_min_detectable_difference_matches_a_direct_integration(std, n, level):
    assert study.paired_power(0.7 * std, std, n, level) == pytest.approx(
        _reference_power(0.7 * std, std, n, level), abs=2e-4)
    assert study.min_detectable_difference(std, n, level) == pytest.approx(_reference_mdd(std, n, level), rel=2e-3)


def test_min_detectable_difference_known_value_and_edges():
    one = study.min_detectable_difference(1.0, 10, 0.05)
    # above the normal approximation (z_0.975 + z_0.8) / sqrt(10) = 0.886: t is wider than z at 9 dof
    assert 0.886 < one < 1.05
    assert study.min_detectable_difference(2.0, 10, 0.05) == pytest.approx(2 * one, rel=1e-6)  # scales with std
    assert study.min_detectable_difference(1.0, 10, 0.01) > study.min_detectable_difference(1.0, 10, 0.05)
    assert math.isnan(study.min_detectable_difference(1.0, 1, 0.05))
    assert math.isnan(study.min_detectable_difference(0.0, 5, 0.05))


def test_holm_levels_are_the_steps_levels():
    # sorted p: 0.01 -> 0.05/4, 0.02 -> 0.05/3, 0.03 -> 0.05/2, 0.04 -> 0.05/1
    assert study.holm_levels([0.03, 0.01, 0.04, 0.02], 0.05) == pytest.approx([0.025, 0.0125, 0.05, 0.05 / 3])
    levels = study.holm_levels([0.2, math.nan], 0.05)
    assert levels[0] == pytest.approx(0.05) and math.isnan(levels[1])


@pytest.mark.parametrize("std, margin, level", [(2.1, 3.0, 0.05 / 6), (1.0, 1.0, 0.05), (5.0, 3.0, 0.05 / 3)])
def test_seeds_needed_is_the_first_n_with_the_power(std, margin, level):
    n = study.seeds_needed(std, margin, level)
    assert _reference_power(margin, std, n, level) >= 0.8 - 1e-3
    assert n == 2 or _reference_power(margin, std, n - 1, level) < 0.8
    # and the minimum detectable difference at that n is within the margin
    assert study.min_detectable_difference(std, n, level) <= margin


# ---- the primary family, the secondary ones, and the verdict file -----------------------

def _study_rows() -> pd.DataFrame:
    """Two budgets, three controls, six seeds: DAREL 2 above random, 0.2 above rs2 (noisy)."""
    rows = []
    noise = [0.3, -0.2, 0.1, -0.4, 0.25, 0.0]
    for cell, budget in (("t0.50_m0.55", "B(t=0.50, m=0.55)"), ("t0.80_m0.80", "B(t=0.80, m=0.80)")):
        for seed in range(6):
            base = {"model": "resnet18", "cell": cell, "budget": budget, "seed": seed}
            rows += [{**base, "method": "darel", "top1": 60.0 + seed, "time_s": 10.0 + noise[seed]},
                     {**base, "method": "random", "top1": 58.0 + seed + noise[seed], "time_s": 10.0},
                     {**base, "method": "rs2", "top1": 59.8 + seed + 3 * noise[seed], "time_s": 10.1},
                     {**base, "method": "short-schedule", "top1": 61.0 + seed - noise[seed], "time_s": 9.0}]
    return pd.DataFrame(rows)


PRIMARY = {"schedule": "matched", "metric": "top1", "accounting": "time_s", "methods": ["random", "short-schedule"],
           "budgets": [[0.5, 0.55]], "cells": ["t0.50_m0.55"], "margin": 3.0}


def _assessed(primary=PRIMARY, schedule="matched"):
    rows = _study_rows()
    diffs = {figure: study.paired_differences(rows, figure) for figure in ("top1", "time_s")}
    return study.assess(diffs, primary=primary, schedule=schedule, margins={"top1": 1.0}, level=0.05)


def test_the_primary_family_is_adjusted_alone():
    top1 = _assessed()["top1"]
    chosen = top1[top1["role"] == "primary"]
    assert sorted(zip(chosen["cell"], chosen["control"])) == [("t0.50_m0.55", "random"),
                                                              ("t0.50_m0.55", "short-schedule")]
    assert list(chosen["p_holm"]) == pytest.approx(study.holm(list(chosen["p_value"])))
    rest = top1[top1["role"] == "secondary"]
    assert len(rest) == 4 and list(rest["p_holm"]) == pytest.approx(study.holm(list(rest["p_value"])))
    # the time comparisons are all secondary, in a family of their own
    assert set(_assessed()["time_s"]["role"]) == {"secondary"}
    # MDD at the Holm step's level, from the observed paired standard deviation
    for row in chosen.to_dict("records"):
        assert row["mdd"] == pytest.approx(study.min_detectable_difference(row["std_diff"], 6, row["holm_level"]))
    assert sorted(chosen["holm_level"]) == pytest.approx([0.025, 0.05])


def test_a_run_under_another_rule_or_without_a_declaration_is_exploratory():
    for primary, schedule in ((PRIMARY, "paper"), (None, "matched")):
        assessed = _assessed(primary, schedule)
        assert set(assessed["top1"]["role"]) == {"exploratory"}
        top1 = assessed["top1"]
        assert list(top1["p_holm"]) == pytest.approx(study.holm(list(top1["p_value"])))
    assert "declared under the `matched` schedule rule" in study.primary_applies(PRIMARY, "paper")[1]


def _markdown(primary=PRIMARY, schedule="matched") -> str:
    rows = _study_rows()
    summary = study.summarize(rows.assign(panel="p"), ("top1", "time_s"))
    return study.verdict_markdown(_assessed(primary, schedule), summary, title="study_table1", profile="quick",
                                  dataset="GENERATED", seeds=list(range(6)), metric="top1", unit="pp",
                                  schedule=schedule, margin=1.0, level=0.05, primary=primary)


def test_the_verdict_file_opens_with_the_declared_analysis_and_keeps_the_rest_out_of_it():
    text = _markdown()
    head, rest = text.split("## Design")
    assert head.index("## Primary analysis") < head.index("| budget | control |")
    assert "random, short-schedule" in head and "margin: ±3" in head and "budgets: B(t=0.50, m=0.55)" in head
    assert "rs2" not in head and "t0.80" not in head  # no secondary comparison in the headline
    assert "MDD (80%)" in head and "Power: " in head
    assert "## Secondary comparisons" in rest and "| rs2 |" in rest and "### Time, `time_s`" in rest
    paper = _markdown(schedule="paper")
    assert "This run carries no primary analysis" in paper and "## Exploratory comparisons" in paper
    assert "| budget | control |" not in paper.split("## Design")[0]


def test_the_seeds_command_sizes_a_study_from_a_pilot(tmp_path, capsys):
    from darel.tools import seeds

    pilot = tmp_path / "pilot.csv"
    _study_rows().to_csv(pilot, index=False)
    assert seeds.main(["--pilot", str(pilot), "--metric", "top1", "--margin", "1", "--family", "2",
                       "--methods", "random", "rs2"]) == 0
    out = capsys.readouterr().out
    spread = study.paired_test([0.0 - n for n in [0.3, -0.2, 0.1, -0.4, 0.25, 0.0]])["std_diff"]
    assert f"seeds needed for every comparison: {study.seeds_needed(3 * spread, 1.0, 0.025)}" in out
    assert "level 0.025" in out
    assert seeds.main(["--sd", "2.1", "--margin", "3", "--family", "6"]) == 0
    assert f"seeds needed for every comparison: {study.seeds_needed(2.1, 3.0, 0.05 / 6)}" in capsys.readouterr().out


def test_the_seeds_command_sizes_the_positive_control_for_the_gain_its_pilot_measured(tmp_path, capsys):
    """--positive: the oracle minus its partner (params' validation), each budget sized for its own
    pilot gain at level / (number of budgets), and the chance that all budgets pass at N seeds."""
    from darel.tools import seeds

    params = Path(__file__).resolve().parents[1] / "params.yaml"
    oracle, partner = config.load_params(params)["study"]["table1"]["validation"]["positive"]
    noise = [0.5, -1.0, 0.2, 0.9, -0.6]
    gains = {"t0.80_m0.80": 3.0, "t0.50_m0.80": 1.0}
    rows = []
    for cell, gain in gains.items():
        for seed, wobble in enumerate(noise):
            base = {"model": "resnet18", "cell": cell, "budget": cell, "seed": seed}
            rows += [{**base, "method": oracle, "top1": 60.0 + gain + wobble},
                     {**base, "method": partner, "top1": 60.0},
                     {**base, "method": "darel", "top1": 50.0}]
    pilot = tmp_path / "pilot.csv"
    pd.DataFrame(rows).to_csv(pilot, index=False)
    assert seeds.main(["--pilot", str(pilot), "--params", str(params), "--positive", "--seeds", "12"]) == 0
    out = capsys.readouterr().out
    declared = seeds.positive_control(config.load_params(params))
    judged = {cell: gain for cell, gain in gains.items() if declared["cells"] is None or cell in declared["cells"]}
    budgets = declared["family"]
    assert budgets == (len(declared["cells"]) if declared["cells"] else 3) and judged
    sd = study.paired_test(noise)["std_diff"]
    needed = max(study.seeds_needed(sd, gain, 0.05 / budgets) for gain in judged.values())
    assert f"level {0.05 / budgets:.4g}" in out and f"seeds needed for every comparison: {needed}" in out
    assert all(cell in out for cell in judged) and all(cell not in out for cell in set(gains) - set(judged))
    every = math.prod(study.paired_power(gain, sd, 12, 0.05 / budgets) for gain in judged.values())
    assert f"with 12 seeds: at least {every:.0%}" in out
    assert seeds.main(["--sd", "2", "--margin", "3", "--family", "3", "--positive"]) == 2
    assert seeds.main(["--pilot", str(pilot), "--params", str(params), "--positive", "--seeds", "1"]) == 2
