"""ids+adonis: Table 1's comparison row, the paper's previous state of the art: IDS's
offline subset (darel.ids: per class, by the distance to K-Means prototypes in the
scorer's feature space) trained with ADONIS's online stage (Algorithm 3 at fixed A and
eta, no budget). Its settings are params.yaml's ``comparisons.ids_adonis``; the
ids_subset stage writes them with the subset as the row's settings.json."""

from __future__ import annotations

from darel.bounds import MAX_EPOCHS, int_range
from darel.methods import register
from darel.methods.darel import Darel


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
