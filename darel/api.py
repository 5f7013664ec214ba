"""Any method of darel.methods in a training loop of your own, planned at a budget from
your measured baseline (no Snakemake, no MLflow; the methods' default settings are
params.yaml's):

    from darel import api

    steps = api.measure_steps(train_step, score_step, batch=128, n_samples=len(y), model=model, optimizer=opt)
    baseline = api.Baseline(labels=y, losses=scorer_losses, epochs=20, batch=128, warmup_epochs=2,
                            time_s=T, steps=steps)
    run = api.plan("darel", budget=(0.5, 0.8), baseline=baseline, seed=0)

    loader = DataLoader(run.dataset(train_set), batch_sampler=run.batch_sampler(score=no_grad_losses))
    for epoch in range(run.epochs):
        for x, y, index in loader:                         # the indices the method chose this epoch
            loss = run.update(index, F.cross_entropy(model(x), y, reduction="none"))
            optimizer.zero_grad(); loss.backward(); optimizer.step()

``train_step(b)`` runs one optimiser step of your loop on ``b`` samples and
``score_step(b)`` one no-grad forward of ``b`` samples; ``measure_steps`` meters and times
them once (the training state is put back afterwards). ``plan`` then runs the project's
own plan path for the method: Algorithm 1 and equations 2-5 on those measurements
(darel.budget.calibrate), the training set (Algorithm 2's subset of the baseline's
``losses``, a random one, or all data) and the method's plan at that calibration
(``Method.plan`` and ``Method.run_fields`` of darel.methods), so every method planned
from one baseline and budget shares the batch, the budget and the cost model, as the
methods of a study cell do. examples/own_training_loop.py is a complete script.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from darel import methods
from darel.methods.base import FULL_DATA, SCORER_SUBSET, Method, MethodPlan, Selection

PARAMS = Path(__file__).resolve().parents[1] / "params.yaml"


@dataclass(frozen=True)
class StepCosts:
    """Your loop's steps, measured once in one session (``measure_steps``): the peak
    memory (bytes) and time of a training step at every batch b = 1, 2, 4, ... and at the
    baseline's batch, one no-grad scoring pass at ``score_batch`` and the planning of an
    Algorithm 3 epoch over the training set; a no-grad scoring pass likewise at every
    batch up to the largest scoring batch (the plan scores at the largest within m M, as
    the calibration stage does). Times are in the probes' seconds (only their ratios are
    used: the baseline's time converts them)."""

    memory_bytes: dict[int, int]
    step_s: dict[int, float]
    score_bytes: dict[int, int]
    score_s: dict[int, float]
    plan_s: float


