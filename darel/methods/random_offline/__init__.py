"""random-offline: Algorithm 3 on a random alpha of every class (darel.methods.subsets)
instead of Algorithm 2's loss-ranked one: what ranking by the scorer's loss adds.

Same class counts as DAREL's offline subset (ceil(alpha * n_c) per class,
alpha from the cell's calibration), chosen uniformly at random without replacement,
seeded by (seed, class) so that a seed reproduces its subset and another seed gives
another one. It isolates what ranking by the scorer's loss adds over keeping the same
number of samples per class at random (DeepCore's observation that random selection is a
strong baseline).
"""

from __future__ import annotations

from darel.methods import register
from darel.methods.darel import OnlineMethod
from darel.methods.subsets import random_per_class


@register
class RandomOffline(OnlineMethod):
    name = "random-offline"
    subset = "random"
    order = 20
    stage_alone = "online"

    def build_subset(self, labels, alpha: float, seed: int):
        return random_per_class(labels, alpha, seed=seed)
