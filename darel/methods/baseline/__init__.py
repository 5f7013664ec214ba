"""baseline: Table 1's full run (every sample, every epoch, the protocol's schedule); its
model is the offline scorer of Algorithm 2 and its time and memory are the T and M of
every budget. The training loop runs it as Algorithm 3 with every epoch a warm-up epoch,
so the baseline and the DAREL cells time exactly the same code path."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from darel.methods import register
from darel.methods.base import FULL_DATA, Method, Selection


@dataclass(frozen=True)
class AllData(Selection):
    """No selection: every epoch trains every sample in a fresh random order."""

    def policy(self, run, n_samples: int, device: Any):
        from darel.methods.policy import OnlinePolicy
        from darel.sampler import OnlineSampler

        return OnlinePolicy(OnlineSampler(n_samples=n_samples, batch_size=run.batch, keep_fraction=1.0, eta=1,
                                          warmup_epochs=run.epochs, history_size=1, bins=2, seed=run.seed,
                                          device=device))


@register
class Baseline(Method):
    name = "baseline"
    subset = FULL_DATA
    study = False
    order = 0
    selection_type = AllData
