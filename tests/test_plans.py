"""darel.plans (what every run trains) and darel.records (what every cell reports)."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import yaml

from darel import config, methods, plans, records, schedules
from darel.methods.darel import online_epoch_plan
from darel.plans import RunPlan
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def cfg():
    return config.validate(yaml.safe_load((ROOT / "params.yaml").read_text()))


def _calibration(**kw) -> dict:
    """A budget's calibration.json: the measured terms and DAREL's plan made from them, as
    stages/calibrate.py records it (protocol: 12 epochs, 2 of them warm-up)."""
    cal = dict(batch=64, A=0.3, eta=3, alpha=0.8, n_kept=800, t_max_s=20.0, seconds_per_probe_second=1.2, t_b_s=0.05,
               t_score_s=0.04, score_batch=256, t_plan_s=0.01, enforce="plan", t=0.5, m=0.55)
    cal.update(kw)
    planned = online_epoch_plan(cal, n_kept=cal["n_kept"], warmup_epochs=2, epochs=12)
    planned.pop("epoch_samples")
    return {**cal, **planned}


def _table1_plan(cal: dict):
    """A Table 1 cell's typed plan, as stages/train_online.py makes it."""
    return plans.method_plan(cal.get("method", "darel"), cal, n_full=1000, warmup_epochs=2, epochs=12, table1=True)


def test_settings_come_from_a_stage_slice_typed(cfg):
    settings = plans.ImageSettings.from_slice(config.online_params(cfg, "resnet18", "t0.50_m0.55", 0))
    proto = config.model_protocol(cfg, "resnet18")
    assert settings.protocol.epochs == proto["epochs"] and settings.protocol.milestones == tuple(proto["milestones"])
    assert settings.runtime.device == "cpu" and settings.enforce == "plan" and settings.t == 0.5
    assert settings.history_size == cfg["darel"]["history_size"]


def test_the_baseline_plan_is_the_protocol(cfg):
    settings = plans.ImageSettings.from_slice(config.training_params(cfg, "resnet18", 0))
    plan = plans.run_plan(settings)
    proto = config.model_protocol(cfg, "resnet18")
    assert isinstance(plan, RunPlan) and plan.epochs == plan.epochs_to_run == proto["epochs"]
    assert plan.batch == proto["batch"] and plan.selection is None and plan.train_epochs is None


def test_a_darel_cell_trains_its_calibrated_batch_and_planned_epochs(cfg):
    settings = plans.ImageSettings.from_slice(config.online_params(cfg, "resnet18", "t0.50_m0.55", 0))
    cal = _calibration(t_max_s=3.0)  # 7 of the 12 protocol epochs fit
    cell = _table1_plan(cal)  # DAREL's plan at its calibration: the figures the calibration recorded
    figures = ("planned_epochs", "predicted_time_s", "predicted_adherence", "plan_exceeds_budget", "epoch_kinds",
               "epoch_cost_s", "t_max_s", "batch", "score_batch", "A", "eta")
    assert {k: getattr(cell, k) for k in figures} == {k: cal[k] for k in figures}
    assert (cell.method, cell.subset, cell.rule) == ("darel", "darel", "histogram") and cell.planned_epochs == 7
    assert cell.planned_samples == pytest.approx(2 * 800 + 0.3 * 800 * (cell.planned_epochs - 2))
    plan = plans.run_plan(settings, cell)
    assert plan.batch == 64 and plan.train_epochs == cal["planned_epochs"] and plan.score_batch == 256
    assert plan.selection.keep_fraction == 0.3 and plan.selection.eta == 3 and plan.selection.rule == "histogram"
    # budget.schedule: keep (Table 1 has no study rule): the protocol's milestones, 12 epochs' 30/60/80 %
    proto = settings.protocol
    assert plan.lr_schedule == schedules.LrSchedule("multistep", plans.batch_lr(proto, 64, settings.lr_rule),
                                                    milestones=proto.milestones, gamma=proto.lr_gamma)
    rescale = plans.ImageSettings(**{**settings.__dict__, "schedule": "rescale"})  # compressed to the planned epochs
    assert plans.run_plan(rescale, cell).lr_schedule.milestones == tuple(
        sorted({max(1, round(m * cal["planned_epochs"] / proto.epochs)) for m in proto.milestones}))
    wallclock = plans.ImageSettings(**{**settings.__dict__, "enforce": "wallclock"})
    with pytest.raises(ValueError, match="calibration was made for budget.enforce = 'plan', this run asks for "
                                         "'wallclock'"):
        plans.check_enforcement(wallclock, cal)
    plans.check_enforcement(wallclock, _calibration(enforce="wallclock"))
    plan = plans.run_plan(wallclock, _table1_plan(_calibration(enforce="wallclock")))
    assert plan.train_epochs is None and plan.time_budget_s == 20.0


