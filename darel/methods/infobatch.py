"""infobatch: all data; each epoch a planned number of below-mean-loss samples is pruned
at random and the kept ones re-weighted, full data in the first and the annealing
epochs (method card: darel.controls.infobatch)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from darel.methods import register
from darel.methods.base import FULL_DATA, Method, MethodPlan, PlanError, Selection, full_steps, step_seconds


@dataclass(frozen=True)
class InfoBatchSettings(Selection):
    """P below-mean samples dropped per pruned epoch (r <= r_max), full data from
    ``anneal_start_epoch`` on."""

    prune_count: int
    anneal_start_epoch: int
    r_max: float = 0.9

    def policy(self, run, n_samples: int, device: Any):
        from darel.controls.infobatch import InfoBatch

        return InfoBatch(n_samples=n_samples, batch_size=run.batch, prune_count=self.prune_count,
                         anneal_start_epoch=self.anneal_start_epoch, r_max=self.r_max, seed=run.seed, device=device)


@dataclass(frozen=True)
class InfoBatchPlan(MethodPlan):
    r_max: float
    prune_count: int
    prune_fraction_of_data: float
    anneal_start_epoch: int


@register
class InfoBatchMethod(Method):
    name = "infobatch"
    subset = FULL_DATA
    order = 70
    plan_type = InfoBatchPlan
    selection_type = InfoBatchSettings
    settings_path = ("controls", "infobatch")
    settings_schema = {"anneal_fraction": {"type": "number", "minimum": 0, "exclusiveMaximum": 1},
                       "r_max": {"type": "number", "minimum": 0, "exclusiveMaximum": 1},
                       "below_fraction_plan": {"type": "number", "exclusiveMinimum": 0, "maximum": 1}}

    def plan(self, cal: dict, *, n_full: int, warmup_epochs: int, epochs: int, settings: dict) -> InfoBatchPlan:
        from darel.controls.infobatch import prune_count_for_budget

        step_s = step_seconds(cal)
        fit = prune_count_for_budget(step_s=step_s, n_samples=n_full, batch=int(cal["batch"]), epochs=epochs,
                                     t_max_s=cal["t_max_s"], anneal_fraction=settings["anneal_fraction"],
                                     r_max=settings["r_max"], below_fraction_plan=settings["below_fraction_plan"])
        if fit is None:
            raise PlanError(f"method infobatch: no number of epochs and pruned samples fits t_max = "
                            f"{cal['t_max_s']:.4g} s (a full epoch is predicted to take "
                            f"{step_s * full_steps(n_full, cal):.4g} s)")
        kinds = ["full" if e == 0 else "anneal" if e >= fit["anneal_start_epoch"] else "prune"
                 for e in range(fit["planned_epochs"])]
        return self.finish(cal, kinds, rule=None, r_max=settings["r_max"],
                           epoch_cost_s={"full": step_s * full_steps(n_full, cal)}, **fit)

    def run_fields(self, plan: InfoBatchPlan, settings, *, matched: bool) -> dict:
        return {"selection": InfoBatchSettings(prune_count=int(plan.prune_count),
                                               anneal_start_epoch=int(plan.anneal_start_epoch),
                                               r_max=float(plan.r_max))}
