"""The image training loop shared by every Table 1 training stage (baseline/scorer, DAREL
online, IDS + ADONIS, the study's methods); its evaluation passes are darel.evaluation.

Data stays on the device once, as uint8 tensors; a subset (Algorithm 2's kept samples)
is a vector of indices into it, gathered batch by batch, never a second copy. Every step
is ``darel.step.TrainStep`` (gather, augment on the device, forward, loss, backward,
update), the same object Algorithm 1's probes time. The online selection (Algorithm 3)
decides which indices form each batch; a plain run is the same loop with every epoch a
warm-up epoch, so the baseline and the DAREL cells time exactly the same code path.

Measurement: each epoch's timed work (the scoring pass of a refresh epoch, planning and
every training step) runs inside one ``TimedWork.interval``, which gives its wall time
and its energy over the same interval; test evaluation and checkpoint writes happen
between intervals and count in neither. Every pass (training steps, scoring batches,
evaluation batches) goes through the same memory meter, so a cell's peak memory is the
maximum over all of them.

Budgets: ``train_epochs`` (plan enforcement) trains exactly that many epochs, whatever
the machine's load; ``time_budget_s`` (wall-clock enforcement, the paper's reading) stops
at the epoch boundary where the next epoch, predicted from the slowest epoch of its kind
so far, would pass the budget.

Resumability: after every ``checkpoint_every`` epochs the full state (weights, optimiser,
loss scaler, sampler, curves, time and energy so far, memory peaks) is saved
atomically. All randomness inside an epoch comes from generators seeded by (seed, epoch),
so a run restarted from a checkpoint replays the following epochs bit for bit on the CPU.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from pathlib import Path
from typing import Callable, Iterable, Iterator

import torch
import torch.nn as nn
import torch.nn.functional as F

from darel import schedules
from darel.epochs import EpochEnd, run_epochs
from darel.evaluation import per_sample_losses, top1_percent
from darel.measure import EnergyTracker, StepMemoryMeter, TimedWork, preserved_training_state
from darel.measure.timing import cores_beside
from darel.methods.baseline import AllData
from darel.plans import RunPlan
from darel.methods.policy import SelectionPolicy
from darel.sgd import Optimizer
from darel.step import COMPILE_TOLERANCE, TrainStep, check_compiled_outputs, prepare_input, resolve_precision, sgd

log = logging.getLogger("darel.image_training")

# Independent random streams per epoch.
_STREAM_AUGMENT = 1
ENFORCEMENTS = ("plan", "wallclock")
EPOCH_KINDS = ("warmup", "refresh", "reuse")


def _digest(obj: object) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:24]


def epoch_generator(seed: int, epoch: int, stream: int, device: torch.device) -> torch.Generator:
    gen = torch.Generator(device=device)
    gen.manual_seed((seed * 1_000_003 + epoch * 101 + stream) % (2**63))
    return gen


def make_optimizer(model: nn.Module, plan: RunPlan, device: torch.device | str = "cpu") -> Optimizer:
    return sgd(model.parameters(), lr=plan.lr_schedule.base, momentum=plan.momentum, weight_decay=plan.weight_decay,
               device=device)


def image_train_step(model: nn.Module, optimizer: Optimizer, images: torch.Tensor,
                     labels: torch.Tensor, augment: Callable, device: torch.device, precision: str,
                     compile: bool | str = False) -> TrainStep:
    """The classification step: gather ``images[idx]``, augment with ``gen``, cross-entropy
    (each sample's loss times its weight, when ``weights`` are given, then the mean).
    ``step(idx, gen, weights=None)`` returns the batch's per-sample losses, their sum and
    the correct count (device tensors). ``compile``: see ``TrainStep``."""

    def assemble(idx: torch.Tensor, gen: torch.Generator, weights: torch.Tensor | None = None):
        return prepare_input(augment(images[idx], gen), device), labels[idx], weights

    def loss_fn(module: nn.Module, batch):
        x, y, weights = batch
        logits = module(x)
        losses = F.cross_entropy(logits.float(), y, reduction="none")
        loss = losses.mean() if weights is None else (losses * weights).mean()
        detached = losses.detach()
        return loss, {"losses": detached, "loss_sum": detached.sum(),
                      "correct": (logits.detach().argmax(1) == y).sum()}

    return TrainStep(model, optimizer, device=device, precision=precision, assemble=assemble, loss_fn=loss_fn,
                     compile=compile)


def scoring_forward(model: nn.Module, compile: bool | str) -> nn.Module:
    """What the scoring pass runs: the model, or under any ``compile`` setting a compiled
    copy of its forward (eval mode, static shapes, no CUDA graphs: its own compilation).
    The training loop and the calibration probes both take it from here, so the probes
    time the pass the run makes."""
    return torch.compile(model, dynamic=False) if compile else model


def make_policy(plan: RunPlan, n: int, device: torch.device) -> SelectionPolicy:
    """The selection policy of a run (its method's ``Selection``; all data without one):
    ``batches(epoch, score)`` yields (positions, weights)."""
    return (plan.selection or AllData()).policy(plan, n, device)


def predict_epoch_s(kind: str, slowest: dict[str, float], cost_model: dict | None) -> float:
    """Wall-clock enforcement's guess of the next epoch: the slowest epoch of its kind so
    far; for a kind not seen yet, the cost model's figure scaled by how the epochs seen so
    far compare with their own predictions (or the slowest epoch seen, without a model)."""
    if kind in slowest:
        return slowest[kind]
    if cost_model and kind in cost_model and cost_model[kind] > 0:
        ratios = [slowest[k] / cost_model[k] for k in slowest if cost_model.get(k, 0) > 0]
        if ratios:
            return cost_model[kind] * max(ratios)
    return max(slowest.values())


def _flag_last(batches: Iterable[tuple]) -> Iterator[tuple]:
    """(positions, weights, is the epoch's last batch) from a policy's batches."""
    iterator = iter(batches)
    try:
        previous = next(iterator)
    except StopIteration:
        return
    for item in iterator:
        yield (*previous, False)
        previous = item
    yield (*previous, True)


class _ImageEpochs:
    """The per-batch body of image training for ``darel.epochs.run_epochs``: the policy's
    batches through the one training step, each metered (counted after the interval on a
    CPU), the test evaluation and the wall-clock budget after the interval."""

    def __init__(self, *, model: nn.Module, optimizer, step: TrainStep,
                 policy: SelectionPolicy, meter: StepMemoryMeter, plan: RunPlan, device: torch.device, rows: torch.Tensor | None,
                 score: Callable[[torch.Tensor], torch.Tensor], n: int, precision: str, normalise: Callable,
                 eval_data: tuple[torch.Tensor, torch.Tensor] | None, work: TimedWork,
                 groups: dict[str, tuple[torch.Tensor, int]] | None = None) -> None:
        self.work = work
        # Per-sample group codes over the full training set (column -> (codes, how many
        # groups)): the trained sample-steps of each group, counted on the device.
        self.groups = groups or {}
        self.group_counts = {name: torch.zeros(size, dtype=torch.long, device=device)
                             for name, (_, size) in self.groups.items()}
        self.model, self.optimizer, self.step, self.policy = model, optimizer, step, policy
        self.lr_schedule = plan.lr_schedule  # the run's one learning-rate rule (darel.schedules.lr_at)
        self.meter, self.plan, self.device, self.rows, self.score = meter, plan, device, rows, score
        self.n, self.precision, self.normalise, self.eval_data = n, precision, normalise, eval_data
        self.steps = 0
        self.slowest_epoch_s: dict[str, float] = {}
        self.kind = "warmup"

    def _replay_step(self, idx: torch.Tensor, weights: torch.Tensor | None, gen_state: torch.Tensor):
        """The same training step again after the interval, for the CPU memory count."""
        def run() -> None:
            replay_gen = torch.Generator(device=self.device)
            replay_gen.set_state(gen_state)
            self.step(idx, replay_gen, weights)
        return run

    def train_epoch(self, epoch: int) -> dict:
        self.kind = self.policy.epoch_kind(epoch)
        gen = epoch_generator(self.plan.seed, epoch, _STREAM_AUGMENT, self.device)
        loss_sum = torch.zeros((), device=self.device)
        correct = torch.zeros((), device=self.device, dtype=torch.long)
        seen = steps = 0
        batches = self.policy.batches(epoch, self.score)
        # Under the matched rule a step must know whether it ends the epoch: one batch ahead.
        flagged = _flag_last(batches) if self.lr_schedule.reads_epoch_end else ((p, w, False) for p, w in batches)
        for positions, weights, last_of_epoch in flagged:
            if self.lr_schedule.per_step or steps == 0:  # the rate of this step
                at = schedules.StepAt(epoch=epoch, step=self.steps + steps, trained=seen + len(positions),
                                      last=last_of_epoch, kind=self.kind, full=self.n)
                schedules.set_rate(self.optimizer, schedules.lr_at(self.lr_schedule, at))
            idx = positions if self.rows is None else self.rows[positions]
            replay = (self._replay_step(idx, weights, gen.get_state())
                      if self.device.type == "cpu" and self.meter.wants(len(idx), "train") else None)
            with self.meter.step(key=len(idx), kind="train", replay=replay):
                stats = self.step(idx, gen, weights)
            self.policy.observe(positions, stats["losses"])
            for name, (codes, size) in self.groups.items():
                self.group_counts[name] += torch.bincount(codes[idx], minlength=size)
            loss_sum += stats["loss_sum"]
            correct += stats["correct"]
            seen += len(idx)
            steps += 1
        if not self.lr_schedule.reads_epoch_end:  # the rate the next step will use (the epoch's record shows it)
            at = schedules.StepAt(epoch + 1, self.steps + steps)
            schedules.set_rate(self.optimizer, schedules.lr_at(self.lr_schedule, at))
        return {"loss_sum": loss_sum, "correct": correct, "seen": seen, "steps": steps}

    def end_epoch(self, epoch: int, timed: dict, seconds: float, last_planned: bool) -> EpochEnd:
        seen = timed["seen"]
        self.steps += timed["steps"]
        self.slowest_epoch_s[self.kind] = max(self.slowest_epoch_s.get(self.kind, 0.0), seconds)
        record = {
            "train_loss": (timed["loss_sum"] / max(seen, 1)).item(),
            "train_top1": 100.0 * timed["correct"].item() / max(seen, 1),
            "lr": self.optimizer.param_groups[0]["lr"],
            "epoch_time_s": seconds,
            "samples_trained": seen,
            "kept_fraction": seen / self.n,
            "loss_refreshed": 1.0 if self.kind == "refresh" else 0.0,
        }
        stop = False
        if self.plan.time_budget_s is not None and not last_planned:
            next_kind = self.policy.epoch_kind(epoch + 1)
            predicted = predict_epoch_s(next_kind, self.slowest_epoch_s, self.plan.epoch_cost_s)
            spent = self.work.time_s  # every timed interval so far, earlier segments of a resumed run included
            if spent + predicted > self.plan.time_budget_s:
                stop = True
                log.info("time budget: %.1f s used, next %s epoch needs ~%.1f s of %.1f s allowed; stopping after "
                         "%d epochs", spent, next_kind, predicted, self.plan.time_budget_s, epoch + 1)
        if self.eval_data is not None:
            # None on the epochs between evaluations keeps the curve aligned with the epochs.
            record["test_top1"] = None
            if last_planned or stop or (epoch + 1) % self.plan.eval_every == 0:
                record["test_top1"] = top1_percent(self.model, self.eval_data[0], self.eval_data[1], self.normalise,
                                                   self.plan.eval_batch, self.precision, meter=self.meter)
                self.model.train()
        return EpochEnd(record, stop)

    def preserved_state(self):
        return preserved_training_state(self.model, self.optimizer, self.step, self.device)

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "step": self.step.state_dict(),
                "policy": self.policy.state_dict(), "steps": self.steps, "slowest_epoch_s": self.slowest_epoch_s,
                "group_counts": {name: counts.cpu() for name, counts in self.group_counts.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step.load_state_dict(state["step"])
        self.policy.load_state_dict(state["policy"])
        self.steps, self.slowest_epoch_s = int(state["steps"]), dict(state["slowest_epoch_s"])
        for name, counts in state.get("group_counts", {}).items():
            if name in self.group_counts:
                self.group_counts[name] = counts.to(self.group_counts[name].device)


def train(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, augment: Callable,
          normalise: Callable, plan: RunPlan, device: torch.device, *,
          subset: torch.Tensor | None = None,
          energy: EnergyTracker | None = None,  # started by the caller; stopped here
          checkpoint_path: str | Path | None = None,
          eval_data: tuple[torch.Tensor, torch.Tensor] | None = None,
          progress: bool = True,
          on_epoch_end: Callable[[int, dict], None] | None = None,
          fingerprint_extra: dict | None = None,
          groups: dict[str, tuple[torch.Tensor, int]] | None = None) -> dict:
    """Train in place on ``images``/``labels`` (or the samples ``subset`` indexes); return
    the run summary (time, energy, memory, curves, epochs; with ``groups``, column ->
    (per-sample codes over ``images``, number of codes), the trained sample-steps of each
    code: ``trained_by_group``). A checkpoint at
    ``checkpoint_path`` is resumed only when its fingerprint (the plan, the sample count
    and ``fingerprint_extra``) matches; see darel.checkpoint and darel.epochs."""
    rows = None if subset is None else torch.as_tensor(subset, dtype=torch.long, device=device)
    n = len(labels) if rows is None else len(rows)
    if n == 0:
        raise ValueError("the training set is empty")
    precision = resolve_precision(plan.precision, device)
    score_batch = plan.score_batch or plan.eval_batch
    model.to(device)
    if device.type == "cuda":
        model.to(memory_format=torch.channels_last)
    optimizer = make_optimizer(model, plan, device)
    step = image_train_step(model, optimizer, images, labels, augment, device, precision, plan.compile)
    policy = make_policy(plan, n, device)
    meter = StepMemoryMeter(model, optimizer, device)
    work = TimedWork(energy, device)
    step.untimed = work.excluded  # a compiled step's compilations leave the epochs' time and energy
    # What the run's result depends on: the plan, the sample count and whatever the caller
    # adds (the stage's parameters, the content hashes of its inputs, the code version).
    fingerprint = _digest({"plan": plan.fingerprint(n), "extra": fingerprint_extra or {}})
    model.train()
    # The scoring pass's first batch is checked against eager mode like the training step's.
    scoring_model = scoring_forward(model, plan.compile)
    compile_checks: dict = {}

    def score(positions: torch.Tensor) -> torch.Tensor:
        """The metered no-grad loss of the samples at ``positions`` (the scoring pass)."""
        selected = positions if rows is None else rows[positions]
        if plan.compile and "score" not in compile_checks:
            first = selected[:score_batch]
            with work.excluded():  # the scoring forward compiles here, outside the epoch's time
                compile_checks["score"] = check_compiled_outputs(
                    per_sample_losses(model, images, labels, normalise, score_batch, precision, rows=first),
                    per_sample_losses(scoring_model, images, labels, normalise, score_batch, precision, rows=first),
                    tolerance=COMPILE_TOLERANCE[precision], what="scoring pass (per-sample losses)")
        losses = per_sample_losses(scoring_model, images, labels, normalise, score_batch, precision,
                                   rows=selected, meter=meter, defer_count=True)
        model.train()
        return losses

    body = _ImageEpochs(model=model, optimizer=optimizer, step=step, policy=policy, meter=meter,
                        plan=plan, device=device, rows=rows, score=score, n=n, precision=precision,
                        normalise=normalise, eval_data=eval_data, work=work, groups=groups)

    def describe(epoch: int, end: EpochEnd, seconds: float) -> str:
        record = end.record
        test = f"test top1 {record['test_top1']:.2f}% " if record.get("test_top1") is not None else ""
        return (f"epoch {epoch + 1}/{plan.epochs_to_run} {body.kind}: loss {record['train_loss']:.4f} train top1 "
                f"{record['train_top1']:.2f}% {test}{seconds:.2f} s ({record['samples_trained']} samples)")

    result = run_epochs(body, epochs=plan.epochs_to_run, work=work, meter=meter, energy=energy,
                        checkpoint=checkpoint_path, checkpoint_every=plan.checkpoint_every, fingerprint=fingerprint,
                        say=log.info, progress=progress, on_epoch_end=on_epoch_end, map_location=device,
                        describe=describe)
    return _run_summary(result, plan, body, work, meter, precision, step, compile_checks, policy, fingerprint)


def _run_summary(result, plan: RunPlan, body: _ImageEpochs, work: TimedWork, meter: StepMemoryMeter,
                 precision: str, step, compile_checks: dict, policy, fingerprint: str) -> dict:
    """The summary ``train`` returns (train.json's figures) from run_epochs' ``result`` and the
    pieces of the run."""
    curves = result.curves
    return {
        "epochs_completed": result.epochs_completed,
        "epochs_planned": plan.epochs_to_run,
        "epochs_protocol": plan.epochs,
        "stopped_by_budget": result.stopped,
        "time_s": result.time_s,
        "wall_time_s": result.wall_time_s,
        "cpu_beside_s": result.cpu_beside_s if math.isfinite(result.cpu_beside_s) else None,
        "cores_beside": cores_beside(result.cpu_beside_s, result.wall_time_s),
        "clock": work.clock_name,
        "time_budget_s": plan.time_budget_s,
        "steps": body.steps,
        "samples_trained": int(sum(curves.get("samples_trained", []))),
        "peak_mem_bytes": result.peak_mem_bytes,
        "peak_mem_by_pass": {k: int(v) for k, v in result.peak_by_kind.items()},
        "memory_source": meter.source,
        "nvml_peak_bytes": result.nvml_peak_bytes,
        "nvml_status": meter.nvml_status,
        "precision": precision,
        "step": step.kind,  # eager, compiled or graphs: what the calibration's probes timed too
        "compile_check": ({"train_step": step.compile_check, **compile_checks} if plan.compile else None),
        # The compilations' seconds, taken out of time_s and the energy (TimedWork.excluded).
        "compile_s": work.excluded_s if plan.compile else None,
        "selection": {"policy": policy.name, **policy.stats()},
        "resumed_from_epoch": result.resumed_from_epoch,
        "segments": result.segments,
        "curves": curves,
        "trained_by_group": {name: counts.tolist() for name, counts in body.group_counts.items()},
        "fingerprint": fingerprint,
        "energy": result.energy,
    }
