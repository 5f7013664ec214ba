"""random-offline: Algorithm 3 on a random alpha of every class (darel.controls.random_subset)
instead of Algorithm 2's loss-ranked one: what ranking by the scorer's loss adds."""

from __future__ import annotations

from darel.methods import register
from darel.methods.darel import OnlineMethod


def random_per_class_subset(labels, alpha: float, seed: int):
    """The "random" training set: ceil(alpha * n_c) random samples of every class c."""
    from darel.controls.random_subset import random_per_class

    return random_per_class(labels, alpha, seed=seed)


@register
class RandomOffline(OnlineMethod):
    name = "random-offline"
    subset = "random"
    order = 20

    def build_subset(self, labels, alpha: float, seed: int):
        return random_per_class_subset(labels, alpha, seed)
