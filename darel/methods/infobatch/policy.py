"""InfoBatch's selection policy and its pure helpers (torch; imported only when a
run builds the policy or plans the method). Its card is darel.methods.infobatch's docstring."""

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
