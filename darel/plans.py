"""What a run trains, for every method of every table, in one place.

Settings arrive as a stage's parameter slice (darel.config.slices, JSON on the command
line) and become typed here once (``ImageSettings``, ``FinetuneSettings``). From them
and a cell's calibration:

* ``method_plan`` is a method's time plan at a budget: which subset it trains on, its
  online rule, how many epochs its own epoch costs fit into t_max (every method of a
  study cell shares the cell's budget, batch and cost model);
* ``darel_plan`` is the same record for a DAREL cell of Table 1, read from its
  calibration (the calibration is DAREL's plan);
* ``run_plan`` turns settings (+ calibration + method plan) into the ``RunPlan`` the
  training loop runs: the baseline, a DAREL cell, IDS + ADONIS, or any control;
* ``finetune_indices`` picks the pairs a LoRA fine-tuning trains on (all, DAREL's
  highest-loss alpha, the study's random or lowest-loss alpha).

Pure functions over typed settings and dicts; no I/O. The path of one parameter, the
time budget t: params.yaml -> darel.config.slices.calibration_params -> the calibrate
stage (t_max = t T, the planned epochs in calibration.json) -> ImageSettings.from_slice
-> run_plan(settings, calibration) -> RunPlan.train_epochs -> darel.epochs.run_epochs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from darel import budget, schedules
from darel.config import CONTROL_METHODS
from darel.controls.infobatch import prune_count_for_budget
from darel.controls.random_subset import random_per_class
from darel.controls.rs2 import ratio_for_budget
from darel.controls.selective_backprop import keep_fraction_for_beta
from darel.controls.short_schedule import epochs_that_fit
from darel.image_training import (InfoBatchSettings, MatchedSchedule, OnlineSettings, RS2Settings, RunPlan,
                                  SelectiveBackpropSettings)
from darel.selection import select_by_loss

METHODS = CONTROL_METHODS
# The subset each method trains on: DAREL's offline subset, a random one of its size, or all data.
SUBSET_OF = {"darel": "darel", "random-offline": "random", "uniform-online": "darel", "random": "random",
             "short-schedule": "full", "selective-backprop": "full", "infobatch": "full", "rs2": "full"}
# The methods whose training set comes from the offline scorer's losses (the scorer's
# training and its scoring pass are their own costs in the total accounting).
USES_SCORER = frozenset({"darel", "uniform-online"})


def _take(cls, values: dict):
    names = {f.name for f in fields(cls)}
    return cls(**{key: value for key, value in values.items() if key in names})


@dataclass(frozen=True)
class Protocol:
    """A model's training protocol (paper section 4; a profile may override its sizes)."""

    optimizer: str
    lr: float
    momentum: float
    weight_decay: float
    schedule: str
    milestones: tuple[int, ...]
    lr_gamma: float
    epochs: int
    batch: int
    warmup_epochs: int
    width: int
    input_size: int | None = None
    algebra: str | None = None
    stem: str | None = None

    @classmethod
    def from_dict(cls, values: dict) -> Protocol:
        return _take(cls, {**values, "milestones": tuple(values["milestones"])})


@dataclass(frozen=True)
class Runtime:
    """A profile's runtime settings."""

    device: str
    threads: int
    precision: str
    compile: bool | str  # darel.step.COMPILE_SETTINGS
    eval_batch: int
    eval_every: int
    checkpoint_every: int


