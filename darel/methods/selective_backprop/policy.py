"""selective backprop's selection policy and its pure helpers (torch; imported only when a
run builds the policy or plans the method). Its card is darel.methods.selective_backprop's docstring."""

from __future__ import annotations

import math
from typing import Callable, Iterator

import torch
from torch import Tensor

from darel.sampler import LossHistory


def keep_fraction_for_beta(beta: float) -> float:
    """The expected chosen share E[U ** beta] = 1 / (beta + 1) for U uniform on [0, 1]."""
    if not beta >= 0:
        raise ValueError(f"beta must be >= 0, got {beta!r}")
    return 1.0 / (beta + 1.0)


def selection_probabilities(losses: Tensor, history: Tensor, beta: float) -> Tensor:
    """CDF(loss) ** beta, CDF the share of ``history`` at or below each loss (float64)."""
    if history.numel() == 0:
        raise ValueError("history is empty: push losses before reading percentiles")
    ordered, _ = torch.sort(history.detach().reshape(-1).to(torch.float64))
    below = torch.searchsorted(ordered, losses.detach().reshape(-1).to(torch.float64), right=True)
    return (below.to(torch.float64) / ordered.numel()) ** beta


class SelectiveBackprop:
    """The epoch plan of selective backprop; ``batches(epoch, score)`` yields (positions,
    None) training batches, calling ``score(positions) -> losses`` for every candidate chunk."""

    name = "selective-backprop"

    def __init__(self, n_samples: int, batch_size: int, beta: float, candidate_batch: int,
                 history_size: int, warmup_epochs: int, seed: int, device: str | torch.device = "cpu") -> None:
        for name, value, low in (("n_samples", n_samples, 1), ("batch_size", batch_size, 1),
                                 ("candidate_batch", candidate_batch, 1), ("warmup_epochs", warmup_epochs, 0),
                                 ("seed", seed, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        self.n_samples, self.batch_size, self.candidate_batch = n_samples, batch_size, candidate_batch
        self.beta = float(beta)
        self.keep_fraction = keep_fraction_for_beta(self.beta)
        self.warmup_epochs, self.seed = warmup_epochs, seed
        self.device = torch.device(device)
        self.history = LossHistory(history_size, self.device)
        self._pending = torch.zeros(0, dtype=torch.long, device=self.device)
        self._counters = {"seen_total": 0, "kept_total": 0}

    def epoch_kind(self, epoch: int) -> str:
        return "warmup" if epoch < self.warmup_epochs else "select"

    def _generator(self, epoch: int) -> torch.Generator:
        gen = torch.Generator(device=self.device)
        gen.manual_seed((self.seed * 1_000_003 + epoch * 101 + 0x5B) % (2**63))
        return gen

    def batches(self, epoch: int, score: Callable[[Tensor], Tensor]) -> Iterator[tuple[Tensor, None]]:
        gen = self._generator(epoch)
        order = torch.randperm(self.n_samples, generator=gen, device=self.device)
        if epoch < self.warmup_epochs:
            for positions in order.split(self.batch_size):
                yield positions, None
            return
        queue = self._pending
        seen = kept = 0
        for chunk in order.split(self.candidate_batch):
            losses = score(chunk)
            self.history.push(losses)
            p = selection_probabilities(losses, self.history.values(), self.beta)
            if queue.numel():  # a sample still waiting from the previous epoch is trained once
                p = torch.where(torch.isin(chunk, queue), torch.zeros_like(p), p)
            seen += len(chunk)
            count = min(math.floor(seen * self.keep_fraction) - kept, int((p > 0).sum()))
            chosen = chunk[torch.multinomial(p.clamp_min(1e-12) * (p > 0), count, replacement=False,
                                             generator=gen)] if count > 0 else chunk[:0]
            kept += len(chosen)
            self._counters["seen_total"] += len(chunk)
            self._counters["kept_total"] += len(chosen)
            queue = torch.cat([queue, chosen])
            while len(queue) >= self.batch_size:
                yield queue[: self.batch_size], None
                queue = queue[self.batch_size:]
        self._pending = queue.clone()

    def observe(self, positions: Tensor, losses: Tensor) -> None:
        pass

    def stats(self) -> dict:
        c = dict(self._counters)
        c.update(beta=self.beta, keep_fraction_target=self.keep_fraction, pending=int(self._pending.numel()),
                 keep_fraction_observed=c["kept_total"] / c["seen_total"] if c["seen_total"] else None)
        return c

    def state_dict(self) -> dict:
        return {"history": self.history.state_dict(), "pending": self._pending.clone(), "counters": dict(self._counters)}

    def load_state_dict(self, state: dict) -> None:
        self.history.load_state_dict(state["history"])
        self._pending = torch.as_tensor(state["pending"]).to(self.device, torch.long).clone()
        self._counters = {k: int(v) for k, v in state["counters"].items()}
