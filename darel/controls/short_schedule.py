"""short-schedule: all data, no selection, as many epochs as fit t_max at the
calibrated batch, the learning-rate schedule compressed to those epochs.

Method card. Kaddour et al. (2023, "No train no gain") found that the gains of several
data-selection methods vanish against plain training whose schedule is shortened to the
same budget with the learning rate fully decayed. Here: every epoch is a plain shuffled
epoch over the whole training set at the cell's calibrated batch b; the number of
epochs E' is the most that the calibration's cost model fits into t_max (a plain epoch
costs ceil(n / b) steps); the learning rate decays linearly from the protocol's rate to
zero over the E' * ceil(n / b) planned steps (``schedule: linear``, default; the rate
used by step k is lr * (1 - k / K), so it reaches zero exactly when the last planned
step is done), or the paper's milestones scaled to E' epochs (``schedule: milestones``).
"""

from __future__ import annotations

import math


def linear_to_zero(step: int, total_steps: int) -> float:
    """Factor of the base learning rate used by optimiser step ``step`` (0-based) of
    ``total_steps``: 1 at the first, 1/K at the last, 0 once all are done."""
    if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1:
        raise ValueError(f"total_steps must be a positive integer, got {total_steps!r}")
    return max(0.0, 1.0 - step / total_steps)


def epochs_that_fit(epoch_s: float, t_max_s: float, max_epochs: int) -> int:
    """The most whole epochs of ``epoch_s`` each within ``t_max_s`` (at least 1, at most
    ``max_epochs``)."""
    if not (epoch_s > 0 and t_max_s > 0):
        raise ValueError(f"epoch_s and t_max_s must be positive, got {epoch_s!r}, {t_max_s!r}")
    return int(min(max_epochs, max(1, math.floor(t_max_s / epoch_s * (1 + 1e-9)))))