@dataclass(frozen=True)
class ImageSettings:
    """Everything an image training run of a cell depends on (a training stage's slice)."""

    model: str
    seed: int
    protocol: Protocol
    runtime: Runtime
    augment: dict
    carbon: dict
    t: float | None = None
    m: float | None = None
    history_size: int | None = None
    bins: int | None = None
    enforce: str = "plan"
    schedule: str = "keep"
    ids_adonis: dict | None = None
    method: str | None = None
    controls: dict = field(default_factory=dict)
    study_schedule: str | None = None  # a study run's schedule rule: "matched" or "paper" (None: Table 1)

    @classmethod
    def from_slice(cls, params: dict) -> ImageSettings:
        budget_settings = params.get("budget", {})
        return cls(model=params["model"], seed=int(params["seed"]), protocol=Protocol.from_dict(params["protocol"]),
                   runtime=_take(Runtime, params), augment=dict(params["augment"]), carbon=dict(params["carbon"]),
                   t=params.get("t"), m=params.get("m"), history_size=params.get("history_size"),
                   bins=params.get("bins"), enforce=budget_settings.get("enforce", "plan"),
                   schedule=budget_settings.get("schedule", "keep"), ids_adonis=params.get("ids_adonis"),
                   method=params.get("method"), controls=dict(params.get("controls") or {}),
                   study_schedule=params.get("study_schedule"))


# ---- method plans at a budget ----------------------------------------------------------------

def darel_plan(calibration: dict) -> dict | None:
    """A DAREL cell's plan, as its calibration made it (None for IDS + ADONIS: no budget)."""
    if calibration.get("planned_epochs") is None:
        return None
    return {"subset": "darel", "rule": "histogram",
            **{key: calibration[key] for key in ("planned_epochs", "predicted_time_s", "predicted_adherence",
                                                 "plan_exceeds_budget") if key in calibration}}


class PlanError(ValueError):
    """No plan of a method fits its budget; the message says which and by how much."""


def _kinds_samples(kinds: list[str], epoch_samples: dict[str, float]) -> float:
    return float(sum(epoch_samples[kind] for kind in kinds))


def _finish(plan: dict, kinds: list[str], t_max: float) -> dict:
    """Record the planned epochs' kinds and samples; refuse a plan over its budget."""
    plan["epoch_kinds"] = kinds
    plan["planned_samples"] = _kinds_samples(kinds, plan["epoch_samples"])
    if plan.get("plan_exceeds_budget") or plan["predicted_time_s"] > t_max * (1 + 1e-9):
        raise PlanError(f"method {plan['method']}: even {plan['planned_epochs']} epoch(s) are predicted to take "
                        f"{plan['predicted_time_s']:.4g} s, over t_max = {t_max:.4g} s; a larger budget t is needed")
    return plan


def _online_plan(cal: dict, *, n_kept: int, warmup_epochs: int, epochs: int, scoring: bool) -> dict:
    costs = budget.online_epoch_costs(
        seconds_per_probe_second=cal["seconds_per_probe_second"], t_b_s=cal["t_b_s"], batch=cal["batch"],
        n_kept=n_kept, keep_fraction=cal["A"], t_score_s=cal["t_score_s"] if scoring else 1e-300,
        score_batch=cal["score_batch"], t_plan_s=cal["t_plan_s"])
    if not scoring:  # the uniform rule never scores: a refresh epoch costs what a reuse epoch does
        costs["refresh"] = costs["reuse"]
    kinds = budget.epoch_kinds(epochs, warmup_epochs, int(cal["eta"]))
    fitted = budget.plan_epochs(costs, kinds, cal["t_max_s"])
    selected = cal["A"] * n_kept
    return {**fitted, "epoch_cost_s": costs,
            "epoch_samples": {"warmup": float(n_kept), "refresh": selected, "reuse": selected}}


