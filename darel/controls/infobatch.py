"""infobatch (Qin et al., ICLR 2024, "InfoBatch: lossless training speed-up by unbiased
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
  calibrations: docs/studies.md, "The pilot of the quick study";
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

import math
from typing import Callable, Iterator

import torch
from torch import Tensor


def anneal_start(epochs: int, anneal_fraction: float = 0.125) -> int:
    """First epoch (0-based) of the annealing phase: the last ceil(fraction * epochs) epochs."""
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs must be a positive integer, got {epochs!r}")
    if not 0.0 <= anneal_fraction < 1.0:
        raise ValueError(f"anneal_fraction must lie in [0, 1), got {anneal_fraction!r}")
    return epochs - math.ceil(anneal_fraction * epochs)


def prune(scores: Tensor, count: int, generator: torch.Generator, r_max: float = 0.9
          ) -> tuple[Tensor, Tensor, float]:
    """(kept positions, loss weight of each kept sample, r) for one epoch: ``count``
    below-mean samples dropped at random (at most r_max of them), the kept ones among
    them weighted 1 / (1 - r) with r the share of the below-mean samples dropped."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ValueError(f"count must be a non-negative integer, got {count!r}")
    below = torch.nonzero(scores < scores.mean()).reshape(-1)
    dropped_count = min(count, math.floor(r_max * len(below)))
    r = dropped_count / len(below) if len(below) else 0.0
    keep = torch.ones(scores.shape, dtype=torch.bool, device=scores.device)
    if dropped_count:
        order = torch.randperm(len(below), generator=generator, device=scores.device)
        keep[below[order[:dropped_count]]] = False
    kept = torch.nonzero(keep).reshape(-1)
    is_below = torch.zeros(scores.shape, dtype=torch.bool, device=scores.device)
    is_below[below] = True
    weights = torch.where(is_below[kept], 1.0 / (1.0 - r), 1.0).to(torch.float32)
    return kept, weights, r


def prune_count_for_budget(*, step_s: float, n_samples: int, batch: int, epochs: int, t_max_s: float,
                           anneal_fraction: float = 0.125, r_max: float = 0.9,
                           below_fraction_plan: float = 0.5) -> dict | None:
    """The fewest samples P a pruned epoch must drop (and, if needed, fewer epochs) for the
    planned time to fit t_max, with P at most r_max * below_fraction_plan * n; None when no
    plan fits. A full epoch is ceil(n / b) steps of ``step_s``, a pruned one
    ceil((n - P) / b); the first epoch and the annealing epochs are full."""
    full_steps = math.ceil(n_samples / batch)
    limit = math.floor(r_max * below_fraction_plan * n_samples)
    for planned in range(epochs, 0, -1):
        start = anneal_start(planned, anneal_fraction)
        pruned_epochs = max(0, start - 1)
        full_epochs = planned - pruned_epochs
        steps_left = math.floor(t_max_s / step_s * (1 + 1e-9)) - full_epochs * full_steps
        if steps_left < 0:
            continue
        if pruned_epochs == 0:
            return _infobatch_plan(planned, 0, full_epochs * full_steps * step_s, start, t_max_s, n_samples)
        steps = min(full_steps, steps_left // pruned_epochs)
        count = max(0, n_samples - steps * batch)
        if steps >= 1 and count <= limit:
            pruned_steps = math.ceil((n_samples - count) / batch)
            predicted = (full_epochs * full_steps + pruned_epochs * pruned_steps) * step_s
            return _infobatch_plan(planned, count, predicted, start, t_max_s, n_samples)
    return None


def _infobatch_plan(epochs: int, count: int, predicted: float, start: int, t_max_s: float, n_samples: int) -> dict:
    return {"planned_epochs": int(epochs), "prune_count": int(count), "prune_fraction_of_data": count / n_samples,
            "anneal_start_epoch": int(start), "predicted_time_s": float(predicted),
            "predicted_adherence": float(predicted / t_max_s), "plan_exceeds_budget": False,
            "epoch_samples": {"full": n_samples, "prune": n_samples - int(count), "anneal": n_samples}}


class InfoBatch:
    """The epoch plan of InfoBatch; ``batches(epoch, score)`` yields (positions, weights);
    ``observe`` records each trained sample's loss as its new score."""

    name = "infobatch"

    def __init__(self, n_samples: int, batch_size: int, prune_count: int, anneal_start_epoch: int, seed: int,
                 r_max: float = 0.9, device: str | torch.device = "cpu") -> None:
        if isinstance(prune_count, bool) or not isinstance(prune_count, int) or not 0 <= prune_count < n_samples:
            raise ValueError(f"prune_count must be an integer in [0, {n_samples}), got {prune_count!r}")
        if not 0.0 <= r_max < 1.0:
            raise ValueError(f"r_max must lie in [0, 1), got {r_max!r}")
        self.n_samples, self.batch_size = int(n_samples), int(batch_size)
        self.prune_count, self.anneal_start_epoch, self.seed = int(prune_count), int(anneal_start_epoch), seed
        self.r_max = float(r_max)
        self.prune_fractions: list[float] = []  # r of each pruned epoch
        self.device = torch.device(device)
        self.scores = torch.zeros(self.n_samples, dtype=torch.float32, device=self.device)
        self._scored = False
        self._counters = {"seen_total": 0, "trained_total": 0}

    def epoch_kind(self, epoch: int) -> str:
        if epoch == 0 or not self._scored:
            return "full"
        return "anneal" if epoch >= self.anneal_start_epoch else "prune"

    def batches(self, epoch: int, score: Callable[[Tensor], Tensor] | None = None
                ) -> Iterator[tuple[Tensor, Tensor | None]]:
        gen = torch.Generator(device=self.device)
        gen.manual_seed((self.seed * 1_000_003 + epoch * 101 + 0x1B) % (2**63))
        kind = self.epoch_kind(epoch)
        self._counters["seen_total"] += self.n_samples
        if kind != "prune" or self.prune_count == 0:
            order = torch.randperm(self.n_samples, generator=gen, device=self.device)
            self._counters["trained_total"] += self.n_samples
            for positions in order.split(self.batch_size):
                yield positions, None
            return
        kept, weights, r = prune(self.scores, self.prune_count, gen, self.r_max)
        self.prune_fractions.append(r)
        shuffle = torch.randperm(len(kept), generator=gen, device=self.device)
        kept, weights = kept[shuffle], weights[shuffle]
        self._counters["trained_total"] += len(kept)
        for positions, w in zip(kept.split(self.batch_size), weights.split(self.batch_size)):
            yield positions, w

    def observe(self, positions: Tensor, losses: Tensor) -> None:
        self.scores[positions] = losses.detach().to(self.scores.dtype)
        self._scored = True

    def stats(self) -> dict:
        c = dict(self._counters)
        c.update(prune_count=self.prune_count, prune_fractions=list(self.prune_fractions),
                 anneal_start_epoch=self.anneal_start_epoch,
                 trained_fraction=c["trained_total"] / c["seen_total"] if c["seen_total"] else None)
        return c

    def state_dict(self) -> dict:
        return {"scores": self.scores.clone(), "scored": self._scored, "counters": dict(self._counters),
                "prune_fractions": list(self.prune_fractions)}

    def load_state_dict(self, state: dict) -> None:
        self.scores = torch.as_tensor(state["scores"]).to(self.device, torch.float32).clone()
        self._scored = bool(state["scored"])
        self._counters = {k: int(v) for k, v in state["counters"].items()}
        self.prune_fractions = [float(r) for r in state["prune_fractions"]]
