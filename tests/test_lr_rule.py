"""budget.lr_rule: the learning rate of a run at a calibrated batch below the protocol's
(darel.plans.batch_lr, applied in darel.plans.lr_schedule)."""

from __future__ import annotations

import copy

import pytest
import yaml

from darel import config, plans
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def params():
    return yaml.safe_load((ROOT / "params.yaml").read_text())


def _cfg(params: dict, rule: str) -> dict:
    changed = copy.deepcopy(params)
    changed["budget"]["lr_rule"] = rule
    # The quick ResNet18's protocol, written out so the figures below do not follow params.yaml.
    changed["profiles"]["quick"]["models"]["resnet18"].update(batch=32)
    changed["protocols"]["resnet18"]["lr"] = 0.1
    return config.validate(changed)


def _calibration(batch: int) -> dict:
    return dict(batch=batch, A=0.3, eta=3, alpha=0.8, n_kept=800, t_max_s=20.0, seconds_per_probe_second=1.2,
                t_b_s=0.05, t_score_s=0.04, score_batch=64, t_plan_s=0.01, planned_epochs=5, predicted_time_s=19.0,
                predicted_adherence=0.95, plan_exceeds_budget=False, enforce="plan", t=0.5, m=0.55,
                epoch_cost_s={"warmup": 3.0, "refresh": 2.0, "reuse": 1.5},
                epoch_kinds=["warmup", "refresh", "reuse", "reuse", "refresh"])


def _cell(batch: int):
    """The Table 1 DAREL cell's typed plan at that calibration (as stages/train_online.py makes it)."""
    return plans.method_plan("darel", _calibration(batch), n_full=1000, warmup_epochs=1, epochs=20, table1=True)


@pytest.mark.parametrize("rule, expected", [("keep", 0.1), ("linear", 0.025)])
def test_a_table1_cell_at_batch_8_of_32_follows_the_rule(params, rule, expected):
    cfg = _cfg(params, rule)
    settings = plans.ImageSettings.from_slice(config.online_params(cfg, "resnet18", "t0.50_m0.55", 0))
    assert settings.lr_rule == rule
    plan = plans.run_plan(settings, _cell(8))
    assert plan.batch == 8 and plan.lr_schedule.base == pytest.approx(expected)


@pytest.mark.parametrize("method", ["random", "short-schedule", "darel"])
@pytest.mark.parametrize("rule, expected", [("keep", 0.1), ("linear", 0.025)])
def test_a_study_method_at_batch_8_of_32_follows_the_rule(params, method, rule, expected):
    cfg = _cfg(params, rule)
    settings = plans.ImageSettings.from_slice(config.control_params(cfg, "resnet18", "t0.50_m0.55", 0, method))
    cal = _calibration(8)
    planned = plans.method_plan(method, cal, n_full=1000, warmup_epochs=1, epochs=20, params=cfg)
    plan = plans.run_plan(settings, planned)
    assert plan.batch == 8 and plan.lr_schedule.base == pytest.approx(expected)


@pytest.mark.parametrize("rule", ["keep", "linear"])
def test_the_baseline_and_a_cell_at_the_protocol_batch_keep_the_protocols_rate(params, rule):
    cfg = _cfg(params, rule)
    baseline = plans.run_plan(plans.ImageSettings.from_slice(config.training_params(cfg, "resnet18", 0)))
    assert baseline.batch == 32 and baseline.lr_schedule.base == 0.1
    settings = plans.ImageSettings.from_slice(config.online_params(cfg, "resnet18", "t0.50_m0.55", 0))
    assert plans.run_plan(settings, _cell(32)).lr_schedule.base == 0.1


def test_the_rule_reaches_the_training_slice_and_the_fingerprint_but_not_the_calibration(params):
    keep, linear = _cfg(params, "keep"), _cfg(params, "linear")
    cell = ("resnet18", "t0.50_m0.55", 0)
    assert config.online_params(keep, *cell) != config.online_params(linear, *cell)  # Snakemake re-runs the cell
    assert config.control_params(keep, *cell, "random") != config.control_params(linear, *cell, "random")
    assert config.calibration_params(keep, *cell) == config.calibration_params(linear, *cell)
    assert config.training_params(keep, "resnet18", 0) == config.training_params(linear, "resnet18", 0)
    plan_keep = plans.run_plan(plans.ImageSettings.from_slice(config.online_params(keep, *cell)), _cell(8))
    plan_linear = plans.run_plan(plans.ImageSettings.from_slice(config.online_params(linear, *cell)), _cell(8))
    assert plan_keep.fingerprint(1000) != plan_linear.fingerprint(1000)


def test_a_slice_without_the_rule_keeps_the_rate(params):
    """Slices and records written before budget.lr_rule existed load as `keep`."""
    cfg = _cfg(params, "linear")
    old = config.online_params(cfg, "resnet18", "t0.50_m0.55", 0)
    old["budget"] = {k: v for k, v in old["budget"].items() if k != "lr_rule"}
    settings = plans.ImageSettings.from_slice(old)
    assert settings.lr_rule == "keep" and plans.run_plan(settings, _cell(8)).lr_schedule.base == 0.1


def test_a_bad_rule_is_refused_by_name(params):
    changed = copy.deepcopy(params)
    changed["budget"]["lr_rule"] = "sqrt"
    with pytest.raises(config.ConfigError, match=r"budget\.lr_rule = 'sqrt'"):
        config.validate(changed)
    with pytest.raises(ValueError, match="sqrt"):
        plans.batch_lr(plans.Protocol.from_dict(config.model_protocol(config.validate(params), "resnet18")), 8,
                       "sqrt")