def method_plan(method: str, cal: dict, *, n_full: int, warmup_epochs: int, epochs: int,
                controls: dict | None = None) -> dict:
    """What ``method`` trains in a study cell: which subset ("darel", "random", "full"),
    the online rule, the planned epochs and the predicted time, the samples it plans to
    train (``planned_samples``, and per kind of epoch ``epoch_samples``), and the method's
    own settings. All methods share the cell's budget (t_max), its calibrated batch and
    the cost model's measured terms (``cal``: the cell's calibration.json: the speed
    factor, t_b, the scoring batch and its time, the planning time); each gets the
    epochs its own epoch costs fit into t_max. A method with no plan within t_max raises
    ``PlanError``: no plan over its budget is ever used.

    ``n_full`` is the training set's size; ``epochs`` and ``warmup_epochs`` the
    protocol's; ``controls`` the params' controls section (each control's own settings).
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    controls = controls or {}
    k = cal["seconds_per_probe_second"]
    t_max = cal["t_max_s"]
    n_kept = int(cal["n_kept"])
    batch = int(cal["batch"])
    step_s = k * cal["t_b_s"]
    full_steps = math.ceil(n_full / batch)
    plan: dict = {"method": method, "subset": SUBSET_OF[method], "batch": batch,
                  "score_batch": int(cal["score_batch"]), "t_max_s": t_max, "uses_scorer": method in USES_SCORER}
    if method in ("darel", "random-offline"):
        plan.update(rule="histogram", A=cal["A"], eta=int(cal["eta"]),
                    **_online_plan(cal, n_kept=n_kept, warmup_epochs=warmup_epochs, epochs=epochs, scoring=True))
        return _finish(plan, plan["epoch_kinds"], t_max)
    if method in ("uniform-online", "random"):
        plan.update(rule="uniform", A=cal["A"], eta=int(cal["eta"]),
                    **_online_plan(cal, n_kept=n_kept, warmup_epochs=warmup_epochs, epochs=epochs, scoring=False))
        return _finish(plan, plan["epoch_kinds"], t_max)
    if method == "short-schedule":
        epoch_s = step_s * full_steps
        planned = epochs_that_fit(epoch_s, t_max, epochs)
        schedule = controls.get("short_schedule", {}).get("schedule", "linear")
        plan.update(rule=None, planned_epochs=planned, predicted_time_s=planned * epoch_s,
                    predicted_adherence=planned * epoch_s / t_max, plan_exceeds_budget=epoch_s > t_max,
                    epoch_cost_s={"full": epoch_s}, schedule=schedule, schedule_steps=planned * full_steps,
                    epoch_samples={"full": float(n_full)})
        return _finish(plan, ["full"] * planned, t_max)
    if method == "selective-backprop":
        settings = controls.get("selective_backprop", {})
        beta = float(settings.get("beta", 3.0))
        share = keep_fraction_for_beta(beta)
        score_s = k * cal["t_score_s"] * math.ceil(n_full / cal["score_batch"])
        costs = {"warmup": step_s * full_steps, "select": score_s + step_s * math.floor(share * n_full / batch)}
        kinds = ["warmup" if e < warmup_epochs else "select" for e in range(epochs)]
        fitted = budget.plan_epochs(costs, kinds, t_max)
        plan.update(rule=None, beta=beta, keep_fraction=share, history_size=int(settings.get("history_size", 1024)),
                    candidate_batch=int(cal["score_batch"]), **fitted, epoch_cost_s=costs,
                    epoch_samples={"warmup": float(n_full), "select": share * n_full})
        return _finish(plan, plan["epoch_kinds"], t_max)
    if method == "rs2":
        ratio_setting = controls.get("rs2", {}).get("ratio", "auto")
        if ratio_setting == "auto":
            ratio, planned = ratio_for_budget(step_s=step_s, n_samples=n_full, batch=batch, epochs=epochs,
                                              t_max_s=t_max), epochs
            while planned > 1 and planned * math.ceil(max(1, round(ratio * n_full)) / batch) * step_s > t_max:
                planned -= 1
        else:
            ratio = float(ratio_setting)
            epoch_s = math.ceil(max(1, round(ratio * n_full)) / batch) * step_s
            planned = epochs_that_fit(epoch_s, t_max, epochs)
        per_epoch = max(1, round(ratio * n_full))
        epoch_s = math.ceil(per_epoch / batch) * step_s
        plan.update(rule=None, ratio=ratio, planned_epochs=planned, predicted_time_s=planned * epoch_s,
                    predicted_adherence=planned * epoch_s / t_max, plan_exceeds_budget=epoch_s > t_max,
                    epoch_cost_s={"subset": epoch_s}, epoch_samples={"subset": float(per_epoch)})
        return _finish(plan, ["subset"] * planned, t_max)
    # infobatch
    settings = controls.get("infobatch", {})
    fit = prune_count_for_budget(step_s=step_s, n_samples=n_full, batch=batch, epochs=epochs, t_max_s=t_max,
                                 anneal_fraction=settings.get("anneal_fraction", 0.125),
                                 r_max=settings.get("r_max", 0.9),
                                 below_fraction_plan=settings.get("below_fraction_plan", 0.5))
    if fit is None:
        raise PlanError(f"method infobatch: no number of epochs and pruned samples fits t_max = {t_max:.4g} s "
                        f"(a full epoch is predicted to take {step_s * full_steps:.4g} s)")
    kinds = ["full" if e == 0 else "anneal" if e >= fit["anneal_start_epoch"] else "prune"
             for e in range(fit["planned_epochs"])]
    plan.update(rule=None, r_max=settings.get("r_max", 0.9), epoch_cost_s={"full": step_s * full_steps}, **fit)
    return _finish(plan, kinds, t_max)


# ---- the run plan of the training loop ----------------------------------------------------------

def _protocol_plan(settings: ImageSettings, batch: int | None = None, **overrides: Any) -> RunPlan:
    proto, runtime = settings.protocol, settings.runtime
    if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int) or batch < 1):
        raise ValueError(f"batch must be a positive integer, got {batch!r}")
    values = dict(
        epochs=proto.epochs, batch=batch or proto.batch, lr=proto.lr, momentum=proto.momentum,
        weight_decay=proto.weight_decay, schedule=proto.schedule, milestones=tuple(proto.milestones),
        lr_gamma=proto.lr_gamma, seed=settings.seed, precision=runtime.precision, eval_batch=runtime.eval_batch,
        eval_every=runtime.eval_every, checkpoint_every=runtime.checkpoint_every, compile=runtime.compile,
    )
    return RunPlan(**{**values, **overrides})


def _budget_overrides(settings: ImageSettings, calibration: dict, planned_epochs: int, epoch_cost_s: dict) -> dict:
    """Plan enforcement trains the planned epochs; wall-clock enforcement stops at t_max."""
    overrides: dict = {"score_batch": int(calibration["score_batch"]), "epoch_cost_s": epoch_cost_s}
    if settings.enforce == "plan":
        overrides["train_epochs"] = int(planned_epochs)
    else:
        overrides["time_budget_s"] = float(calibration["t_max_s"])
    return overrides


def run_plan(settings: ImageSettings, calibration: dict | None = None, method: dict | None = None) -> RunPlan:
    """The training loop's plan of a cell: the protocol's for a baseline (no calibration);
    a DAREL or IDS + ADONIS cell's from its calibration; a study control's from its
    ``method`` plan (``method_plan``) and the cell's calibration."""
    if calibration is None:
        return _protocol_plan(settings)
    proto = settings.protocol
    batch = int(calibration["batch"])
    if method is None:  # DAREL (Algorithm 3 at the calibrated A and eta) or IDS + ADONIS
        online = OnlineSettings(keep_fraction=calibration["A"], eta=int(calibration["eta"]),
                                warmup_epochs=proto.warmup_epochs, history_size=settings.history_size,
                                bins=settings.bins)
        overrides: dict = {"online": online}
        if calibration.get("t_max_s") is not None:  # a budgeted cell (IDS + ADONIS has none)
            if calibration.get("enforce") not in (None, settings.enforce):
                raise ValueError(f"calibration was made for budget.enforce = {calibration['enforce']!r}, "
                                 f"this run asks for {settings.enforce!r}")
            overrides.update(_budget_overrides(settings, calibration, calibration["planned_epochs"],
                                               calibration["epoch_cost_s"]))
            if settings.schedule == "rescale":
                overrides["schedule_epochs"] = int(calibration["planned_epochs"])
        return _protocol_plan(settings, batch=batch, **overrides)
    name = method["method"]
    planned = int(method["planned_epochs"])
    if method.get("plan_exceeds_budget"):
        raise PlanError(f"method {name}: its plan exceeds t_max; it is never trained")
    overrides = _budget_overrides(settings, calibration, planned, method["epoch_cost_s"])
    matched = settings.study_schedule == "matched"
    if matched:  # every method's own planned run, ending at the schedule's final value
        overrides["matched"] = MatchedSchedule(
            shape=proto.schedule, planned_epochs=planned,
            epoch_samples=tuple(sorted((kind, float(v)) for kind, v in method["epoch_samples"].items())),
            fractions=schedules.milestone_fractions(proto.milestones, proto.epochs), gamma=proto.lr_gamma)
    if method.get("rule"):
        overrides["online"] = OnlineSettings(
            keep_fraction=method["A"], eta=int(method["eta"]), warmup_epochs=proto.warmup_epochs,
            history_size=settings.history_size, bins=settings.bins, rule=method["rule"])
    elif name == "short-schedule":
        if matched:
            pass
        elif method["schedule"] == "linear":
            overrides.update(schedule="linear", schedule_steps=int(method["schedule_steps"]))
        else:
            overrides["schedule_epochs"] = planned
    elif name == "selective-backprop":
        overrides["selective_backprop"] = SelectiveBackpropSettings(
            beta=method["beta"], warmup_epochs=proto.warmup_epochs, history_size=int(method["history_size"]))
    elif name == "infobatch":
        overrides["infobatch"] = InfoBatchSettings(prune_count=int(method["prune_count"]),
                                                   anneal_start_epoch=int(method["anneal_start_epoch"]),
                                                   r_max=float(method["r_max"]))
    elif name == "rs2":
        overrides["rs2"] = RS2Settings(ratio=float(method["ratio"]))
    else:
        raise ValueError(f"no run plan for method {name!r}")
    return _protocol_plan(settings, batch=batch, **overrides)


