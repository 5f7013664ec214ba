"""uniform-online: Algorithm 2's subset, each epoch's samples kept with probability A
whatever their loss (Algorithm 3's uniform rule): what the loss histogram adds."""

from __future__ import annotations

from darel.methods import register
from darel.methods.base import SCORER_SUBSET
from darel.methods.darel import OnlineMethod


@register
class UniformOnline(OnlineMethod):
    name = "uniform-online"
    subset = SCORER_SUBSET
    rule = "uniform"
    order = 30
    stage_alone = "offline"