def test_a_table1_cell_over_its_budget_trains_its_calibrated_plan_a_study_refuses_it(cfg):
    cal = _calibration(t_max_s=0.5)  # not even the first warm-up epoch fits
    assert cal["plan_exceeds_budget"] and cal["planned_epochs"] == 1
    cell = _table1_plan(cal)
    assert cell.plan_exceeds_budget and cell.planned_epochs == 1
    table1 = plans.ImageSettings.from_slice(config.online_params(cfg, "resnet18", "t0.50_m0.55", 0))
    assert plans.run_plan(table1, cell).train_epochs == 1
    with pytest.raises(methods.PlanError, match="over t_max"):
        plans.method_plan("darel", cal, n_full=1000, warmup_epochs=2, epochs=12, params=cfg)
    study = plans.ImageSettings.from_slice(config.control_params(cfg, "resnet18", "t0.50_m0.55", 0, "darel"))
    with pytest.raises(methods.PlanError, match="exceeds t_max; it is never trained"):
        plans.run_plan(study, cell)


def test_a_budget_runs_its_test_evaluations_within_its_memory_budget(cfg):
    """The GPU run of 2026-11-26: a cell's peak was its per-epoch test evaluation at the
    profile's eval_batch (1024), above m M, while its training step and scoring pass fitted.
    A budget cell evaluates at the scoring batch its calibration fitted within m M."""
    settings = plans.ImageSettings.from_slice(config.online_params(cfg, "resnet18", "t0.50_m0.55", 0))
    eval_batch = settings.runtime.eval_batch
    assert plans.run_plan(settings, _table1_plan(_calibration(score_batch=max(1, eval_batch // 4)))).eval_batch == \
        max(1, eval_batch // 4)
    assert plans.run_plan(settings, _table1_plan(_calibration(score_batch=eval_batch * 4))).eval_batch == eval_batch
    assert plans.run_plan(settings).eval_batch == eval_batch  # the baseline: the profile's
    control = plans.ImageSettings.from_slice(config.control_params(cfg, "resnet18", "t0.50_m0.55", 0, "random"))
    cal = _calibration(score_batch=max(1, eval_batch // 2))
    method_plan = plans.method_plan("random", cal, n_full=1000, warmup_epochs=2, epochs=12, params=cfg)
    assert plans.run_plan(control, method_plan).eval_batch == max(1, eval_batch // 2)


def test_ids_adonis_has_fixed_settings_and_no_budget(cfg):
    settings = plans.ImageSettings.from_slice(config.online_params(cfg, "resnet18", "ids_adonis", 0))
    fixed = {"method": "ids+adonis", "batch": 128, "alpha": 0.8, "A": 0.3, "eta": 2, "t_max_s": None, "n_kept": 500}
    row = _table1_plan(fixed)  # the row's typed plan from its plan.json: every protocol epoch, no budget
    assert (row.method, row.subset, row.uses_scorer, row.batch, row.t_max_s, row.score_batch) == \
        ("ids+adonis", "ids", True, 128, None, None)
    assert row.planned_epochs == 12 and row.epoch_kinds[:4] == ["warmup", "warmup", "refresh", "reuse"]
    assert row.planned_samples == pytest.approx(2 * 500 + 10 * 0.3 * 500)
    assert methods.get("ids+adonis").plan_from_record(row.record()) == row
    plan = plans.run_plan(settings, row)
    assert plan.train_epochs is None and plan.time_budget_s is None and plan.selection.keep_fraction == 0.3
    assert plan.batch == 128 and plan.score_batch is None and plan.epoch_cost_s is None
    assert plan.eval_batch == settings.runtime.eval_batch and plan.selection.eta == 2


def test_darels_variants_plan_as_darel_and_change_only_their_own_setting(cfg):
    """darel-history, darel-bins and darel-floor: DAREL's plan (the same epochs, A, eta and
    time) and DAREL's selection with the one setting of their own section replaced."""
    cal = _calibration()
    darel_settings = plans.ImageSettings.from_slice(config.control_params(cfg, "resnet18", "t0.50_m0.55", 0, "darel"))
    darel_plan = plans.method_plan("darel", cal, n_full=1000, warmup_epochs=2, epochs=12, params=cfg)
    darel_run = plans.run_plan(darel_settings, darel_plan)
    assert darel_run.selection.floor == 0.0 and type(darel_plan).__name__ == "OnlinePlan"
    own = {"darel-history": {"history_size": cfg["controls"]["darel_history"]["history_size"]},
           "darel-bins": {"bins": cfg["controls"]["darel_bins"]["bins"]},
           "darel-floor": {"floor": cfg["controls"]["darel_floor"]["floor"]}}
    for method, changed in own.items():
        slice_ = config.control_params(cfg, "resnet18", "t0.50_m0.55", 0, method)
        assert slice_["controls"] == {method.replace("-", "_"): changed}  # its own settings only
        variant = plans.method_plan(method, cal, n_full=1000, warmup_epochs=2, epochs=12, params=cfg)
        for field in ("planned_epochs", "predicted_time_s", "epoch_kinds", "A", "eta", "planned_samples", "subset"):
            assert getattr(variant, field) == getattr(darel_plan, field), (method, field)
        assert methods.get(method).plan_from_record(variant.record()) == variant
        run = plans.run_plan(plans.ImageSettings.from_slice(slice_), variant)
        expected = {"history_size": darel_run.selection.history_size, "bins": darel_run.selection.bins,
                    "floor": 0.0, **changed}
        got = {key: getattr(run.selection, key) for key in expected}
        assert got == expected, method
        assert run.selection.keep_fraction == darel_run.selection.keep_fraction and run.selection.rule == "histogram"
        assert run.selection.sampler_seed(7) == darel_run.selection.sampler_seed(7)  # paired draws
    assert cfg["controls"]["darel_history"]["history_size"] != cfg["darel"]["history_size"]
    assert cfg["controls"]["darel_bins"]["bins"] != cfg["darel"]["bins"]


@pytest.mark.parametrize("method, selection", [("darel", "OnlineSettings"), ("random-offline", "OnlineSettings"),
                                               ("uniform-online", "OnlineSettings"), ("random", "OnlineSettings"),
                                               ("short-schedule", None),
                                               ("selective-backprop", "SelectiveBackpropSettings"),
                                               ("infobatch", "InfoBatchSettings"), ("rs2", "RS2Settings")])
@pytest.mark.parametrize("rule", ["matched", "paper"])
def test_every_method_gets_the_cells_batch_its_own_plan_and_the_studys_schedule_rule(cfg, method, selection, rule):
    study_cfg = copy.deepcopy(cfg)
    study_cfg["study"]["schedule"] = rule
    settings = plans.ImageSettings.from_slice(config.control_params(study_cfg, "resnet18", "t0.50_m0.55", 0, method))
    cal = _calibration()
    method_plan = plans.method_plan(method, cal, n_full=1000, warmup_epochs=2, epochs=12, params=cfg)
    plan = plans.run_plan(settings, method_plan)
    assert plan.batch == cal["batch"] and plan.train_epochs == method_plan.planned_epochs
    assert (type(plan.selection).__name__ if plan.selection else None) == selection
    rate = plan.lr_schedule
    if rule == "matched":  # every method: the protocol's shape over its own planned run
        assert rate.kind == "matched" and rate.shape == "multistep"
        assert rate.planned_epochs == method_plan.planned_epochs
        assert dict(rate.epoch_samples) == method_plan.epoch_samples
        assert rate.epoch_kinds == tuple(method_plan.epoch_kinds[: method_plan.planned_epochs])
    elif method == "short-schedule":  # the paper rule: its own decay to zero over its planned steps
        assert rate.kind == "linear" and rate.total_steps == method_plan.schedule_steps
    else:  # the paper rule: the protocol's milestones, cut at the planned epochs
        assert rate.kind == "multistep" and rate.milestones == settings.protocol.milestones
    if selection == "OnlineSettings":
        assert plan.selection.rule == method_plan.rule
    planned = sum(method_plan.epoch_samples[kind] for kind in method_plan.epoch_kinds)
    assert method_plan.planned_samples == pytest.approx(planned)
    # The plan's record holds every figure of it, and reads back as the same typed plan.
    record = method_plan.record()
    assert methods.get(method).plan_from_record(record) == method_plan
    if method == "infobatch":  # the figure a key list used to drop from every cell record
        assert record["prune_fraction_of_data"] == method_plan.prune_count / 1000


def test_finetune_indices_for_every_nlg_method():
    losses = np.array([0.5, 3.0, 1.0, 2.0, 0.1])
    pick = lambda method, alpha, mode, seed=0: plans.finetune_indices(  # noqa: E731
        plans.FinetuneSettings("gpt2-small", seed, method, alpha, mode), 5, losses)
    assert list(pick("lora", None, "hard")) == [0, 1, 2, 3, 4]
    assert list(pick("darel", 0.6, "hard")) == [1, 2, 3]  # the ceil(0.6 * 5) = 3 highest losses
    assert list(pick("easy", 0.6, "easy")) == [0, 2, 4]
    random = pick("random", 0.6, "random")
    assert len(random) == 3 and list(random) == list(pick("random", 0.6, "random"))  # seeded
    with pytest.raises(ValueError, match="losses"):
        plans.finetune_indices(plans.FinetuneSettings("gpt2-small", 0, "darel", 0.6, "hard"), 5, None)


def _train(**kw) -> dict:
    base = dict(dataset_label="QUICK", batch=64, epochs_completed=7, epochs_planned=7, epochs_protocol=12,
                enforce="plan", stopped_by_budget=False, time_s=10.0, peak_mem_bytes=1000, peak_mem_by_pass={},
                memory_source="cpu", precision="fp32", score_batch=256, n_train=800, n_train_full=1000,
                samples_trained=5000, device="cpu", energy={}, method_plan=None)
    base.update(kw)
    return base


def test_an_image_cell_reports_what_its_training_recorded():
    params = {"table": "table1", "model": "resnet18", "cell": "t0.50_m0.55", "profile": "quick", "seed": 0}
    cal = _calibration()
    darel = records.image_cell(params, _train(method_plan=_table1_plan(cal).record()), {"top1": 90.0},
                               _train(time_s=20.0, peak_mem_bytes=2000), cal, {"co2e_kg": 1e-6})
    assert darel["method"] == "darel" and darel["alpha"] == 0.8 and darel["A"] == 0.3 and darel["eta"] == 3
    assert darel["plan"]["planned_epochs"] == cal["planned_epochs"] and darel["budget_adherence"] == pytest.approx(10.0 / 20.0)
    assert darel["T_full_s"] == 20.0 and darel["M_full_bytes"] == 2000
    baseline = records.image_cell(dict(params, cell="baseline"), _train(), {"top1": 91.0}, _train(), None, {})
    assert baseline["method"] == "baseline" and baseline["alpha"] == baseline["A"] == 1.0 and baseline["plan"] is None
    short = plans.method_plan("short-schedule", cal, n_full=1000, warmup_epochs=2, epochs=12,
                              params={"controls": {"short_schedule": {"schedule": "linear"}}})
    control = records.image_cell(dict(params, table="study_table1", method="short-schedule"),
                                 _train(method_plan=short.record()), {"top1": 89.0}, _train(), cal, {})
    assert control["alpha"] == 1.0 and control["A"] == 1.0 and control["eta"] is None  # all data, no online rule
    assert control["plan"] == short.record()  # the whole typed plan: no key list can drop a figure


def test_an_nlg_cell_reports_the_metric_suite_and_the_time():
    scores = {"BLEU": 0.4, "TER": 50.0, "METEOR": 0.3, "NIST": 5.0, "ROUGE_L": 0.5, "CIDEr": 1.2, "n_test": 40,
              "n_outputs_cut": 1}
    params = {"table": "table2", "model": "gpt2-small", "cell": "a0.80", "alpha": 0.8, "method": "darel",
              "profile": "quick", "seed": 0}
    cell = records.nlg_cell(params, dict(time_s=5.0, peak_mem_bytes=10, memory_source="cpu", n_train=32,
                                         n_train_full=40, device="cpu"), scores, "SYNTHETIC", {"co2e_kg": 2e-7})
    assert cell["BLEU"] == 0.4 and cell["alpha"] == 0.8 and cell["n_train"] == 32 and cell["dataset_label"] == "SYNTHETIC"
    assert records.is_nlg("study_table3") and not records.is_nlg("study_table1")
    lora = records.nlg_cell(dict(copy.deepcopy(params), alpha=None, method=None, cell="lora"),
                            dict(time_s=5.0, peak_mem_bytes=10, memory_source="cpu", n_train=40, n_train_full=40,
                                 device="cpu"), scores, "SYNTHETIC", {})
    assert lora["method"] == "lora"


def test_matched_gives_every_method_the_same_share_of_its_steps_at_each_rate(cfg):
    """Issue 28: under ``matched`` the shares of a run's optimiser steps at the initial and
    at the final rate are the same for every method, within one step's worth, whatever the
    sizes of its epochs (DAREL's warm-up epochs hold all its data, its later ones A of it)."""
    from darel import schedules

    fractions = schedules.milestone_fractions((60, 120, 160), 200)
    batch = 64

    def shares(kinds: list[str], samples: dict[str, float]) -> tuple[float, float]:
        before, total = schedules.planned_sample_offsets(kinds, samples)
        factors = []
        for epoch, kind in enumerate(kinds):
            steps = -(-int(samples[kind]) // batch)
            for i in range(steps):
                trained = min((i + 1) * batch, int(samples[kind]))
                progress = schedules.sample_progress(before[epoch], samples[kind], total, trained, i == steps - 1)
                factors.append(schedules.lr_factor("multistep", progress, fractions=fractions, gamma=0.2))
        first, last = factors[0], factors[-1]
        return (sum(f == first for f in factors) / len(factors), sum(f == last for f in factors) / len(factors),
                len(factors))

    darel = shares(["warmup"] * 2 + ["refresh", "reuse", "reuse"] * 6, {"warmup": 4000, "refresh": 1200, "reuse": 1200})
    short = shares(["full"] * 9, {"full": 4000})
    rs2 = shares(["subset"] * 20, {"subset": 1700})
    for method in (short, rs2):
        for k in (0, 1):  # initial rate, final rate
            assert abs(method[k] - darel[k]) <= 1.5 / min(method[2], darel[2]), (method, darel)
    assert abs(darel[0] - 0.3) < 0.02 and abs(darel[1] - 0.2) < 0.02  # the protocol's 60/200 and 40/200


def test_the_method_plans_tool_counts_each_methods_full_data_epochs(tmp_path, capsys, monkeypatch):
    from darel.tools import method_plans

    # n_full 1000 at batch 64: 16 steps of 0.06 s = 0.96 s a full epoch; t_max 10 s of 20 epochs' 19.2.
    cal = _calibration(t_max_s=10.0)
    protocol = {"epochs": 20, "warmup_epochs": 1}
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    rows = {r["method"]: r for r in method_plans.plans_at(cal, methods=["short-schedule", "infobatch", "darel"],
                                                          n_full=1000, protocol=protocol, params=params)}
    short = plans.method_plan("short-schedule", cal, n_full=1000, warmup_epochs=1, epochs=20, params=params)
    assert rows["short-schedule"]["planned_epochs"] == short.planned_epochs == rows["short-schedule"]["full_data_epochs"]
    info = plans.method_plan("infobatch", cal, n_full=1000, warmup_epochs=1, epochs=20, params=params)
    full = sum(info.epoch_samples[k] >= 1000 for k in info.epoch_kinds[: info.planned_epochs])
    assert rows["infobatch"]["full_data_epochs"] == full and 1 <= full < info.planned_epochs
    assert rows["darel"]["full_data_epochs"] == 0  # DAREL trains its subset of 800, never all 1000
    # The command reads a build's calibrations and the data's size.
    folder = tmp_path / "runs/quick/table1/resnet18/s0/t0.50_m0.55"
    folder.mkdir(parents=True)
    (folder / "calibration.json").write_text(json.dumps(cal))
    (tmp_path / "data/quick").mkdir(parents=True)
    (tmp_path / "data/quick/meta.json").write_text(json.dumps({"n_train": 1000}))
    monkeypatch.chdir(tmp_path)
    assert method_plans.main(["--params", str(ROOT / "params.yaml"), "--methods", "infobatch"]) == 0
    out = capsys.readouterr().out
    assert "infobatch" in out and "predicted training seconds per seed" in out


def test_a_study_job_depends_on_its_own_methods_settings_only(cfg):
    cell = ("resnet18", "t0.50_m0.55", 0)
    infobatch = config.control_params(cfg, *cell, "infobatch")
    assert infobatch["controls"] == {"infobatch": cfg["controls"]["infobatch"]}
    # another control's setting, or a control added to params.yaml, leaves the job's slice as it was
    changed = copy.deepcopy(cfg)
    changed["controls"]["rs2"]["ratio"] = 0.25
    changed["controls"]["toy"] = {"offset": 5}
    assert config.control_params(changed, *cell, "infobatch") == infobatch
    assert config.control_params(changed, *cell, "random") == config.control_params(cfg, *cell, "random")
    assert "controls" not in config.control_params(cfg, *cell, "random")  # a method without settings of its own
    # darel's settings live outside controls: it gets them at their own path, not an empty dict
    darel = config.control_params(cfg, *cell, "darel")
    assert darel["darel"] == cfg["darel"] and "controls" not in darel
    plan = plans.method_plan("infobatch", _calibration(), n_full=1000, warmup_epochs=2, epochs=12, params=infobatch)
    assert plan.r_max == cfg["controls"]["infobatch"]["r_max"]
    missing = copy.deepcopy(cfg)
    del missing["controls"]["rs2"]
    with pytest.raises(config.ConfigError, match="method rs2 reads its settings at controls.rs2, absent"):
        config.control_params(missing, *cell, "rs2")
    with pytest.raises(ValueError, match="method infobatch reads its settings at controls.infobatch, absent"):
        plans.method_plan("infobatch", _calibration(), n_full=1000, warmup_epochs=2, epochs=12, params={})


def test_the_run_plan_records_its_one_resolved_learning_rate_rule(cfg):
    """The plan a run trains carries its learning rate as one resolved rule (the record
    train.json and the run's log hold), short-schedule's own schedule included."""
    study_cfg = copy.deepcopy(cfg)
    study_cfg["study"]["schedule"] = "paper"
    study_cfg["controls"]["short_schedule"]["schedule"] = "milestones"
    settings = plans.ImageSettings.from_slice(config.control_params(study_cfg, "resnet18", "t0.50_m0.55", 0,
                                                                     "short-schedule"))
    method_plan = plans.method_plan("short-schedule", _calibration(), n_full=1000, warmup_epochs=2, epochs=12,
                                    params=study_cfg)
    plan = plans.run_plan(settings, method_plan)
    proto = settings.protocol
    span = method_plan.planned_epochs
    assert plan.lr_schedule == schedules.epochwise("multistep", plans.batch_lr(proto, 64, settings.lr_rule),
                                                   milestones=proto.milestones, gamma=proto.lr_gamma,
                                                   epochs=proto.epochs, span=span)
    record = plan.record()["lr_schedule"]
    assert record["kind"] == "multistep" and tuple(record["milestones"]) == plan.lr_schedule.milestones
    assert json.loads(json.dumps(plan.record(), default=str))["lr_schedule"]["base"] == plan.lr_schedule.base
    with pytest.raises(ValueError, match="lr_schedule must be a darel.schedules.LrSchedule"):
        RunPlan(**{**{f: getattr(plan, f) for f in ("epochs", "batch", "momentum", "weight_decay", "seed")},
                   "lr_schedule": 0.1})
