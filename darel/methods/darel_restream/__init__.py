"""darel-restream: the study's negative control. DAREL exactly (Algorithm 2's subset, the
cell's A and eta, Algorithm 3's histogram rule, the same seed for the model's
initialisation and the augmentation), with one difference: its sampler draws from
another random stream. That stream gives each epoch's order (warm-up epochs included:
the sampler shuffles every epoch) and each online epoch's keep draws, so a restream
trains another order and another draw of the same keep law; nothing else moves.
DAREL minus darel-restream has mean zero by construction; a study that calls it "better"
or "worse" sees differences that are not there (darel.study.validation). The difference
it measures is therefore the run-to-run spread of the sampler's stream (order and keep
draws together), not of the keep draws alone.

Several restreams per seed (``controls.darel_restream.streams``: K stream constants).
Each constant is one more training per seed and budget, identical to the others but for
the constant mixed with the run's seed into the sampler's stream (so each restream has
its own epoch orders and keep draws, and nothing else differs). The first run is named
``darel-restream``, the k-th ``darel-restream-<k>``; a job depends on its own constant
only, so adding, dropping or changing a stream re-plans that stream's jobs alone. The
first constant, 0x52455354, is the one every study before the list trained; a job of
that constant keeps the parameters it had then (no key for it), so those runs stand.
With K restreams the study tests DAREL minus the mean of its K restreams (judged) and,
as the chance reference, the first restream minus the mean of the others (reported): a
difference of DAREL's while the restreams agree among themselves says DAREL's own stream
is special (e.g. correlated with something else the run's seed draws); both alike say
the difference is the streams' chance spread (darel.study.validation_checks). K = 1 is
the one-restream control as it always was."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from darel.methods import register
from darel.methods.base import SCORER_SUBSET
from darel.methods.darel import OnlineMethod, OnlinePlan, OnlineSettings

# Mixed with the run's seed: the control's sampler stream is unrelated to DAREL's. The first
# restream's constant since the control exists.
RESTREAM = 0x52455354
MAX_STREAMS = 16  # each stream is one more training per seed and budget


@dataclass(frozen=True)
class RestreamSettings(OnlineSettings):
    """Algorithm 3's settings with the sampler's stream moved away from the run's seed."""

    stream: int = RESTREAM

    def sampler_seed(self, run_seed: int) -> int:
        return int(np.random.SeedSequence([int(run_seed), int(self.stream)]).generate_state(1, dtype=np.uint64)[0]
                   >> 1)


@dataclass(frozen=True)
class RestreamPlan(OnlinePlan):
    """DAREL's plan, with the stream constant the run's sampler mixes with its seed."""

    stream: int = RESTREAM


@register
class DarelRestream(OnlineMethod):
    name = "darel-restream"
    subset = SCORER_SUBSET
    order = 90
    selection_type = RestreamSettings
    plan_type = RestreamPlan
    settings_path = ("controls", "darel_restream")
    settings_schema = {"streams": {"type": "array", "minItems": 1, "maxItems": MAX_STREAMS, "uniqueItems": True,
                                   "items": {"type": "integer", "minimum": 0, "maximum": 2**63 - 1}}}

    def streams(self, params: dict) -> list[int]:
        """The stream constants in ``params``: the whole params' list, a job's slice's one
        stream, or the first restream's constant where neither is set."""
        found = self.settings(params)
        if "stream" in found:
            return [int(found["stream"])]
        return [int(s) for s in found.get("streams", [RESTREAM])]

    def runs(self, params: dict) -> list[str]:
        count = len(self.streams(params))
        return [self.name] + [f"{self.name}-{k}" for k in range(2, count + 1)]

    def run_index(self, run: str) -> int | None:
        if run == self.name:
            return 1
        prefix, _, index = run.rpartition("-")
        if prefix == self.name and index.isascii() and index.isdigit() and not index.startswith("0") \
                and int(index) >= 2:
            return int(index)
        return None

    def stream_of(self, params: dict, run: str) -> int:
        """The stream constant of ``run`` (one of ``runs``) under the whole ``params``."""
        index = self.run_index(run)
        if index is None:
            raise ValueError(f"{run!r} is no run of {self.name} (its runs: {self.name}, {self.name}-2, ...)")
        streams = self.streams(params)
        if index > len(streams):
            raise ValueError(f"run {run} is restream {index}, but {'.'.join(self.settings_path)}.streams lists "
                             f"{len(streams)} stream(s)")
        return streams[index - 1]

    def own_settings(self, params: dict) -> dict:
        """The one stream of the run these parameters plan (a job's slice; the whole params
        plan the first restream)."""
        return {"stream": self.streams(params)[0]}

    def settings_slice(self, params: dict, run: str | None = None) -> dict:
        stream = self.stream_of(params, run or self.name)
        # The first constant's jobs keep the parameters they had before streams were listed.
        return {} if stream == RESTREAM else {"controls": {"darel_restream": {"stream": stream}}}

    def own_plan_fields(self, settings: dict | None) -> dict:
        return {"stream": int((settings or {}).get("stream", RESTREAM))}

    def run_fields(self, plan: RestreamPlan, settings: Any) -> dict:
        return {"selection": replace(self.selection(plan.A, plan.eta, settings), stream=int(plan.stream))}
