"""infobatch (Qin et al., ICLR 2024, "InfoBatch: lossless training speed-up by unbiased
dynamic data pruning").

Method card. Every sample keeps a score, the loss of its last training forward. Each
epoch, the samples scoring below the mean ("well learnt") are pruned at random with
probability r; the kept below-mean samples have their loss multiplied by 1 / (1 - r), so
the expected gradient over the epoch is the full data set's. In the last 12.5 % of the
epochs (annealing) nothing is pruned. Pruned samples keep their old score.

Decided where the paper is silent, for this setting:
* the first epoch trains on everything (no scores yet), like the annealing epochs;
* r is chosen so that the planned time fits t_max (``prune_fraction_for_budget``): the
  share f of below-mean samples is estimated from the offline scorer's losses of the
  same seed (the closest thing to a trained model's score distribution available before
  training), capped at ``r_max``; if even r_max cannot fit the protocol's epochs, the
  number of epochs is lowered until it does (annealing stays the last 12.5 %);
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


def prune(scores: Tensor, prune_fraction: float, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """(kept positions, loss weight of each kept sample) for one epoch: below-mean
    samples dropped with probability r, the kept ones among them weighted 1 / (1 - r)."""
    if not 0.0 <= prune_fraction < 1.0:
        raise ValueError(f"prune_fraction must lie in [0, 1), got {prune_fraction!r}")
    below = scores < scores.mean()
    draw = torch.rand(scores.shape, generator=generator, device=scores.device, dtype=torch.float64)
    dropped = below & (draw < prune_fraction)
    kept = torch.nonzero(~dropped).reshape(-1)
    weights = torch.where(below[kept], 1.0 / (1.0 - prune_fraction), 1.0).to(torch.float32)
    return kept, weights


def prune_fraction_for_budget(*, full_epoch_s: float, n_samples: int, batch: int, below_fraction: float,
                              epochs: int, t_max_s: float, anneal_fraction: float = 0.125,
                              r_max: float = 0.9) -> dict:
    """Smallest r (and, if needed, fewer epochs) whose predicted time fits t_max.

    A full epoch costs ``full_epoch_s`` for ceil(n / b) steps; a pruned epoch trains
    about n * (1 - r * f) samples, ceil of that / b steps at the same step cost. The first
    epoch and the annealing epochs are full."""
    step_s = full_epoch_s / math.ceil(n_samples / batch)
    for planned in range(epochs, 0, -1):
        start = anneal_start(planned, anneal_fraction)
        pruned_epochs = max(0, start - 1)
        full_epochs = planned - pruned_epochs
        budget_left = t_max_s - full_epochs * full_epoch_s
        if pruned_epochs == 0:
            if budget_left >= -1e-9 * t_max_s or planned == 1:
                return _infobatch_plan(planned, 0.0, full_epochs * full_epoch_s, start, t_max_s)
            continue
        allowed_steps = math.floor(budget_left / pruned_epochs / step_s * (1 + 1e-9))
        if allowed_steps < 1:
            continue
        # ceil(n (1 - r f) / b) <= allowed_steps  <=>  n (1 - r f) <= allowed_steps * b
        needed = (1.0 - min(n_samples, allowed_steps * batch) / n_samples) / below_fraction if below_fraction > 0 \
            else (0.0 if allowed_steps * batch >= n_samples else math.inf)
        r = max(0.0, needed)
        if r <= r_max:
            pruned_steps = math.ceil(n_samples * (1.0 - r * below_fraction) / batch)
            predicted = full_epochs * full_epoch_s + pruned_epochs * pruned_steps * step_s
            return _infobatch_plan(planned, r, predicted, start, t_max_s)
    start = anneal_start(1, anneal_fraction)
    return _infobatch_plan(1, 0.0, full_epoch_s, start, t_max_s, exceeds=True)


def _infobatch_plan(epochs: int, r: float, predicted: float, start: int, t_max_s: float,
                    exceeds: bool = False) -> dict:
    return {"planned_epochs": int(epochs), "prune_fraction": float(r), "anneal_start_epoch": int(start),
            "predicted_time_s": float(predicted), "predicted_adherence": float(predicted / t_max_s),
            "plan_exceeds_budget": bool(exceeds or predicted > t_max_s * (1 + 1e-9))}


class InfoBatch:
    """The epoch plan of InfoBatch; ``batches(epoch, score)`` yields (positions, weights);
    ``observe`` records each trained sample's loss as its new score."""

    name = "infobatch"

    def __init__(self, n_samples: int, batch_size: int, prune_fraction: float, anneal_start_epoch: int, seed: int,
                 device: str | torch.device = "cpu") -> None:
        if not 0.0 <= prune_fraction < 1.0:
            raise ValueError(f"prune_fraction must lie in [0, 1), got {prune_fraction!r}")
        self.n_samples, self.batch_size = int(n_samples), int(batch_size)
        self.prune_fraction, self.anneal_start_epoch, self.seed = float(prune_fraction), int(anneal_start_epoch), seed
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
        if kind != "prune" or self.prune_fraction == 0.0:
            order = torch.randperm(self.n_samples, generator=gen, device=self.device)
            self._counters["trained_total"] += self.n_samples
            for positions in order.split(self.batch_size):
                yield positions, None
            return
        kept, weights = prune(self.scores, self.prune_fraction, gen)
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
        c.update(prune_fraction=self.prune_fraction, anneal_start_epoch=self.anneal_start_epoch,
                 trained_fraction=c["trained_total"] / c["seen_total"] if c["seen_total"] else None)
        return c

    def state_dict(self) -> dict:
        return {"scores": self.scores.clone(), "scored": self._scored, "counters": dict(self._counters)}

    def load_state_dict(self, state: dict) -> None:
        self.scores = torch.as_tensor(state["scores"]).to(self.device, torch.float32).clone()
        self._scored = bool(state["scored"])
        self._counters = {k: int(v) for k, v in state["counters"].items()}
