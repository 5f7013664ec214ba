"""short-schedule: all data, no selection, the epochs that fit t_max at the cell's batch,
the learning rate decayed over them (own_schedule, which darel.plans.lr_schedule applies).

Kaddour et al. (2023, "No train no gain") found that the gains of several
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

from dataclasses import dataclass

from darel.methods import register
from darel.methods.base import FULL_DATA, Method, MethodPlan, epochs_that_fit, full_steps, step_seconds


@dataclass(frozen=True)
class ShortSchedulePlan(MethodPlan):
    schedule: str  # "linear" (to zero over the planned steps) or "milestones" (scaled to the planned epochs)
    schedule_steps: int


@register
class ShortSchedule(Method):
    name = "short-schedule"
    subset = FULL_DATA
    order = 50
    plan_type = ShortSchedulePlan
    settings_path = ("controls", "short_schedule")
    settings_schema = {"schedule": {"enum": ["linear", "milestones"]}}

    def plan(self, cal: dict, *, n_full: int, warmup_epochs: int, epochs: int, settings: dict) -> ShortSchedulePlan:
        steps = full_steps(n_full, cal)
        epoch_s = step_seconds(cal) * steps
        planned = epochs_that_fit(epoch_s, cal["t_max_s"], epochs)
        return self.fixed_epochs(cal, kind="full", epoch_s=epoch_s, samples=n_full, epochs=epochs, planned=planned,
                                 schedule=settings["schedule"], schedule_steps=planned * steps)

    def own_schedule(self, plan: ShortSchedulePlan) -> dict:
        # Under the paper rule only: the matched rule decays every method's rate over its own run.
        if plan.schedule == "linear":
            return {"linear_steps": int(plan.schedule_steps)}
        return {"epochs": int(plan.planned_epochs)}
