"""darel-floor: DAREL with a keep floor, a variant beyond the paper that keeps its budget
planning but does not starve the loss tail.

Method card. Algorithm 3 prefers the most frequent losses: a loss near the histogram's
mode is kept with a probability near 1, a loss in the sparse tail (the rare classes, the
hard and the mislabelled samples, whose losses stay high) with a probability near 0, so a
run can go epochs without training some samples at all (the underfitting studies found
DAREL trained a third of the rare classes' share). This variant mixes Algorithm 3's keep
probability p with the uniform rule: every sample is kept with probability
``floor * A + (1 - floor) * p`` (``controls.darel_floor.floor``). The mean keep share of each
chunk stays A, so the cost model, the calibration and the time plan are DAREL's unchanged;
no sample falls below ``floor * A``. floor = 0 is DAREL, floor = 1 is uniform-online.

Everything else is DAREL's: Algorithm 2's subset, the cell's A and eta, the seed and the
sampler stream (paired draws), the history and bins of the ``darel`` section. It is a
study method (a secondary comparison against random and against DAREL); Table 1's rows are
the paper's DAREL only.
"""

from __future__ import annotations

from darel.bounds import num_range
from darel.methods import register
from darel.methods.darel import DarelVariant


@register
class DarelFloor(DarelVariant):
    name = "darel-floor"
    order = 16
    settings_path = ("controls", "darel_floor")
    settings_schema = {"floor": num_range(0, 1)}
