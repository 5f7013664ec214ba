"""The study's own controls (issue 28, item 5): the negative control's sampler stream, the
positive control's oracle subset, the checks that judge them and the verdict file's first
section; their declaration in params.yaml."""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import pytest
import yaml

from darel import config, methods
from darel.methods.subsets import random_per_class
from darel.methods.darel import OnlineSettings
from darel.methods.darel_restream import RestreamSettings
from darel.methods.oracle_clean import NOISY, clean_per_class
from darel.study import trustworthy, validation_checks, validation_markdown, validation_methods, verdict_markdown
from darel.synth import CATEGORIES
from tests.conftest import ROOT

VALIDATION = {"negative": "darel-restream", "positive": ["oracle-clean", "random"]}
# As params.yaml declares it: the positive control judged at B(0.8, 0.8) only (docs/studies.md,
# "The fourth study: its declaration"); the study stage gets it resolved to cell ids.
DECLARED = {**VALIDATION, "positive_budgets": [[0.8, 0.8]]}
RESOLVED = {**VALIDATION, "positive_cells": ["t0.80_m0.80"]}


def test_the_oracle_keeps_the_random_controls_class_counts_and_no_noisy_label():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 5, size=400)
    category = rng.choice(4, size=400, p=[0.7, 0.1, 0.1, 0.1]).astype(np.uint8)
    assert CATEGORIES[NOISY] == "label-noise"
    kept = clean_per_class(labels, category, 0.8, seed=3)
    assert not (category[kept] == NOISY).any()
    assert np.array_equal(np.bincount(labels[kept], minlength=5),
                          np.bincount(labels[random_per_class(labels, 0.8, seed=3)], minlength=5))
    assert np.array_equal(kept, clean_per_class(labels, category, 0.8, seed=3))
    assert not np.array_equal(kept, clean_per_class(labels, category, 0.8, seed=4))
    # A class with fewer clean samples than its count keeps all of them, still none noisy.
    category[labels == 0] = NOISY
    category[np.flatnonzero(labels == 0)[:3]] = 0
    kept = clean_per_class(labels, category, 0.8, seed=3)
    assert (labels[kept] == 0).sum() == 3 and not (category[kept] == NOISY).any()
    with pytest.raises(ValueError, match="category must give one code per sample"):
        clean_per_class(labels, category[:-1], 0.8, seed=0)
    with pytest.raises(ValueError, match="has none, so its label noise is unknown"):
        methods.get("oracle-clean").build_subset(labels, 0.8, 0)


def test_the_negative_control_differs_from_darel_only_in_its_sampler_stream():
    fields = dict(keep_fraction=0.5, eta=2, warmup_epochs=1, history_size=64, bins=8)
    darel = methods.get("darel").make_selection(**fields)
    restream = methods.get("darel-restream").make_selection(**fields)
    assert type(darel) is OnlineSettings and type(restream) is RestreamSettings
    assert darel.sampler_seed(7) == 7  # DAREL's own stream is unchanged
    assert restream.sampler_seed(7) != 7 and restream.sampler_seed(7) == restream.sampler_seed(7)
    assert restream.sampler_seed(7) != restream.sampler_seed(8)
    assert {k: v for k, v in vars(restream).items() if k != "stream"} == vars(darel)
    assert methods.get("darel-restream").uses_scorer and methods.get("oracle-clean").rule == "uniform"


def _rows(diffs: dict[tuple[str, str], list[float]], n: int = 8) -> pd.DataFrame:
    """Study rows: per budget, darel and random at 50 + noise; each other method = its
    partner + the given per-seed differences."""
    rng = np.random.default_rng(1)
    out = []
    for cell in ("t0.80_m0.80", "t0.50_m0.55"):
        base = {"darel": 50 + rng.normal(0, 2, n), "random": 49 + rng.normal(0, 2, n)}
        partner = {"darel-restream": "darel", "oracle-clean": "random"}
        for method, values in base.items():
            out += [{"model": "resnet18", "cell": cell, "budget": cell, "method": method, "seed": s, "top1": v}
                    for s, v in enumerate(values)]
        for (method, where), shift in diffs.items():
            if where != cell:
                continue
            values = base[partner[method]] - np.asarray(shift) if method == "darel-restream" \
                else base[partner[method]] + np.asarray(shift)
            out += [{"model": "resnet18", "cell": cell, "budget": cell, "method": method, "seed": s, "top1": v}
                    for s, v in enumerate(values)]
    return pd.DataFrame(out)


