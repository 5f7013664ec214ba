"""selective-backprop: all data; each candidate chunk's no-grad losses choose the samples
to back-propagate, a share 1 / (beta + 1) of them.

Source (Jiang et al. 2019, "Accelerating deep learning by focusing on the
biggest losers").

Method card. Every sample is forwarded every epoch, but only some are back-propagated:
a sample is chosen with probability CDF(loss) ** beta, where CDF is the share of a
history of recent losses at or below its loss (a high percentile: a "big loser") and
beta sets the selectivity. With losses drawn from the history's own distribution the
percentile is uniform and the expected chosen share is 1 / (beta + 1). Chosen samples
queue up and leave in training batches of exactly the calibrated b, as DAREL's online
stage does.

Its own settings (``controls.selective_backprop``), its authors' defaults: beta = 3 (their
experiment runner's probability strategy "relative-cubed": a quarter of the samples
back-propagated) and a history of the last 1024 losses. They are not derived from
DAREL's A: at equal budget each method gets the epochs its own costs fit into t_max.

Decided where the paper is silent or differs from this setting:
* each candidate chunk keeps exactly its share of the planned 1 / (beta + 1) of the
  samples (rounded so that an epoch keeps floor(n / (beta + 1))), drawn without
  replacement with weights CDF(loss) ** beta. The paper draws every sample on its own
  with probability CDF(loss) ** beta: the same preference for big losers, but the share
  it keeps is 1 / (beta + 1) only when the percentiles are uniform, and in training runs
  here it kept 7-10 % fewer samples than planned, so a budget comparison would have
  credited it with time it did not spend;
* the candidate forward is a no-grad pass in eval mode without augmentation, in chunks
  of the cell's scoring batch (the same metered pass as DAREL's scoring), and the chosen
  samples are then trained with the normal augmented step;
* the history holds the last ``history_size`` candidate losses; each chunk is pushed
  before its percentiles are read (as the authors' code appends a batch's losses before
  it ranks them);
* the percentile counts the history's losses at or below a sample's loss; the authors'
  code counts those strictly below (so a sample tied with history losses is chosen a
  little more often here; with float losses ties are rare);
* the first ``warmup_epochs`` epochs (DAREL's omega) train on everything; the authors
  prime with every sample until about one epoch's worth of images has been trained (the
  quick profile's omega is 1: the same; the paper profile's is 10);
* a sample chosen while still waiting from the previous epoch is trained once.
Kept indices are formed once per candidate chunk, so this method synchronises with the
host once per chunk (its selection depends on the current model; DAREL's does not).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from darel.bounds import MAX_HISTORY, int_range, num_range
from darel.methods import register
from darel.methods.base import FULL_DATA, Method, MethodPlan, Selection, full_steps, step_seconds


@dataclass(frozen=True)
class SelectiveBackpropSettings(Selection):
    """Selectivity beta, candidates in chunks of the scoring batch."""

    beta: float
    warmup_epochs: int
    history_size: int

    def policy(self, run, n_samples: int, device: Any):
        from darel.methods.selective_backprop.policy import SelectiveBackprop

        return SelectiveBackprop(n_samples=n_samples, batch_size=run.batch, beta=self.beta,
                                 candidate_batch=run.score_batch or run.eval_batch, history_size=self.history_size,
                                 warmup_epochs=self.warmup_epochs, seed=run.seed, device=device)


@dataclass(frozen=True)
class SelectiveBackpropPlan(MethodPlan):
    beta: float
    keep_fraction: float
    history_size: int
    candidate_batch: int


@register
class SelectiveBackpropMethod(Method):
    name = "selective-backprop"
    subset = FULL_DATA
    order = 60
    plan_type = SelectiveBackpropPlan
    selection_type = SelectiveBackpropSettings
    settings_path = ("controls", "selective_backprop")
    settings_schema = {"beta": num_range(0, 100), "history_size": int_range(1, MAX_HISTORY)}

    def plan(self, cal: dict, *, n_full: int, warmup_epochs: int, epochs: int,
             settings: dict) -> SelectiveBackpropPlan:
        from darel import budget
        from darel.methods.selective_backprop.policy import keep_fraction_for_beta

        beta = float(settings["beta"])
        share = keep_fraction_for_beta(beta)
        step_s = step_seconds(cal)
        score_s = cal["seconds_per_probe_second"] * cal["t_score_s"] * math.ceil(n_full / cal["score_batch"])
        costs = {"warmup": step_s * full_steps(n_full, cal),
                 "select": score_s + step_s * math.floor(share * n_full / int(cal["batch"]))}
        kinds = ["warmup" if e < warmup_epochs else "select" for e in range(epochs)]
        fitted = budget.plan_epochs(costs, kinds, cal["t_max_s"])
        return self.finish(cal, fitted.pop("epoch_kinds"), rule=None, beta=beta, keep_fraction=share,
                           history_size=int(settings["history_size"]), candidate_batch=int(cal["score_batch"]),
                           **fitted, epoch_cost_s=costs, epoch_samples={"warmup": float(n_full), "select": share * n_full})

    def run_fields(self, plan: SelectiveBackpropPlan, settings) -> dict:
        return {"selection": SelectiveBackpropSettings(beta=plan.beta, warmup_epochs=settings.protocol.warmup_epochs,
                                                       history_size=int(plan.history_size))}
