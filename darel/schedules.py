"""Learning-rate schedules as a function of a run's progress.

The study's ``matched`` rule (params ``study.schedule``) gives every method the
protocol's schedule shape scaled to its own planned run, so that every method ends fully
decayed whatever its number of epochs and steps: the rate of an optimiser step is the
base rate times ``lr_factor(progress)``, where progress runs from 0 to 1 over the planned
epochs. Within an epoch it advances with the samples trained against the epoch's planned
samples, and the last step of an epoch sits exactly at the epoch's end, so the run's last
step is at progress 1: the schedule's final value (multistep: the rate after every
milestone; cosine and linear: zero).

Pure functions; darel.image_training applies them step by step.
"""

from __future__ import annotations

import math

SHAPES = ("multistep", "cosine", "linear")


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


def step_progress(epoch: int, planned_epochs: int, trained_in_epoch: int, epoch_samples: float,
                  last_of_epoch: bool) -> float:
    """Progress after an optimiser step: ``epoch`` (0-based) of ``planned_epochs``, with
    ``trained_in_epoch`` samples trained so far in it against its ``epoch_samples``
    planned; the epoch's last step is its end exactly, any other stays inside it."""
    if planned_epochs < 1:
        raise ValueError(f"planned_epochs must be >= 1, got {planned_epochs!r}")
    inside = 1.0 if last_of_epoch else min(trained_in_epoch / max(epoch_samples, 1.0), 1.0 - 1e-9)
    return (epoch + inside) / planned_epochs