def _noise(mean: float, n: int = 8, seed: int = 2) -> list[float]:
    return list(mean + np.random.default_rng(seed).normal(0, 0.5, n))


def test_a_study_that_sees_no_difference_where_none_is_and_the_real_one_is_trusted():
    cells = ("t0.80_m0.80", "t0.50_m0.55")
    rows = _rows({**{("darel-restream", c): _noise(0.0, seed=i) for i, c in enumerate(cells)},
                  **{("oracle-clean", c): _noise(3.0, seed=9 + i) for i, c in enumerate(cells)}})
    checks = validation_checks(rows, "top1", VALIDATION, level=0.05)
    assert sorted(checks["check"]) == ["negative", "negative", "positive", "positive"]
    negative = checks[checks["check"] == "negative"]
    assert set(negative["reference"]) == {"darel"} and set(negative["control"]) == {"darel-restream"}
    positive = checks[checks["check"] == "positive"]
    assert set(positive["reference"]) == {"oracle-clean"} and set(positive["control"]) == {"random"}
    assert (positive["mean_diff"] > 2).all() and checks["passed"].all()
    assert trustworthy(checks, VALIDATION) == (True, [])
    text = "\n".join(validation_markdown(checks, VALIDATION, metric="top1", level=0.05))
    assert "The study passed both controls." in text and "not trustworthy" not in text


def test_a_study_that_finds_a_difference_in_darel_against_itself_is_not_trustworthy():
    cells = ("t0.80_m0.80", "t0.50_m0.55")
    rows = _rows({("darel-restream", cells[0]): _noise(0.0), ("darel-restream", cells[1]): _noise(2.0),
                  **{("oracle-clean", c): _noise(3.0, seed=9 + i) for i, c in enumerate(cells)}})
    checks = validation_checks(rows, "top1", VALIDATION, level=0.05)
    ok, reasons = trustworthy(checks, VALIDATION)
    assert ok is False and len(reasons) == 1 and "negative control" in reasons[0] and cells[1] in reasons[0]
    summary = pd.DataFrame({"model": [], "cell": [], "method": []})
    text = verdict_markdown({}, summary, title="study", profile="quick", dataset="GENERATED", seeds=list(range(8)),
                            metric="top1", unit="pp", schedule="matched", margin=1.0, level=0.05, checks=checks,
                            validation=VALIDATION)
    sections = [line for line in text.splitlines() if line.startswith("## ")]
    assert sections[0] == "## The study's own controls (reported first)"
    assert "**This study is not trustworthy**" in text.split("## Primary analysis")[0]


def test_a_study_blind_to_the_oracles_gain_is_not_trustworthy_and_one_without_controls_not_validated():
    cells = ("t0.80_m0.80", "t0.50_m0.55")
    rows = _rows({**{("darel-restream", c): _noise(0.0, seed=i) for i, c in enumerate(cells)},
                  ("oracle-clean", cells[0]): _noise(3.0), ("oracle-clean", cells[1]): _noise(0.0)})
    ok, reasons = trustworthy(validation_checks(rows, "top1", VALIDATION, level=0.05), VALIDATION)
    assert ok is False and "positive control" in reasons[0] and cells[1] in reasons[0]
    only_negative = {"negative": "darel-restream"}
    checks = validation_checks(rows, "top1", only_negative, level=0.05)
    ok, reasons = trustworthy(checks, only_negative)
    assert ok is None and reasons == ["the positive control was not run"]
    assert "**This study is not validated**" in "\n".join(
        validation_markdown(checks, only_negative, metric="top1", level=0.05))
    assert validation_methods(VALIDATION) == ["darel-restream", "oracle-clean"]


def _params() -> dict:
    return yaml.safe_load((ROOT / "params.yaml").read_text())


