"""random: no loss anywhere: a random alpha of every class, each epoch's samples kept with
probability A (the study's simplest control of the same class counts, batch and budget)."""

from __future__ import annotations

from darel.methods import register
from darel.methods.darel import OnlineMethod
from darel.methods.subsets import random_per_class


@register
class Random(OnlineMethod):
    name = "random"
    subset = "random"
    rule = "uniform"
    order = 40

    def build_subset(self, labels, alpha: float, seed: int):
        return random_per_class(labels, alpha, seed=seed)
