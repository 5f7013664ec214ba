"""Learning rates: every loop's rate as one function of the optimiser step.

A run's learning rate is decided once: ``LrSchedule`` is the resolved rule (its kind,
base rate and figures), which darel.plans.lr_schedule makes from the five settings that
bear on it (the protocol's schedule, budget.lr_rule, budget.schedule, study.schedule and
a method's own, short-schedule's) and stores in the run's plan (RunPlan.lr_schedule,
train.json's ``lr_schedule``); the LoRA fine-tuning makes its warm-up and decay from its
own settings. ``lr_at(schedule, at)`` is then the rate of the optimiser step ``at`` (its
epoch, the steps before it in the run, and for the matched rule where it stands in its
epoch), the one function the training loops (darel.image_training,
darel.nlg.lm.finetuning) call before every step, for every schedule of the project: the
protocols' epoch-wise multistep and cosine schedules (the values torch's MultiStepLR and
CosineAnnealingLR step through, to the last bit), the short-schedule control's linear
decay to zero over its planned steps, the LoRA recipe's linear warm-up then linear decay
(the values of Hugging Face's linear schedule), and the study's matched rule.

The study's ``matched`` rule (params ``study.schedule``) gives every method the
protocol's schedule shape scaled to its own planned run, so that every method ends fully
decayed whatever its number of epochs and steps: the rate of an optimiser step is the
base rate times ``lr_factor(progress)``, where progress runs from 0 to 1 over the run's
planned samples (``sample_progress``; at one batch size, its optimiser steps): a method
whose warm-up epochs hold all the data and whose later epochs a fraction of it spends the
same share of its steps at each rate as one whose epochs are all alike (by epochs, DAREL
spent 47 % of its steps at the initial rate where short-schedule spent 30 %). Within an
epoch it advances with the samples trained, and the last step of an epoch sits exactly at
the epoch's planned end, so the run's last step is at progress 1: the schedule's final
value (multistep: the rate after every milestone; cosine and linear: zero). A run without
its planned epoch kinds, or past them, falls back to progress by epochs
(``step_progress``).

Pure functions; the loops apply them step by step.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass


def linear_to_zero(step: int, total_steps: int) -> float:
    """Factor of the base learning rate used by optimiser step ``step`` (0-based) of
    ``total_steps``: 1 at the first, 1/K at the last, 0 once all are done (the
    short-schedule control's decay)."""
    if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1:
        raise ValueError(f"total_steps must be a positive integer, got {total_steps!r}")
    return max(0.0, 1.0 - step / total_steps)


SHAPES = ("multistep", "cosine", "linear")
KINDS = ("multistep", "cosine", "linear", "warmup_linear", "matched")


@dataclass(frozen=True)
class StepAt:
    """An optimiser step as its loop meets it: what ``lr_at`` may read."""

    epoch: int  # 0-based
    step: int  # optimiser steps done before it in the run
    # The matched rule only: the samples trained in its epoch once it is done, whether it
    # ends its epoch, the epoch's kind and the samples of an epoch over the whole training
    # set (the plan of an epoch past the planned ones, or of a kind the plan lacks).
    trained: int = 0
    last: bool = False
    kind: str = ""
    full: int = 0


@dataclass(frozen=True)
class LrSchedule:
    """A run's learning rate, resolved once (darel.plans.lr_schedule) and read only by
    ``lr_at``: the kind, the base rate and the figures of that kind."""

    kind: str  # one of KINDS
    base: float
    milestones: tuple[int, ...] = ()  # multistep: epochs at which the rate is multiplied by gamma
    gamma: float = 0.1  # multistep, and the matched multistep shape
    span: int = 1  # cosine: the epochs over which the rate anneals to zero
    total_steps: int = 1  # linear and warmup_linear: the step at which the rate reaches zero
    warmup_steps: int = 0  # warmup_linear: the steps of the linear warm-up
    shape: str = "multistep"  # matched: the protocol's shape
    fractions: tuple[float, ...] = ()  # matched multistep: the milestones as fractions of the run
    planned_epochs: int = 0  # matched: the run's planned epochs
    epoch_samples: tuple[tuple[str, float], ...] = ()  # matched: (epoch kind, samples planned in such an epoch)
    # matched: the kind of every planned epoch, in order: progress then runs over the run's
    # planned samples (its optimiser steps, at one batch size). Empty: by epochs.
    epoch_kinds: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"learning-rate kind must be one of {KINDS}, got {self.kind!r}")
        if self.kind in ("linear", "warmup_linear") and (isinstance(self.total_steps, bool)
                                                          or not isinstance(self.total_steps, int)
                                                          or self.total_steps < 1):
            raise ValueError(f"a {self.kind} schedule needs total_steps >= 1, got {self.total_steps!r}")
        if self.kind == "matched" and self.shape not in SHAPES:
            raise ValueError(f"schedule shape must be one of {SHAPES}, got {self.shape!r}")

    @property
    def per_step(self) -> bool:
        """Whether the rate changes within an epoch (else it changes between epochs)."""
        return self.kind in ("linear", "warmup_linear", "matched")

    @property
    def reads_epoch_end(self) -> bool:
        """Whether a step's rate depends on its ending its epoch (the matched rule)."""
        return self.kind == "matched"


