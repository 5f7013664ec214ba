"""ids+adonis: Table 1's comparison row, the paper's previous state of the art: IDS's
offline subset (darel.ids: per class, by the distance to K-Means prototypes in the
scorer's feature space) trained with ADONIS's online stage (Algorithm 3 at fixed A and
eta, no budget). Its settings are params.yaml's ``comparisons.ids_adonis``; the
ids_subset stage writes them with the subset as the row's plan.json (A, eta, the
baseline's batch, the kept count), from which ``plan`` makes the typed plan: the
protocol's epochs, Algorithm 3's kinds of epoch, no budget, no cost model."""

from __future__ import annotations

from darel.bounds import MAX_EPOCHS, int_range
from darel.methods import register
from darel.methods.darel import Darel, OnlinePlan


@register
class IdsAdonis(Darel):
    name = "ids+adonis"
    subset = "ids"
    study = False
    order = 90
    settings_path = ("comparisons", "ids_adonis")
    settings_schema = {
        "model": {"type": "string"},  # a model of table1 (checked in darel.config.schema.validate)
        "keep_ratio": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "clusters_per_class": int_range(1, 10_000),
        "distance": {"enum": ["cosine", "euclidean"]},
        "keep": {"enum": ["far", "near"]},
        "A": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "eta": int_range(1, MAX_EPOCHS),
    }

    @property
    def uses_scorer(self) -> bool:
        return True  # its features come from the scorer

    def plan(self, cal: dict, *, n_full: int, warmup_epochs: int, epochs: int, settings: dict | None,
             over_budget: bool = False) -> OnlinePlan:
        """Every protocol epoch at the fixed A and eta (``cal``: the row's plan.json); no
        budget, so no time is predicted and no scoring batch calibrated."""
        from darel import budget

        n_kept, A, eta = int(cal["n_kept"]), cal["A"], int(cal["eta"])
        kinds = budget.epoch_kinds(epochs, warmup_epochs, eta)
        samples = {"warmup": float(n_kept), "refresh": A * n_kept, "reuse": A * n_kept}
        return self.plan_type(method=self.name, subset=self.subset, uses_scorer=self.uses_scorer,
                              batch=int(cal["batch"]), score_batch=None, t_max_s=None, rule=self.rule,
                              planned_epochs=epochs, predicted_time_s=None, predicted_adherence=None,
                              plan_exceeds_budget=False, epoch_kinds=kinds, epoch_cost_s={}, epoch_samples=samples,
                              planned_samples=float(sum(samples[kind] for kind in kinds)), A=A, eta=eta)
