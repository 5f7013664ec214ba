"""darel.study's statistics against scipy on fixed vectors, and the verdicts' words."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from scipy import stats

from darel import study

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
