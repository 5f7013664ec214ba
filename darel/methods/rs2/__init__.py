"""rs2: all data, walked in random permutations: every epoch trains the next fresh random
share of it.

Source (Okanovic et al. 2023, "Repeated Random Sampling for Minimizing the Time-to-Accuracy
of Learning"): every epoch trains on a fresh random subset of the data, drawn without
replacement across epochs.

Method card. The data set is walked in random permutations: each epoch takes the next
``round(r n)`` samples of the current permutation, and a new permutation starts when one
is used up, so every sample is seen once before any is seen twice. The authors show
that this simple random baseline beats most static data-pruning methods at the same
time-to-accuracy budget.

Decided where the paper is silent, for this setting:
* the ratio r (``controls.rs2.ratio``): ``auto`` (default) keeps the protocol's number of
  epochs and takes the largest r whose planned time fits t_max at the cell's calibrated
  batch (each epoch ceil(r n / b) steps at the calibrated step cost); a number fixes r
  and the epochs are the most that fit;
* an epoch that crosses the end of a permutation takes the rest of it and the start of
  the next, so a sample may appear twice in that epoch. The authors' sampler differs: it
  wraps within the one permutation, so no sample repeats inside an epoch (kept here: the
  count per epoch is the plan's either way, and the repeats are at most
  round(r n) - (samples left in the permutation) per boundary epoch);
* batches of exactly the calibrated b, the last one of an epoch smaller, in the
  permutation's order (it is random already).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from darel.methods import register
from darel.methods.base import FULL_DATA, Method, MethodPlan, Selection, step_seconds


@dataclass(frozen=True)
class RS2Settings(Selection):
    """A fresh random share ``ratio`` of the data every epoch."""

    ratio: float

    def policy(self, run, n_samples: int, device: Any):
        from darel.methods.rs2.policy import RandomSubsetsPerEpoch

        return RandomSubsetsPerEpoch(n_samples=n_samples, batch_size=run.batch, ratio=self.ratio, seed=run.seed,
                                     device=device)


@dataclass(frozen=True)
class RS2Plan(MethodPlan):
    ratio: float


@register
class RS2(Method):
    name = "rs2"
    subset = FULL_DATA
    order = 80
    plan_type = RS2Plan
    selection_type = RS2Settings
    settings_path = ("controls", "rs2")
    settings_schema = {"ratio": {"oneOf": [{"const": "auto"},
                                           {"type": "number", "exclusiveMinimum": 0, "maximum": 1}]}}

    def plan(self, cal: dict, *, n_full: int, warmup_epochs: int, epochs: int, settings: dict) -> RS2Plan:
        step_s, batch, t_max = step_seconds(cal), int(cal["batch"]), cal["t_max_s"]
        planned = None  # a fixed ratio: the most epochs that fit
        if settings["ratio"] == "auto":
            from darel.methods.rs2.policy import ratio_for_budget

            ratio, planned = ratio_for_budget(step_s=step_s, n_samples=n_full, batch=batch, epochs=epochs,
                                              t_max_s=t_max), epochs
            while planned > 1 and planned * math.ceil(max(1, round(ratio * n_full)) / batch) * step_s > t_max:
                planned -= 1
        else:
            ratio = float(settings["ratio"])
        per_epoch = max(1, round(ratio * n_full))
        return self.fixed_epochs(cal, kind="subset", epoch_s=math.ceil(per_epoch / batch) * step_s,
                                 samples=per_epoch, epochs=epochs, planned=planned, ratio=ratio)

    def run_fields(self, plan: RS2Plan, settings) -> dict:
        return {"selection": RS2Settings(ratio=float(plan.ratio))}