def lr_at(schedule: LrSchedule, at: StepAt) -> float:
    """The learning rate of the optimiser step ``at`` under ``schedule``: the one function
    every training loop calls for its rate."""
    kind = schedule.kind
    if kind == "multistep":
        rate = schedule.base
        for milestone in sorted(set(schedule.milestones)):
            if at.epoch >= milestone:
                rate = rate * schedule.gamma  # one multiplication per milestone passed, as MultiStepLR
        return rate
    if kind == "cosine":
        return _cosine_annealed(schedule.base, schedule.span, at.epoch)
    if kind == "linear":
        return schedule.base * linear_to_zero(at.step, schedule.total_steps)
    if kind == "warmup_linear":
        return schedule.base * _warmup_linear(at.step, schedule.warmup_steps, schedule.total_steps)
    return schedule.base * lr_factor(schedule.shape, _matched_progress(schedule, at), fractions=schedule.fractions,
                                     gamma=schedule.gamma)


def _matched_progress(schedule: LrSchedule, at: StepAt) -> float:
    """The matched rule's progress once the step ``at`` is done: by planned samples within
    the planned epochs (equal step shares), by epochs past them."""
    samples = dict(schedule.epoch_samples)
    if at.epoch < len(schedule.epoch_kinds):
        before, total = _sample_offsets(schedule.epoch_kinds, schedule.epoch_samples)
        return sample_progress(before[at.epoch], samples[schedule.epoch_kinds[at.epoch]], total, at.trained, at.last)
    return step_progress(at.epoch, schedule.planned_epochs, at.trained, samples.get(at.kind, float(at.full)), at.last)


@functools.lru_cache(maxsize=16)
def _sample_offsets(epoch_kinds: tuple[str, ...], epoch_samples: tuple[tuple[str, float], ...]
                    ) -> tuple[list[float], float]:
    return planned_sample_offsets(epoch_kinds, dict(epoch_samples))


def epochwise(shape: str, base: float, *, milestones: tuple[int, ...] | list[int], gamma: float, epochs: int,
              span: int | None = None) -> LrSchedule:
    """The protocol's epoch-wise schedule (multistep or cosine) of ``epochs``, compressed to
    ``span`` epochs when given (its milestones scaled by span / epochs, at least epoch 1)."""
    span = span or epochs
    if shape == "cosine":
        return LrSchedule("cosine", base, span=span)
    if shape != "multistep":
        raise ValueError(f"an epoch-wise schedule is multistep or cosine, got {shape!r}")
    scale = span / epochs
    return LrSchedule("multistep", base, milestones=tuple(sorted({max(1, round(m * scale)) for m in milestones})),
                      gamma=gamma)


