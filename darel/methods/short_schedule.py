"""short-schedule: all data, no selection, the epochs that fit t_max at the cell's batch,
the learning rate decayed over them (method card: darel.controls.short_schedule)."""

from __future__ import annotations

from dataclasses import dataclass

from darel.methods import register
from darel.methods.base import FULL_DATA, Method, MethodPlan, full_steps, step_seconds


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
        from darel.controls.short_schedule import epochs_that_fit

        steps = full_steps(n_full, cal)
        epoch_s = step_seconds(cal) * steps
        planned = epochs_that_fit(epoch_s, cal["t_max_s"], epochs)
        return self.finish(cal, ["full"] * planned, rule=None, planned_epochs=planned,
                           predicted_time_s=planned * epoch_s, predicted_adherence=planned * epoch_s / cal["t_max_s"],
                           plan_exceeds_budget=epoch_s > cal["t_max_s"], epoch_cost_s={"full": epoch_s},
                           schedule=settings["schedule"], schedule_steps=planned * steps,
                           epoch_samples={"full": float(n_full)})

    def run_fields(self, plan: ShortSchedulePlan, settings, *, matched: bool) -> dict:
        if matched:  # the matched rule decays every method's rate over its own planned run already
            return {}
        if plan.schedule == "linear":
            return {"schedule": "linear", "schedule_steps": int(plan.schedule_steps)}
        return {"schedule_epochs": plan.planned_epochs}
