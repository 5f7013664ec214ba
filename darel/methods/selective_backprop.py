"""selective-backprop: all data; each candidate chunk's no-grad losses choose the samples
to back-propagate, a share 1 / (beta + 1) of them (method card:
darel.controls.selective_backprop)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from darel.bounds import MAX_HISTORY, int_range, num_range
from darel.methods import register
from darel.methods.base import FULL_DATA, Method, MethodPlan, Selection, full_steps, step_seconds


@dataclass(frozen=True)
class SelectiveBackpropSettings(Selection):
    """Selectivity beta, candidates in chunks of the scoring batch."""

    beta: float
    warmup_epochs: int
    history_size: int

    def policy(self, run, n_samples: int, device: Any):
        from darel.controls.selective_backprop import SelectiveBackprop

        return SelectiveBackprop(n_samples=n_samples, batch_size=run.batch, beta=self.beta,
                                 candidate_batch=run.score_batch or run.eval_batch, history_size=self.history_size,
                                 warmup_epochs=self.warmup_epochs, seed=run.seed, device=device)


@dataclass(frozen=True)
class SelectiveBackpropPlan(MethodPlan):
    beta: float
    keep_fraction: float
    history_size: int
    candidate_batch: int


@register
class SelectiveBackpropMethod(Method):
    name = "selective-backprop"
    subset = FULL_DATA
    order = 60
    plan_type = SelectiveBackpropPlan
    selection_type = SelectiveBackpropSettings
    settings_path = ("controls", "selective_backprop")
    settings_schema = {"beta": num_range(0, 100), "history_size": int_range(1, MAX_HISTORY)}

    def plan(self, cal: dict, *, n_full: int, warmup_epochs: int, epochs: int,
             settings: dict) -> SelectiveBackpropPlan:
        from darel import budget
        from darel.controls.selective_backprop import keep_fraction_for_beta

        beta = float(settings["beta"])
        share = keep_fraction_for_beta(beta)
        step_s = step_seconds(cal)
        score_s = cal["seconds_per_probe_second"] * cal["t_score_s"] * math.ceil(n_full / cal["score_batch"])
        costs = {"warmup": step_s * full_steps(n_full, cal),
                 "select": score_s + step_s * math.floor(share * n_full / int(cal["batch"]))}
        kinds = ["warmup" if e < warmup_epochs else "select" for e in range(epochs)]
        fitted = budget.plan_epochs(costs, kinds, cal["t_max_s"])
        return self.finish(cal, fitted.pop("epoch_kinds"), rule=None, beta=beta, keep_fraction=share,
                           history_size=int(settings["history_size"]), candidate_batch=int(cal["score_batch"]),
                           **fitted, epoch_cost_s=costs, epoch_samples={"warmup": float(n_full), "select": share * n_full})

    def run_fields(self, plan: SelectiveBackpropPlan, settings, *, matched: bool) -> dict:
        return {"selection": SelectiveBackpropSettings(beta=plan.beta, warmup_epochs=settings.protocol.warmup_epochs,
                                                       history_size=int(plan.history_size))}
