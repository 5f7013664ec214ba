"""darel-restream: the study's negative control. DAREL exactly (Algorithm 2's subset, the
cell's A and eta, Algorithm 3's histogram rule, the same seed for the model's
initialisation, the data order and the augmentation), with one difference: its online
sampler draws from another random stream, so its kept samples are another draw of the
same law. DAREL minus darel-restream has mean zero by construction; a study that calls it
"better" or "worse" sees differences that are not there (darel.study.validation)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from darel.methods import register
from darel.methods.base import SCORER_SUBSET
from darel.methods.darel import OnlineMethod, OnlineSettings

# Mixed with the run's seed: the control's sampler stream is unrelated to DAREL's.
RESTREAM = 0x52455354


@dataclass(frozen=True)
class RestreamSettings(OnlineSettings):
    """Algorithm 3's settings with the sampler's stream moved away from the run's seed."""

    stream: int = RESTREAM

    def sampler_seed(self, run_seed: int) -> int:
        return int(np.random.SeedSequence([int(run_seed), int(self.stream)]).generate_state(1, dtype=np.uint64)[0]
                   >> 1)


@register
class DarelRestream(OnlineMethod):
    name = "darel-restream"
    subset = SCORER_SUBSET
    order = 90
    selection_type = RestreamSettings
