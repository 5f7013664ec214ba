"""darel-bins: DAREL with another number of histogram bins, a secondary analysis of the
study's primary comparison.

Method card. The paper does not give the histogram's bin count; the project uses 20
(params.yaml ``darel.bins``). This method trains DAREL exactly (Algorithm 2's subset, the
cell's A and eta, the same time plan, the same seed and sampler stream) with the bin count
of ``controls.darel_bins``, so the study can say whether its verdict depends on that
choice. Fewer bins flatten the histogram (the keep probabilities move toward A for every
loss); more bins sharpen it (with a short history more bins are empty, and their losses
are dropped).
"""

from __future__ import annotations

from darel.bounds import MAX_BINS, int_range
from darel.methods import register
from darel.methods.darel import DarelVariant


@register
class DarelBins(DarelVariant):
    name = "darel-bins"
    order = 14
    settings_path = ("controls", "darel_bins")
    settings_schema = {"bins": int_range(2, MAX_BINS)}
