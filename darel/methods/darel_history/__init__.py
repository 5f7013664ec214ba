"""darel-history: DAREL with another length of its loss history (gamma), a secondary
analysis of the study's primary comparison.

Method card. Algorithm 3 keeps each sample with a probability shaped by the histogram
of the last gamma losses. The paper's default list gives gamma = 120 (params.yaml
``darel.history_size``); studies 1-5 of this project ran with 4096. This method trains
DAREL exactly (Algorithm 2's subset, the cell's A and eta, the same time plan, the same
seed and sampler stream) with the history length of ``controls.darel_history``, so the
study can say whether its verdict depends on gamma. What changes: with a long history the
histogram follows the whole epoch's losses; with 120 it follows the last few batches, and
a loss in a bin the short window left empty is kept with probability 0 (docs/deviations.md,
Algorithm 3).
"""

from __future__ import annotations

from darel.bounds import MAX_HISTORY, int_range
from darel.methods import register
from darel.methods.darel import DarelVariant


@register
class DarelHistory(DarelVariant):
    name = "darel-history"
    order = 12
    settings_path = ("controls", "darel_history")
    settings_schema = {"history_size": int_range(1, MAX_HISTORY)}