def _cosine_annealed(base: float, span: int, epoch: int) -> float:
    """Cosine annealing to zero over ``span`` epochs by CosineAnnealingLR's recurrence (each
    epoch's rate from the one before), so every value is the one that scheduler sets."""
    rate = base
    for e in range(1, epoch + 1):
        if (e - 1 - span) % (2 * span) == 0:
            rate = rate + base * (1 - math.cos(math.pi / span)) / 2
        else:
            rate = (1 + math.cos(math.pi * e / span)) / (1 + math.cos(math.pi * (e - 1) / span)) * (rate - 0.0) + 0.0
    return rate


def _warmup_linear(step: int, warmup_steps: int, total_steps: int) -> float:
    """Linear warm-up from 0 over ``warmup_steps``, then linear decay to 0 at ``total_steps``."""
    if step < warmup_steps:
        return float(step) / float(max(1, warmup_steps))
    return max(0.0, float(total_steps - step) / float(max(1, total_steps - warmup_steps)))


def set_rate(optimizer, rate: float) -> None:
    """Every parameter group of ``optimizer`` at ``rate``."""
    for group in optimizer.param_groups:
        group["lr"] = rate


def milestone_fractions(milestones: tuple[int, ...] | list[int], epochs: int) -> tuple[float, ...]:
    """The protocol's milestones as fractions of its epochs (60/120/160 of 200: 0.3, 0.6, 0.8)."""
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs must be a positive integer, got {epochs!r}")
    return tuple(sorted(m / epochs for m in milestones))


def lr_factor(shape: str, progress: float, *, fractions: tuple[float, ...] = (), gamma: float = 0.1) -> float:
    """The factor of the base rate at ``progress`` in [0, 1] (clamped)."""
    p = min(1.0, max(0.0, float(progress)))
    if shape == "multistep":
        return gamma ** sum(p >= f for f in fractions)
    if shape == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * p))
    if shape == "linear":
        return 1.0 - p
    raise ValueError(f"schedule shape must be one of {SHAPES}, got {shape!r}")


def final_factor(shape: str, *, fractions: tuple[float, ...] = (), gamma: float = 0.1) -> float:
    """The factor the last step of a matched schedule runs at."""
    return lr_factor(shape, 1.0, fractions=fractions, gamma=gamma)


def planned_sample_offsets(epoch_kinds: tuple[str, ...] | list[str], epoch_samples: dict[str, float]
                           ) -> tuple[list[float], float]:
    """(samples planned before each epoch, samples planned in the whole run) for a run whose
    epochs have ``epoch_kinds`` and whose kinds plan ``epoch_samples`` each."""
    before, total = [], 0.0
    for kind in epoch_kinds:
        before.append(total)
        total += float(epoch_samples[kind])
    return before, total


def sample_progress(samples_before: float, epoch_samples: float, total_samples: float, trained_in_epoch: int,
                    last_of_epoch: bool) -> float:
    """Progress after an optimiser step measured in planned samples (so in optimiser steps,
    at one batch size): the samples planned before this epoch, plus those trained so far in
    it (the epoch's last step: all it planned), over the run's planned samples. Every method
    then spends the same share of its steps at each rate, whatever the sizes of its epochs."""
    if not total_samples > 0:
        raise ValueError(f"total_samples must be positive, got {total_samples!r}")
    inside = epoch_samples if last_of_epoch else min(float(trained_in_epoch), epoch_samples * (1.0 - 1e-9))
    return (samples_before + inside) / total_samples


def step_progress(epoch: int, planned_epochs: int, trained_in_epoch: int, epoch_samples: float,
                  last_of_epoch: bool) -> float:
    """Progress after an optimiser step: ``epoch`` (0-based) of ``planned_epochs``, with
    ``trained_in_epoch`` samples trained so far in it against its ``epoch_samples``
    planned; the epoch's last step is its end exactly, any other stays inside it."""
    if planned_epochs < 1:
        raise ValueError(f"planned_epochs must be >= 1, got {planned_epochs!r}")
    inside = 1.0 if last_of_epoch else min(trained_in_epoch / max(epoch_samples, 1.0), 1.0 - 1e-9)
    return (epoch + inside) / planned_epochs
