"""The time plan of every method of the study, from one cell's calibration.

All methods share the cell's budget (t_max, m_max), its calibrated batch b and the cost
model's measured terms (``calibration.json``: the speed factor, t_b, the scoring batch
and its time, the planning time); each gets the epochs its own epoch costs fit into
t_max. Pure functions over dicts.
"""

from __future__ import annotations

import math

from darel import budget
from darel.controls import METHODS
from darel.controls.infobatch import prune_fraction_for_budget
from darel.controls.selective_backprop import beta_for_keep_fraction
from darel.controls.short_schedule import epochs_that_fit

SUBSET_OF = {"darel": "darel", "random-offline": "random", "uniform-online": "darel", "random": "random",
             "short-schedule": "full", "selective-backprop": "full", "infobatch": "full"}


def _online_plan(cal: dict, *, n_kept: int, warmup_epochs: int, epochs: int, scoring: bool) -> dict:
    costs = budget.online_epoch_costs(
        seconds_per_probe_second=cal["seconds_per_probe_second"], t_b_s=cal["t_b_s"], batch=cal["batch"],
        n_kept=n_kept, keep_fraction=cal["A"], t_score_s=cal["t_score_s"] if scoring else 1e-300,
        score_batch=cal["score_batch"], t_plan_s=cal["t_plan_s"])
    if not scoring:  # the uniform rule never scores: a refresh epoch costs what a reuse epoch does
        costs["refresh"] = costs["reuse"]
    kinds = budget.epoch_kinds(epochs, warmup_epochs, int(cal["eta"]))
    return {**budget.plan_epochs(costs, kinds, cal["t_max_s"]), "epoch_cost_s": costs}


def method_plan(method: str, cal: dict, *, n_full: int, warmup_epochs: int, epochs: int,
                below_mean_fraction: float | None = None, controls: dict | None = None) -> dict:
    """What ``method`` trains in this cell: which subset ("darel", "random", "full"), the
    online rule, the planned epochs and the predicted time, and the method's own settings.

    ``cal`` is the cell's calibration.json; ``n_full`` the training set size; ``epochs``
    and ``warmup_epochs`` the protocol's; ``below_mean_fraction`` (InfoBatch) the share of
    the offline scorer's losses below their mean; ``controls`` the params' controls section.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    controls = controls or {}
    k = cal["seconds_per_probe_second"]
    t_max = cal["t_max_s"]
    n_kept = int(cal["n_kept"])
    plan: dict = {"method": method, "subset": SUBSET_OF[method], "batch": int(cal["batch"]),
                  "score_batch": int(cal["score_batch"]), "t_max_s": t_max}
    if method in ("darel", "random-offline"):
        plan.update(rule="histogram", A=cal["A"], eta=int(cal["eta"]),
                    **_online_plan(cal, n_kept=n_kept, warmup_epochs=warmup_epochs, epochs=epochs, scoring=True))
    elif method in ("uniform-online", "random"):
        plan.update(rule="uniform", A=cal["A"], eta=int(cal["eta"]),
                    **_online_plan(cal, n_kept=n_kept, warmup_epochs=warmup_epochs, epochs=epochs, scoring=False))
    elif method == "short-schedule":
        epoch_s = k * cal["t_b_s"] * math.ceil(n_full / cal["batch"])
        planned = epochs_that_fit(epoch_s, t_max, epochs)
        schedule = controls.get("short_schedule", {}).get("schedule", "linear")
        plan.update(rule=None, planned_epochs=planned, predicted_time_s=planned * epoch_s,
                    predicted_adherence=planned * epoch_s / t_max, plan_exceeds_budget=epoch_s > t_max,
                    epoch_cost_s={"full": epoch_s}, schedule=schedule,
                    schedule_steps=planned * math.ceil(n_full / cal["batch"]))
    elif method == "selective-backprop":
        A = cal["A"]
        step_s = k * cal["t_b_s"]
        score_s = k * cal["t_score_s"] * math.ceil(n_full / cal["score_batch"])
        costs = {"warmup": step_s * math.ceil(n_full / cal["batch"]),
                 "select": score_s + step_s * math.floor(A * n_full / cal["batch"])}
        kinds = ["warmup" if e < warmup_epochs else "select" for e in range(epochs)]
        plan.update(rule=None, A=A, beta=beta_for_keep_fraction(A), candidate_batch=int(cal["score_batch"]),
                    **budget.plan_epochs(costs, kinds, t_max), epoch_cost_s=costs)
    else:  # infobatch
        if below_mean_fraction is None or not 0.0 <= below_mean_fraction <= 1.0:
            raise ValueError(f"infobatch needs the share of below-mean losses in [0, 1], got {below_mean_fraction!r}")
        settings = controls.get("infobatch", {})
        full_epoch_s = k * cal["t_b_s"] * math.ceil(n_full / cal["batch"])
        fit = prune_fraction_for_budget(full_epoch_s=full_epoch_s, n_samples=n_full, batch=int(cal["batch"]),
                                        below_fraction=below_mean_fraction, epochs=epochs, t_max_s=t_max,
                                        anneal_fraction=settings.get("anneal_fraction", 0.125),
                                        r_max=settings.get("r_max", 0.9))
        plan.update(rule=None, below_mean_fraction=below_mean_fraction, epoch_cost_s={"full": full_epoch_s}, **fit)
    return plan
