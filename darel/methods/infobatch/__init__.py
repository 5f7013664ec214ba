"""infobatch: all data; each epoch a planned number of below-mean-loss samples is pruned
at random and the kept ones re-weighted, full data in the first and the annealing
epochs.

Source (Qin et al., ICLR 2024, "InfoBatch: lossless training speed-up by unbiased
dynamic data pruning").

Method card. Every sample keeps a score, the loss of its last training forward. Each
epoch, some of the samples scoring below the mean ("well learnt") are pruned at random;
the kept below-mean samples have their loss multiplied by 1 / (1 - r), r the share of the
below-mean samples pruned, so the expected gradient over the epoch is the full data
set's. In the last 12.5 % of the epochs (annealing) nothing is pruned. Pruned samples
keep their old score.

Against the authors' code (NUS-HPC-AI-Lab/InfoBatch; docs/deviations.md): it starts every
score at the same value, so its first epoch prunes nothing either; a pruned epoch keeps
exactly int((1 - r) x below-mean count) of the below-mean samples, drawn without
replacement, at a fixed r (so the count dropped follows the below-mean count); it stops
pruning for the epochs after delta x E (delta 0.875: with E = 40 the last 4 epochs train
on everything, where ``anneal_start`` here gives the last ceil(0.125 E) = 5).

Decided where the paper is silent, for this setting:
* the first epoch trains on everything (no scores yet), like the annealing epochs;
* the budget fixes how many samples a pruned epoch drops, P (``prune_count_for_budget``:
  the fewest that let the planned epochs fit t_max at the calibrated batch and step
  cost); each pruned epoch then drops exactly P of the below-mean samples, chosen at
  random, so r = P / (below-mean count) follows the share of below-mean samples as it
  is during training and the trained samples are what the plan says. (The authors fix r
  and let the count follow the below-mean count; both drop an exact count without
  replacement. Ours fixes the count so that the time spent is the planned time.)
* annealing: the last ceil(0.125 E) epochs, one more than the authors' rule at E = 40
  (kept: the budget plans count these epochs, and changing the rule changes every
  InfoBatch cell);
* at a study budget most of InfoBatch's saving comes from training fewer epochs at the
  calibrated batch (its planned epochs, ``epochs_planned`` in each cell record), not from
  pruning: it is then largely a shorter schedule with a pruned middle, and its verdicts
  should be read beside short-schedule's (its plans at the quick study pilot's
  calibrations: docs/studies/pilot_quick.md;
  `python -m darel.tools.method_plans` prints them for any build).
  P is planned against ``below_fraction_plan`` (default 0.5) of the samples being below
  the mean and r at most ``r_max``; an epoch with fewer below-mean samples than that
  drops r_max of them and trains more than planned (counted in the run's record);
* no scorer is needed: nothing of the offline scorer enters the plan;
* batches of exactly the calibrated b, the last one of an epoch smaller (as a data
  loader's), in a fresh random order of the kept samples.
Forming the kept set synchronises with the host once per epoch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from darel.methods import register
from darel.methods.base import FULL_DATA, Method, MethodPlan, PlanError, Selection, full_steps, step_seconds


@dataclass(frozen=True)
class InfoBatchSettings(Selection):
    """P below-mean samples dropped per pruned epoch (r <= r_max), full data from
    ``anneal_start_epoch`` on."""

    prune_count: int
    anneal_start_epoch: int
    r_max: float = 0.9

    def policy(self, run, n_samples: int, device: Any):
        from darel.methods.infobatch.policy import InfoBatch

        return InfoBatch(n_samples=n_samples, batch_size=run.batch, prune_count=self.prune_count,
                         anneal_start_epoch=self.anneal_start_epoch, r_max=self.r_max, seed=run.seed, device=device)


@dataclass(frozen=True)
class InfoBatchPlan(MethodPlan):
    r_max: float
    prune_count: int
    prune_fraction_of_data: float
    anneal_start_epoch: int


@register
class InfoBatchMethod(Method):
    name = "infobatch"
    subset = FULL_DATA
    order = 70
    plan_type = InfoBatchPlan
    selection_type = InfoBatchSettings
    settings_path = ("controls", "infobatch")
    settings_schema = {"anneal_fraction": {"type": "number", "minimum": 0, "exclusiveMaximum": 1},
                       "r_max": {"type": "number", "minimum": 0, "exclusiveMaximum": 1},
                       "below_fraction_plan": {"type": "number", "exclusiveMinimum": 0, "maximum": 1}}

    def plan(self, cal: dict, *, n_full: int, warmup_epochs: int, epochs: int, settings: dict) -> InfoBatchPlan:
        from darel.methods.infobatch.policy import prune_count_for_budget

        step_s = step_seconds(cal)
        fit = prune_count_for_budget(step_s=step_s, n_samples=n_full, batch=int(cal["batch"]), epochs=epochs,
                                     t_max_s=cal["t_max_s"], anneal_fraction=settings["anneal_fraction"],
                                     r_max=settings["r_max"], below_fraction_plan=settings["below_fraction_plan"])
        if fit is None:
            raise PlanError(f"method infobatch: no number of epochs and pruned samples fits t_max = "
                            f"{cal['t_max_s']:.4g} s (a full epoch is predicted to take "
                            f"{step_s * full_steps(n_full, cal):.4g} s)")
        kinds = ["full" if e == 0 else "anneal" if e >= fit["anneal_start_epoch"] else "prune"
                 for e in range(fit["planned_epochs"])]
        return self.finish(cal, kinds, rule=None, r_max=settings["r_max"],
                           epoch_cost_s={"full": step_s * full_steps(n_full, cal)}, **fit)

    def run_fields(self, plan: InfoBatchPlan, settings) -> dict:
        return {"selection": InfoBatchSettings(prune_count=int(plan.prune_count),
                                               anneal_start_epoch=int(plan.anneal_start_epoch),
                                               r_max=float(plan.r_max))}