@dataclass(frozen=True)
class Baseline:
    """Your baseline run, measured: the training set's ``labels`` (Algorithm 2 keeps a share
    of every class), the trained baseline's per-sample ``losses`` (Algorithm 2's scorer;
    only the methods that rank by it need them), its ``epochs``, ``batch`` and warm-up
    epochs (Algorithm 3's omega), its time ``time_s`` (T) and its steps' costs; its peak
    step memory M is the step's at its batch."""

    labels: Any
    epochs: int
    batch: int
    time_s: float
    steps: StepCosts
    warmup_epochs: int = 0
    losses: Any = None

    def __post_init__(self) -> None:
        for name in ("epochs", "batch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"Baseline.{name} must be a positive integer, got {value!r}")
        if isinstance(self.warmup_epochs, bool) or not isinstance(self.warmup_epochs, (int, np.integer)) \
                or not 0 <= self.warmup_epochs <= self.epochs:
            raise ValueError(f"Baseline.warmup_epochs must be an integer in [0, epochs], got {self.warmup_epochs!r}")
        if not (isinstance(self.time_s, (int, float, np.number)) and math.isfinite(self.time_s) and self.time_s > 0):
            raise ValueError(f"Baseline.time_s (T) must be a positive number of seconds, got {self.time_s!r}")
        if np.asarray(self.labels).ndim != 1 or len(self.labels) == 0:
            raise ValueError(f"Baseline.labels must be one class per sample, got shape {np.shape(self.labels)}")
        if self.losses is not None and np.shape(self.losses) != np.shape(self.labels):
            raise ValueError(f"Baseline.losses must be one loss per sample: shape {np.shape(self.losses)} against "
                             f"labels {np.shape(self.labels)}")
        measured = set(self.steps.memory_bytes) & set(self.steps.step_s)
        missing = [b for b in probe_batches(self.batch) if b not in measured]
        if missing:
            raise ValueError(f"Baseline.steps lacks the steps at batch(es) {missing} (measure_steps with "
                             f"batch={self.batch})")

    @property
    def peak_bytes(self) -> int:
        return int(self.steps.memory_bytes[self.batch])

    @property
    def n_samples(self) -> int:
        return len(self.labels)


def probe_batches(batch: int) -> list[int]:
    """The batches Algorithm 1 may probe under a baseline batch B: 1, 2, 4, ... below B, and B."""
    return [1 << k for k in range(max(0, int(batch - 1).bit_length())) if 1 << k < batch] + [int(batch)]


def measure_steps(train_step: Callable[[int], None], score_step: Callable[[int], None], *, batch: int,
                  n_samples: int, model, optimizer, score_batch: int | None = None, device: Any = "cpu",
                  warmup: int = 1, repeats: int = 3, rounds: int = 3) -> StepCosts:
    """Meter and time your loop's steps as the calibration stage does (darel.measure): the
    peak memory of one step at every batch of ``probe_batches(batch)`` and of a scoring
    pass at every batch of ``probe_batches(score_batch)`` (default ``batch``), then their times with the planning of an
    Algorithm 3 epoch over ``n_samples`` (params.yaml's history size and bins), in
    interleaved rounds of one session (on a CPU the process's CPU time, as your baseline's
    T should be). The model and optimiser are put back afterwards."""
    import torch

    from darel.measure import StepMemoryMeter, preserved_training_state, time_passes
    from darel.sampler import OnlineSampler

    device = torch.device(device)
    score_batch = int(score_batch or batch)
    darel_settings = methods.get("darel").own_settings(_params())
    planner = OnlineSampler(n_samples=int(n_samples), batch_size=int(batch), keep_fraction=0.5, eta=1,
                            warmup_epochs=0, history_size=int(darel_settings["history_size"]),
                            bins=int(darel_settings["bins"]), seed=0, device=device)
    planner.update_losses(0, torch.rand(int(n_samples), generator=torch.Generator(device=device).manual_seed(0),
                                        device=device))

    def peak(run: Callable[[], None], kind: str) -> int:
        for _ in range(warmup):
            run()
        meter = StepMemoryMeter(model, optimizer, device)
        with meter.step(kind=kind):
            run()
        return int(meter.peak_bytes)

    batches = probe_batches(batch)
    passes: dict = {("train", b): (lambda b=b: train_step(b)) for b in batches}
    scores = probe_batches(score_batch)
    passes.update({("score", e): (lambda e=e: score_step(e)) for e in scores})
    passes["plan"] = lambda: planner.plan_epoch(1)
    with preserved_training_state(model, optimizer, None, device):
        memory = {b: peak(passes[("train", b)], "train") for b in batches}
        score_bytes = {e: peak(passes[("score", e)], "score") for e in scores}
        times = time_passes(passes, device, warmup=warmup, repeats=repeats, rounds=rounds)
    return StepCosts(memory_bytes=memory, step_s={b: float(times[("train", b)]) for b in batches},
                     score_bytes=score_bytes, score_s={e: float(times[("score", e)]) for e in scores},
                     plan_s=float(times["plan"]))


@dataclass(frozen=True)
class _Protocol:
    warmup_epochs: int


@dataclass(frozen=True)
class _LoopSettings:
    """What a method's ``run_fields`` reads of a run's settings (darel.plans.ImageSettings' fields)."""

    protocol: _Protocol
    history_size: int
    bins: int


@dataclass
class Run:
    """A method planned for your loop: its ``plan`` (darel.methods' typed plan: planned
    epochs, samples and predicted time), the training set ``indices`` (into your data set),
    the online ``selection`` (None: every sample every epoch), ``schedule`` (the method's
    own learning-rate schedule, Method.own_schedule: short-schedule's ``{"linear_steps": K}``,
    linear to zero over K steps, or ``{"epochs": E}``, your schedule compressed to E epochs;
    ``{}``: keep yours) and the
    ``calibration`` it was planned at. ``batch_sampler`` gives each epoch's batches to a
    DataLoader and ``update`` takes each batch's per-sample losses back."""

    method: str
    plan: MethodPlan
    indices: np.ndarray
    selection: Selection | None
    schedule: dict
    calibration: dict
    seed: int
    protocol_epochs: int
    device: Any = "cpu"
    trained_samples: int = field(default=0, init=False)  # counted by ``update``
    _policy: Any = field(default=None, init=False, repr=False)
    _epoch: int = field(default=0, init=False, repr=False)

    def __post_init__(self) -> None:
        import torch

        from darel.methods.base import Loop

        self.device = torch.device(self.device)
        loop = Loop(batch=self.batch, seed=self.seed, epochs=self.protocol_epochs,
                    score_batch=int(self.calibration["score_batch"]))
        # A method without a selection of its own trains every sample every epoch (the baseline's).
        selection = self.selection or methods.get("baseline").make_selection()
        self._policy = selection.policy(loop, len(self.indices), self.device)
        self._index = torch.as_tensor(self.indices, dtype=torch.long, device=self.device)
        self._position = torch.full((int(self.indices.max()) + 1,), -1, dtype=torch.long, device=self.device)
        self._position[self._index] = torch.arange(len(self.indices), device=self.device)
        self._weights = None  # this epoch's loss weights, where the method gives some (InfoBatch)

    @property
    def batch(self) -> int:
        return int(self.plan.batch)

    @property
    def epochs(self) -> int:
        return int(self.plan.planned_epochs)

    def lr_factor(self, step: int) -> float:
        """The factor of your learning rate at optimiser ``step`` (0-based) under the method's
        own schedule: 1 - step / K for a linear one over K steps (short-schedule), 1 otherwise
        (keep your loop's schedule); e.g. torch.optim.lr_scheduler.LambdaLR(optimizer,
        run.lr_factor), stepped after every step."""
        if "linear_steps" in self.schedule:
            from darel.schedules import linear_to_zero  # the one rate rule's linear shape

            return linear_to_zero(step, int(self.schedule["linear_steps"]))
        return 1.0

    def dataset(self, data):
        """``data`` (a map-style Dataset) with every item's index appended: (*item, index)."""
        return IndexedDataset(data)

    def batch_sampler(self, score: Callable | None = None) -> "PlannedBatches":
        """The batch sampler of a DataLoader (``batch_sampler=``): every iteration is the
        next planned epoch's batches of data set indices. ``score(indices) -> per-sample
        losses`` (no grad) is called where the method scores (DAREL's refresh epochs,
        selective backprop's candidates), in chunks of the calibrated scoring batch."""
        return PlannedBatches(self, score)

    def update(self, indices, losses):
        """The batch's per-sample training ``losses`` (reduction="none") for the samples at
        data set ``indices``: the method observes them, and the loss to back-propagate is
        returned (their mean, weighted where the method weights them: InfoBatch)."""
        import torch

        indices = torch.as_tensor(indices, device=self.device)
        low, high = (int(v) for v in torch.aminmax(indices))
        positions = self._position[indices] if 0 <= low and high < len(self._position) else None
        if positions is None or int(positions.min()) < 0:  # a few operations: this runs every step
            raise ValueError(f"method {self.method}: update got indices outside its training set "
                             f"(between {low} and {high})")
        self._policy.observe(positions, losses.detach())
        self.trained_samples += int(positions.numel())
        if self._weights is None:
            return losses.mean()
        return (losses * self._weights[positions].to(losses.device, losses.dtype)).mean()

    def _epoch_batches(self, score: Callable | None) -> Iterator[list[int]]:
        import torch

        if self._epoch >= self.epochs:
            raise ValueError(f"method {self.method}: its plan has {self.epochs} epoch(s), all of them iterated")
        epoch, self._epoch = self._epoch, self._epoch + 1
        chunk = int(self.calibration["score_batch"])

        def score_positions(positions):
            if score is None:
                raise ValueError(f"method {self.method} scores samples in epoch {epoch}: pass "
                                 "batch_sampler(score=...), the per-sample losses of data set indices (no grad)")
            indices = self._index[positions]
            return torch.cat([torch.as_tensor(score(part)).to(self.device).reshape(-1)
                              for part in indices.split(chunk)])

        self._weights = None
        for positions, weights in self._policy.batches(epoch, score_positions):
            if weights is not None:
                if self._weights is None:
                    self._weights = torch.ones(len(self.indices), device=self.device)
                self._weights[positions] = weights.to(self._weights)
            yield self._index[positions].tolist()

    def state_dict(self) -> dict:
        return {"epoch": self._epoch, "trained_samples": self.trained_samples, "policy": self._policy.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self._epoch, self.trained_samples = int(state["epoch"]), int(state["trained_samples"])
        self._policy.load_state_dict(state["policy"])


class PlannedBatches:
    """A DataLoader's batch sampler over a Run: each iteration the next planned epoch."""

    def __init__(self, run: Run, score: Callable | None) -> None:
        self.run, self.score = run, score

    def __iter__(self) -> Iterator[list[int]]:
        return self.run._epoch_batches(self.score)


class IndexedDataset:
    """A map-style data set whose items carry their index last (``Run.update`` needs it)."""

    def __init__(self, data) -> None:
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int):
        item = self.data[index]
        return (*item, index) if isinstance(item, tuple) else (item, index)


def plan(method: str, *, budget: tuple[float, float], baseline: Baseline, settings: dict | None = None,
         seed: int = 0, device: Any = "cpu") -> Run:
    """``method`` (a name of darel.methods) planned at ``budget`` = (t, m): at most t times
    the baseline's time and m times its peak step memory. ``settings`` replace some of the
    method's own settings (params.yaml's section of it: for DAREL ``darel``, for a control
    ``controls.<name>``); ``seed`` seeds its training set's draw and its selection. Raises
    ValueError naming the method when it cannot be planned from a baseline alone, and
    darel.methods.PlanError when no plan of it fits the budget."""
    from darel import budget as budget_model
    from darel.calibration import kept_total, seconds_per_probe_second

    chosen = _plannable(method)
    t, m = _budget_pair(budget)
    params = _params()
    darel_settings = methods.get("darel").own_settings(params)
    own = _own_settings(chosen, params, settings or {})
    if chosen.name == "darel":
        darel_settings = own
    labels = np.asarray(baseline.labels)
    n, steps = len(labels), baseline.steps
    score_batch = _score_batch(steps, m * baseline.peak_bytes)
    cal = budget_model.calibrate(lambda b: steps.memory_bytes[b], lambda bs: {b: steps.step_s[b] for b in bs},
                                 T_full_s=baseline.time_s, M_full_bytes=baseline.peak_bytes, t=t, m=m, n_samples=n,
                                 epochs=baseline.epochs, max_batch=baseline.batch,
                                 **{k: darel_settings[k] for k in ("alpha_default", "A_min", "A_max")})
    cal.update(n_kept=kept_total(labels, cal["alpha"]), score_batch=score_batch, t_score_s=steps.score_s[score_batch],
               t_plan_s=steps.plan_s, seconds_per_probe_second=seconds_per_probe_second(
                   baseline.time_s, baseline.epochs * math.ceil(n / baseline.batch), cal["t_ref_s"]))
    method_plan = chosen.plan(cal, n_full=n, warmup_epochs=baseline.warmup_epochs, epochs=baseline.epochs,
                              settings=own)
    loop = _LoopSettings(protocol=_Protocol(baseline.warmup_epochs), history_size=int(darel_settings["history_size"]),
                         bins=int(darel_settings["bins"]))
    selection = dict(chosen.run_fields(method_plan, loop)).get("selection")
    return Run(method=chosen.name, plan=method_plan, indices=_training_set(chosen, baseline, cal["alpha"],
                                                                           darel_settings["mode"], seed),
               selection=selection, schedule=chosen.own_schedule(method_plan), calibration=cal, seed=seed, protocol_epochs=baseline.epochs,
               device=device)


def _plannable(name: str) -> Method:
    chosen = methods.get(name)
    if type(chosen).plan is Method.plan:
        raise ValueError(f"method {name} has no plan at a budget (the baseline is the measured run itself)")
    if chosen.subset not in (SCORER_SUBSET, FULL_DATA) and (
            chosen.needs_category or type(chosen).build_subset is Method.build_subset):
        raise ValueError(f"method {name} cannot be planned from a baseline alone: its training set "
                         f"({chosen.subset!r}) needs more than the labels and the baseline's losses")
    return chosen


def _score_batch(steps: StepCosts, m_max_bytes: float) -> int:
    """The largest measured scoring batch whose pass peaks within m M (1 at least, as
    darel.calibration chooses it)."""
    fitting = [e for e, peak in steps.score_bytes.items() if peak <= m_max_bytes]
    return max(fitting) if fitting else min(steps.score_bytes)


def _budget_pair(value) -> tuple[float, float]:
    try:
        t, m = (float(x) for x in value)
    except (TypeError, ValueError):
        raise ValueError(f"budget must be a pair (t, m), got {value!r}") from None
    if not (0 < t <= 1 and 0 < m <= 1):
        raise ValueError(f"budget (t, m) must lie in (0, 1] each, got {value!r}")
    return t, m


def _own_settings(chosen: Method, params: dict, overrides: dict) -> dict:
    unknown = sorted(set(overrides) - set(chosen.settings_schema))
    if unknown:
        raise ValueError(f"method {chosen.name}: unknown setting(s) {unknown}; its settings are "
                         f"{sorted(chosen.settings_schema)}")
    return {**(chosen.own_settings(params) if chosen.settings_path else {}), **overrides}


def _training_set(chosen: Method, baseline: Baseline, alpha: float, mode: str, seed: int) -> np.ndarray:
    """The method's training set (sorted indices): Algorithm 2's subset of the baseline's
    losses, all data, or the method's own draw."""
    labels = np.asarray(baseline.labels)
    if chosen.subset == FULL_DATA:
        return np.arange(len(labels), dtype=np.int64)
    if chosen.subset == SCORER_SUBSET:
        if baseline.losses is None:
            raise ValueError(f"method {chosen.name} keeps Algorithm 2's subset: give Baseline(losses=...), the "
                             "trained baseline's per-sample losses")
        from darel.selection import select_by_loss

        return np.asarray(select_by_loss(np.asarray(baseline.losses, dtype=np.float64), labels, alpha, mode))
    return np.asarray(chosen.build_subset(labels, alpha, seed))


def _params() -> dict:
    """params.yaml, validated: the methods' default settings."""
    from darel.config import load_params

    return load_params(PARAMS)
