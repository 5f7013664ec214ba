"""darel-restream: the study's negative control. DAREL exactly (Algorithm 2's subset, the
cell's A and eta, Algorithm 3's histogram rule, the same seed for the model's
initialisation and the augmentation), with one difference: its sampler draws from
another random stream. That stream gives each epoch's order (warm-up epochs included:
the sampler shuffles every epoch) and each online epoch's keep draws, so a restream
trains another order and another draw of the same keep law; nothing else moves.
DAREL minus darel-restream has mean zero by construction; a study that calls it "better"
or "worse" sees differences that are not there (darel.study.validation). The difference
it measures is therefore the run-to-run spread of the sampler's stream (order and keep
draws together), not of the keep draws alone."""

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