def test_the_committed_study_runs_both_controls_and_names_only_methods_it_trains():
    cfg = _params()
    assert cfg["study"]["table1"]["validation"] == DECLARED
    assert len(cfg["study"]["table1"]["budgets"]["quick"]) >= 3
    bad = copy.deepcopy(cfg)
    bad["study"]["table1"]["methods"].remove("darel-restream")
    with pytest.raises(config.ConfigError, match=r"validation.negative names 'darel-restream', which is not among "
                                                 r"study.table1.methods"):
        config.validate(bad)
    bad = copy.deepcopy(cfg)
    bad["study"]["table1"]["validation"]["negative"] = "darel"
    with pytest.raises(config.ConfigError, match="darel compared with itself is no control"):
        config.validate(bad)
    bad = copy.deepcopy(cfg)
    bad["study"]["table1"]["validation"]["positive"] = ["oracle-clean"]
    with pytest.raises(config.ConfigError, match="validation.positive"):
        config.validate(bad)
    bad = copy.deepcopy(cfg)
    bad["study"]["table1"]["validation"].pop("positive")
    bad["study"]["table1"]["validation"]["positive_budgets"] = [[0.8, 0.8]]
    with pytest.raises(config.ConfigError, match="positive_budgets: no positive control is declared"):
        config.validate(bad)


def test_the_positive_control_is_judged_at_the_declared_budgets_the_study_runs_else_at_every_one():
    cfg = config.validate(_params())
    validation = cfg["study"]["table1"]["validation"]
    validation["positive_budgets"] = [[0.8, 0.8], [0.6, 0.6]]  # 0.6 is not run: judged where it is
    assert config.study_verdict_params(cfg)["validation"]["positive_cells"] == ["t0.80_m0.80"]
    cfg["study"]["table1"]["budgets"]["quick"] = [[0.5, 0.8]]  # an override that runs none of them
    assert "positive_cells" not in config.study_verdict_params(cfg)["validation"]


def test_on_data_without_recorded_label_noise_the_oracle_is_left_out_and_the_verdict_says_so():
    cfg = config.validate(_params())
    assert "oracle-clean" in config.study_methods(cfg)
    assert config.study_verdict_params(cfg)["validation"] == RESOLVED
    cfg["profile"] = "paper"  # CIFAR-100: nobody knows which labels are wrong
    assert "oracle-clean" not in config.study_methods(cfg) and "darel-restream" in config.study_methods(cfg)
    assert config.study_verdict_params(cfg)["validation"] == {"negative": "darel-restream"}
    assert all(method != "oracle-clean" for *_, method in config.study_table1_cells(cfg))


def test_a_positive_control_judged_at_declared_budgets_ignores_the_others_but_reports_them():
    cells = ("t0.80_m0.80", "t0.50_m0.55")
    rows = _rows({**{("darel-restream", c): _noise(0.0, seed=i) for i, c in enumerate(cells)},
                  ("oracle-clean", cells[0]): _noise(3.0), ("oracle-clean", cells[1]): _noise(0.0)})
    judged_first = {**VALIDATION, "positive_cells": [cells[0]]}
    checks = validation_checks(rows, "top1", judged_first, level=0.05)
    positive = checks[checks["check"] == "positive"].set_index("cell")
    assert positive.loc[cells[0], "judged"] and positive.loc[cells[0], "passed"] is True
    assert not positive.loc[cells[1], "judged"] and positive.loc[cells[1], "passed"] is None
    # each part is its own Holm family of one: its p-value is its own
    assert (positive["p_holm"] == positive["p_value"]).all()
    assert trustworthy(checks, judged_first) == (True, [])
    text = "\n".join(validation_markdown(checks, judged_first, metric="top1", level=0.05))
    assert "| not judged |" in text and f"judged at, declared before the runs ({cells[0]})" in text
    # judged at the budget where the gain is absent, the same rows fail
    judged_second = {**VALIDATION, "positive_cells": [cells[1]]}
    ok, reasons = trustworthy(validation_checks(rows, "top1", judged_second, level=0.05), judged_second)
    assert ok is False and cells[1] in reasons[0] and cells[0] not in reasons[0]
