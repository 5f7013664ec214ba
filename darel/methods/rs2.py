"""rs2: all data, walked in random permutations: every epoch trains the next fresh random
share of it (method card: darel.controls.rs2)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from darel.methods import register
from darel.methods.base import FULL_DATA, Method, MethodPlan, Selection, step_seconds


@dataclass(frozen=True)
class RS2Settings(Selection):
    """A fresh random share ``ratio`` of the data every epoch."""

    ratio: float

    def policy(self, run, n_samples: int, device: Any):
        from darel.controls.rs2 import RandomSubsetsPerEpoch

        return RandomSubsetsPerEpoch(n_samples=n_samples, batch_size=run.batch, ratio=self.ratio, seed=run.seed,
                                     device=device)


@dataclass(frozen=True)
class RS2Plan(MethodPlan):
    ratio: float


@register
class RS2(Method):
    name = "rs2"
    subset = FULL_DATA
    order = 80
    plan_type = RS2Plan
    selection_type = RS2Settings
    settings_path = ("controls", "rs2")
    settings_schema = {"ratio": {"oneOf": [{"const": "auto"},
                                           {"type": "number", "exclusiveMinimum": 0, "maximum": 1}]}}

    def plan(self, cal: dict, *, n_full: int, warmup_epochs: int, epochs: int, settings: dict) -> RS2Plan:
        from darel.controls.rs2 import ratio_for_budget
        from darel.controls.short_schedule import epochs_that_fit

        step_s, batch, t_max = step_seconds(cal), int(cal["batch"]), cal["t_max_s"]
        if settings["ratio"] == "auto":
            ratio, planned = ratio_for_budget(step_s=step_s, n_samples=n_full, batch=batch, epochs=epochs,
                                              t_max_s=t_max), epochs
            while planned > 1 and planned * math.ceil(max(1, round(ratio * n_full)) / batch) * step_s > t_max:
                planned -= 1
        else:
            ratio = float(settings["ratio"])
            epoch_s = math.ceil(max(1, round(ratio * n_full)) / batch) * step_s
            planned = epochs_that_fit(epoch_s, t_max, epochs)
        per_epoch = max(1, round(ratio * n_full))
        epoch_s = math.ceil(per_epoch / batch) * step_s
        return self.finish(cal, ["subset"] * planned, rule=None, ratio=ratio, planned_epochs=planned,
                           predicted_time_s=planned * epoch_s, predicted_adherence=planned * epoch_s / t_max,
                           plan_exceeds_budget=epoch_s > t_max, epoch_cost_s={"subset": epoch_s},
                           epoch_samples={"subset": float(per_epoch)})

    def run_fields(self, plan: RS2Plan, settings, *, matched: bool) -> dict:
        return {"selection": RS2Settings(ratio=float(plan.ratio))}