# ---- Tables 2 and 3 -----------------------------------------------------------------------------

@dataclass(frozen=True)
class FinetuneSettings:
    """A LoRA fine-tuning cell: which pairs (alpha, mode: hard / easy / random), its seed."""

    model: str
    seed: int
    method: str  # lora (all pairs), darel, random, easy
    alpha: float | None
    mode: str

    @classmethod
    def from_slice(cls, params: dict) -> FinetuneSettings:
        alpha = params.get("alpha")
        return cls(model=params.get("model", ""), seed=int(params["seed"]),
                   method=params.get("method", "lora" if alpha is None else "darel"), alpha=alpha,
                   mode=params.get("mode", "hard"))


def finetune_indices(settings: FinetuneSettings, n_pairs: int, losses: np.ndarray | None = None) -> np.ndarray:
    """The training pairs of a fine-tuning, as sorted indices: all of them (the LoRA
    baseline); the ceil(alpha n) highest-loss (DAREL, Algorithm 2 without classes) or
    lowest-loss (the study's easy control); or a seeded random subset of that size."""
    if settings.alpha is None:
        return np.arange(n_pairs, dtype=np.int64)
    if settings.mode == "random":
        return random_per_class(np.zeros(n_pairs, dtype=np.int64), settings.alpha, seed=settings.seed)
    if losses is None or len(losses) != n_pairs:
        raise ValueError(f"mode {settings.mode!r} ranks by the scorer's losses: need {n_pairs}, got "
                         f"{None if losses is None else len(losses)}")
    return select_by_loss(losses, None, settings.alpha, settings.mode)
