"""What a run trains, for every method of every table, in one place.

Settings arrive as a stage's parameter slice (darel.config.slices, JSON on the command
line) and become typed here once (``ImageSettings``, ``FinetuneSettings``). From them
and a cell's calibration:

* ``method_plan`` is a method's typed time plan (darel.methods: a look-up of the method
  and its ``plan``), for every run but the baseline: a Table 1 cell's (DAREL at its
  calibration, IDS + ADONIS at its fixed settings) and every study method's: which
  subset it trains on, its online rule, how many epochs its own epoch costs fit into
  t_max (every method of a study cell shares the cell's budget, batch and cost model);
* ``run_plan(settings, plan)`` turns settings and that plan into the ``RunPlan`` the
  training loop runs (the method's ``run_fields``: one typed ``selection``), the one way
  a run is set up, with its learning rate resolved by ``lr_schedule``, the one place a
  run's learning rate is decided (darel.schedules.lr_at reads it step by step);
* ``finetune_indices`` picks the pairs a LoRA fine-tuning trains on (all, DAREL's
  highest-loss alpha, the study's random or lowest-loss alpha).

Pure functions over typed settings and dicts; no I/O, no torch. The path of one parameter, the
time budget t: params.yaml -> darel.config.slices.calibration_params -> the calibrate
stage (t_max = t T, in calibration.json) -> method_plan (the planned epochs) ->
run_plan(settings, plan) -> RunPlan.train_epochs -> darel.epochs.run_epochs.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np

from darel import methods, schedules
from darel.methods import MethodPlan, PlanError, Selection


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
    cudnn_benchmark: bool = True  # darel.runtime.configure_runtime's algorithm_search
    curve_test: int | None = None  # the per-epoch test curve's images: the test split's first this many (None: all)


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
    lr_rule: str = "keep"  # budget.lr_rule: the learning rate at a batch other than the protocol's (LR_RULES)
    ids_adonis: dict | None = None
    method: str | None = None
    study_schedule: str | None = None  # a study run's schedule rule: "matched" or "paper" (None: Table 1)

    @classmethod
    def from_slice(cls, params: dict) -> ImageSettings:
        budget_settings = params.get("budget", {})
        return cls(model=params["model"], seed=int(params["seed"]), protocol=Protocol.from_dict(params["protocol"]),
                   runtime=_take(Runtime, params), augment=dict(params["augment"]), carbon=dict(params["carbon"]),
                   t=params.get("t"), m=params.get("m"), history_size=params.get("history_size"),
                   bins=params.get("bins"), enforce=budget_settings.get("enforce", "plan"),
                   schedule=budget_settings.get("schedule", "keep"),
                   lr_rule=budget_settings.get("lr_rule", "keep"), ids_adonis=params.get("ids_adonis"),
                   method=params.get("method"),
                   study_schedule=params.get("study_schedule"))


# ---- the run plan of the training loop ----------------------------------------------------------

@dataclass(frozen=True)
class RunPlan:
    """Everything the image training loop (darel.image_training.train) runs: the protocol,
    the budget's enforcement, the learning rate's resolved rule (``lr_schedule``) and one
    online ``selection`` (a method's typed settings, darel.methods; None: every sample
    every epoch)."""

    epochs: int  # the protocol's epochs (the wall clock's limit)
    batch: int
    lr_schedule: schedules.LrSchedule  # the one learning-rate rule (lr_schedule; darel.schedules.lr_at)
    momentum: float
    weight_decay: float
    seed: int
    precision: str = "fp32"
    eval_batch: int = 512  # test evaluation
    score_batch: int | None = None  # the online stage's scoring pass (default: eval_batch)
    train_epochs: int | None = None  # plan enforcement: train exactly this many epochs
    time_budget_s: float | None = None  # wall-clock enforcement: stop before passing this
    epoch_cost_s: dict | None = None  # the cost model's seconds per epoch kind (wall-clock predictions)
    selection: Selection | None = None  # the method's online selection (None: all data every epoch)
    eval_every: int = 1  # test evaluation every this many epochs (and after the last)
    checkpoint_every: int = 1
    compile: bool | str = False  # darel.step.COMPILE_SETTINGS: False, True, "graphs"
    extra: dict = field(default_factory=dict)  # recorded in the fingerprint only

    def __post_init__(self) -> None:
        for name in ("epochs", "batch", "eval_every", "checkpoint_every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"RunPlan.{name} must be a positive integer, got {value!r}")
        if self.train_epochs is not None and not 1 <= self.train_epochs <= self.epochs:
            raise ValueError(f"RunPlan.train_epochs must lie in [1, epochs={self.epochs}], got {self.train_epochs!r}")
        if self.train_epochs is not None and self.time_budget_s is not None:
            raise ValueError("RunPlan: train_epochs (plan enforcement) and time_budget_s (wall clock) exclude "
                             "each other")
        if self.selection is not None and not isinstance(self.selection, Selection):
            raise ValueError(f"RunPlan.selection must be a method's Selection, got {self.selection!r}")
        if not isinstance(self.lr_schedule, schedules.LrSchedule):
            raise ValueError(f"RunPlan.lr_schedule must be a darel.schedules.LrSchedule, got {self.lr_schedule!r}")

    @property
    def epochs_to_run(self) -> int:
        return self.train_epochs or self.epochs

    def record(self) -> dict:
        """The plan as plain values, its selection named by its type."""
        values = asdict(self)
        values["selection_kind"] = type(self.selection).__name__ if self.selection is not None else None
        return values

    def fingerprint(self, n_samples: int) -> str:
        blob = json.dumps({"plan": self.record(), "n": n_samples}, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


# ---- method plans at a budget ----------------------------------------------------------------

def method_plan(method: str, cal: dict, *, n_full: int, warmup_epochs: int, epochs: int,
                params: dict | None = None, table1: bool = False) -> MethodPlan:
    """What ``method`` trains in a study cell (darel.methods: its ``plan``): which subset,
    the online rule, the planned epochs and the predicted time, the samples it plans to
    train and the method's own figures. ``cal`` is the cell's calibration.json, ``n_full``
    the training set's size, ``epochs`` and ``warmup_epochs`` the protocol's, ``params``
    the whole params or the job's slice (the method reads its own settings there, at its
    ``settings_path``). PlanError when no plan fits t_max: no plan of a study over its
    budget is ever used. A Table 1 cell (``table1``: DAREL's, IDS + ADONIS's) is planned
    from ``cal`` alone, its calibration.json or the IDS row's plan.json (the stages that
    wrote them applied the row's settings; ``params`` unused), and is the paper's row:
    trained at its calibration even over budget (its plan records it)."""
    chosen = methods.get(method)
    if table1:
        return chosen.plan(cal, n_full=n_full, warmup_epochs=warmup_epochs, epochs=epochs, settings=None,
                           over_budget=True)
    if params is None:
        raise ValueError(f"method {method}: a study's plan reads the method's own settings; no params given")
    return chosen.plan(cal, n_full=n_full, warmup_epochs=warmup_epochs, epochs=epochs,
                       settings=chosen.own_settings(params))


def check_enforcement(settings: ImageSettings, calibration: dict) -> None:
    """A Table 1 cell's calibration planned for the run's budget.enforce (plan or
    wallclock); ValueError naming both when it was made for the other."""
    if calibration.get("enforce") not in (None, settings.enforce):
        raise ValueError(f"calibration was made for budget.enforce = {calibration['enforce']!r}, this run asks for "
                         f"{settings.enforce!r}")


# budget.lr_rule: keep, the protocol's learning rate at any batch (the paper); linear, the
# protocol's rate scaled by batch / protocol batch (docs/deviations.md, "Learning rate at a
# reduced batch").
LR_RULES = ("keep", "linear")


def batch_lr(protocol: Protocol, batch: int, rule: str) -> float:
    """The learning rate of a run of ``protocol`` at ``batch`` under ``rule`` (LR_RULES);
    at the protocol's own batch it is the protocol's whatever the rule."""
    if rule not in LR_RULES:
        raise ValueError(f"budget.lr_rule must be one of {LR_RULES}, got {rule!r}")
    if rule == "keep" or batch == protocol.batch:
        return protocol.lr
    return protocol.lr * batch / protocol.batch


def lr_schedule(settings: ImageSettings, batch: int, plan: MethodPlan | None = None) -> schedules.LrSchedule:
    """The one place a run's learning rate is decided, from every setting that bears on it:
    the protocol's rate, schedule, milestones and gamma; budget.lr_rule (the rate at
    ``batch``, batch_lr); and with a budgeted ``plan`` (a method's, method_plan) the study's
    rule (``study_schedule``: matched scales the protocol's shape to the run's own planned
    samples; paper keeps the protocol's epochs), else in Table 1 budget.schedule (rescale
    compresses the schedule to the planned epochs), and a method's own schedule
    (Method.own_schedule: short-schedule's linear decay or compression) where the matched
    rule does not set it. Every loop reads the result through darel.schedules.lr_at."""
    proto = settings.protocol
    base = batch_lr(proto, batch, settings.lr_rule)
    matched = settings.study_schedule == "matched"
    budgeted = plan is not None and plan.t_max_s is not None
    if matched and budgeted:  # every method's own planned run, ending at the schedule's final value
        planned = int(plan.planned_epochs)
        return schedules.LrSchedule(
            "matched", base, shape=proto.schedule, gamma=proto.lr_gamma,
            fractions=schedules.milestone_fractions(proto.milestones, proto.epochs), planned_epochs=planned,
            epoch_samples=tuple(sorted((kind, float(v)) for kind, v in plan.epoch_samples.items())),
            epoch_kinds=tuple(plan.epoch_kinds[:planned]))
    own = methods.get(plan.method).own_schedule(plan) if plan is not None and not matched else {}
    if "linear_steps" in own:
        return schedules.LrSchedule("linear", base, total_steps=int(own["linear_steps"]))
    span = None
    if "epochs" in own:
        span = int(own["epochs"])
    elif budgeted and settings.schedule == "rescale" and settings.study_schedule is None:
        span = int(plan.planned_epochs)
    return schedules.epochwise(proto.schedule, base, milestones=proto.milestones, gamma=proto.lr_gamma,
                               epochs=proto.epochs, span=span)


def _protocol_plan(settings: ImageSettings, batch: int, rate: schedules.LrSchedule, **overrides: Any) -> RunPlan:
    """The protocol's plan at ``batch`` with the learning rate ``rate`` and ``overrides``."""
    proto, runtime = settings.protocol, settings.runtime
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be a positive integer, got {batch!r}")
    values = dict(
        epochs=proto.epochs, batch=batch, lr_schedule=rate, momentum=proto.momentum,
        weight_decay=proto.weight_decay, seed=settings.seed, precision=runtime.precision,
        eval_batch=runtime.eval_batch, eval_every=runtime.eval_every, checkpoint_every=runtime.checkpoint_every,
        compile=runtime.compile,
    )
    return RunPlan(**{**values, **overrides})


def run_plan(settings: ImageSettings, plan: MethodPlan | None = None) -> RunPlan:
    """The training loop's plan of a run: the protocol's for a baseline (no ``plan``);
    otherwise from the method's typed plan (``method_plan``: a Table 1 cell's DAREL or IDS
    + ADONIS plan, or a study method's), the one way every run is set up. With a budget
    (``plan.t_max_s``) the run trains the planned epochs (budget.enforce: plan) or stops
    at t_max (wallclock), at the calibrated batch and scoring batch; its learning rate is
    ``lr_schedule``'s; the method's ``run_fields`` add its selection."""
    if plan is None:
        batch = settings.protocol.batch
        return _protocol_plan(settings, batch, lr_schedule(settings, batch))
    if plan.plan_exceeds_budget and settings.study_schedule is not None:  # a Table 1 cell trains its plan all the same
        raise PlanError(f"method {plan.method}: its plan exceeds t_max; it is never trained")
    overrides: dict = {}
    if plan.t_max_s is not None:
        # The run's test evaluations are no-grad passes like its scoring: at the batch the
        # calibration fitted within m M, so the run's whole peak stays within its budget.
        overrides.update(score_batch=int(plan.score_batch), eval_batch=min(settings.runtime.eval_batch,
                                                                            int(plan.score_batch)),
                         epoch_cost_s=plan.epoch_cost_s)
        if settings.enforce == "plan":  # plan enforcement trains the planned epochs; the wall clock stops at t_max
            overrides["train_epochs"] = int(plan.planned_epochs)
        else:
            overrides["time_budget_s"] = float(plan.t_max_s)
    overrides.update(methods.get(plan.method).run_fields(plan, settings))
    batch = int(plan.batch)
    return _protocol_plan(settings, batch, lr_schedule(settings, batch, plan), **overrides)


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
        from darel.methods.subsets import random_per_class

        return random_per_class(np.zeros(n_pairs, dtype=np.int64), settings.alpha, seed=settings.seed)
    from darel.selection import select_by_loss

    if losses is None or len(losses) != n_pairs:
        raise ValueError(f"mode {settings.mode!r} ranks by the scorer's losses: need {n_pairs}, got "
                         f"{None if losses is None else len(losses)}")
    return select_by_loss(losses, None, settings.alpha, settings.mode)
