"""darel: Algorithm 2's offline subset (the scorer's loss-ranked alpha of every class,
darel.selection) trained with Algorithm 3's online selection (darel.sampler: keep a
share A of each epoch's samples with a probability shaped by a histogram of recent
losses, the losses refreshed every eta epochs after omega warm-up epochs).

Its settings are params.yaml's ``darel`` section; its plan is the cost model's
(darel.budget): warm-up epochs train the whole subset, a refresh epoch scores it first,
every online epoch trains about A of it (``online_epoch_plan``: the calibration stage
predicts with it, a Table 1 cell and a study plan with it through ``plan``).

``OnlineMethod`` is the family of Algorithm 3 runs (the study's random-offline,
uniform-online and random controls vary its training set and its rule).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from darel.bounds import MAX_BINS, MAX_HISTORY, int_range
from darel.methods import register
from darel.methods.base import SCORER_SUBSET, Method, MethodPlan, Selection


@dataclass(frozen=True)
class OnlineSettings(Selection):
    """Algorithm 3's parameters of one run."""

    keep_fraction: float  # A
    eta: int
    warmup_epochs: int  # omega
    history_size: int  # gamma
    bins: int
    rule: str = "histogram"  # "uniform": keep with probability A whatever the loss (a control)
    floor: float = 0.0  # darel.sampler.OnlineSampler's floor (0: Algorithm 3; darel-floor sets it)

    def sampler_seed(self, run_seed: int) -> int:
        """The seed of the sampler's random stream (the run's own seed)."""
        return int(run_seed)

    def policy(self, run, n_samples: int, device: Any):
        from darel.methods.policy import OnlinePolicy
        from darel.sampler import OnlineSampler

        return OnlinePolicy(OnlineSampler(
            n_samples=n_samples, batch_size=run.batch, keep_fraction=self.keep_fraction, eta=self.eta,
            warmup_epochs=self.warmup_epochs, history_size=self.history_size, bins=self.bins,
            seed=self.sampler_seed(run.seed), device=device, rule=self.rule, floor=self.floor))


@dataclass(frozen=True)
class OnlinePlan(MethodPlan):
    A: float
    eta: int


def online_epoch_plan(cal: dict, *, n_kept: int, warmup_epochs: int, epochs: int, scoring: bool = True) -> dict:
    """The cost model's plan of an Algorithm 3 run on ``n_kept`` samples: each kind of
    epoch's cost (warm-up, refresh: scored first, reuse), the epochs that fit t_max
    (darel.budget.plan_epochs: planned_epochs, predicted_time_s, predicted_adherence,
    plan_exceeds_budget, epoch_kinds) and the samples each kind trains. ``scoring``
    False: the uniform rule, whose refresh epochs score nothing."""
    from darel import budget

    costs = budget.online_epoch_costs(
        seconds_per_probe_second=cal["seconds_per_probe_second"], t_b_s=cal["t_b_s"], batch=cal["batch"],
        n_kept=n_kept, keep_fraction=cal["A"], t_score_s=cal["t_score_s"] if scoring else 1e-300,
        score_batch=cal["score_batch"], t_plan_s=cal["t_plan_s"])
    if not scoring:  # the uniform rule never scores: a refresh epoch costs what a reuse epoch does
        costs["refresh"] = costs["reuse"]
    kinds = budget.epoch_kinds(epochs, warmup_epochs, int(cal["eta"]))
    fitted = budget.plan_epochs(costs, kinds, cal["t_max_s"])
    selected = cal["A"] * n_kept
    return {**fitted, "epoch_cost_s": costs,
            "epoch_samples": {"warmup": float(n_kept), "refresh": selected, "reuse": selected}}


class OnlineMethod(Method):
    """Algorithm 3 at the cell's A and eta on the method's training set, by its rule."""

    rule = "histogram"
    plan_type = OnlinePlan
    selection_type = OnlineSettings

    def make_selection(self, **settings: Any) -> OnlineSettings:
        return self.selection_type(**settings, rule=self.rule)

    def plan(self, cal: dict, *, n_full: int, warmup_epochs: int, epochs: int, settings: dict | None,
             over_budget: bool = False) -> OnlinePlan:
        """The cost model's plan (``online_epoch_plan``); ``over_budget``: a Table 1 cell's,
        trained even when not one epoch fits t_max (its calibration made the same plan)."""
        fitted = online_epoch_plan(cal, n_kept=int(cal["n_kept"]), warmup_epochs=warmup_epochs, epochs=epochs,
                                   scoring=self.rule == "histogram")
        kinds = fitted.pop("epoch_kinds")
        return self.finish(cal, kinds, over_budget=over_budget, rule=self.rule, A=cal["A"], eta=int(cal["eta"]),
                           **fitted, **self.own_plan_fields(settings))

    def own_plan_fields(self, settings: dict | None) -> dict:
        """What this method's own settings add to its plan (a variant's; none for DAREL)."""
        return {}

    def selection(self, keep_fraction: float, eta: int, settings: Any) -> OnlineSettings:
        return self.selection_type(keep_fraction=keep_fraction, eta=int(eta),
                                   warmup_epochs=settings.protocol.warmup_epochs, history_size=settings.history_size,
                                   bins=settings.bins, rule=self.rule)

    def run_fields(self, plan: OnlinePlan, settings: Any) -> dict:
        return {"selection": self.selection(plan.A, plan.eta, settings)}


@register
class Darel(OnlineMethod):
    name = "darel"
    subset = SCORER_SUBSET
    order = 10
    settings_path = ("darel",)
    settings_schema = {
        "mode": {"enum": ["easy", "hard"]},
        "alpha_default": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "A_min": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "A_max": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "history_size": int_range(1, MAX_HISTORY),
        "bins": int_range(2, MAX_BINS),
    }


@dataclass(frozen=True)
class VariantPlan(OnlinePlan):
    """DAREL's plan with the Algorithm 3 settings a variant sets itself (None: DAREL's own)."""

    history_size: int | None = None
    bins: int | None = None
    floor: float = 0.0


class DarelVariant(OnlineMethod):
    """DAREL with some of Algorithm 3's settings its own (a secondary analysis or a variant
    of the study): its training set (Algorithm 2's subset), A, eta and time plan are
    DAREL's, its sampler's seed too (paired draws); the settings its ``settings_schema``
    names replace the ``darel`` section's. A variant is a folder of darel/methods
    declaring ``name``, ``settings_path`` and ``settings_schema`` only."""

    subset = SCORER_SUBSET
    plan_type = VariantPlan
    variant_keys = ("history_size", "bins", "floor")

    def own_plan_fields(self, settings: dict | None) -> dict:
        if not settings:
            raise ValueError(f"method {self.name}: no settings at {'.'.join(self.settings_path or ())} of params.yaml")
        return {key: settings[key] for key in self.variant_keys if key in settings}

    def run_fields(self, plan: VariantPlan, settings: Any) -> dict:
        chosen = self.selection(plan.A, plan.eta, settings)
        own = {key: getattr(plan, key) for key in ("history_size", "bins") if getattr(plan, key) is not None}
        return {"selection": replace(chosen, **own, floor=float(plan.floor))}

