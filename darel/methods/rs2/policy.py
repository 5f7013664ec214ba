"""RS2's selection policy and its pure helpers (torch; imported only when a
run builds the policy or plans the method). Its card is darel.methods.rs2's docstring."""

from __future__ import annotations

import math
from typing import Callable, Iterator

import torch
from torch import Tensor


def ratio_for_budget(*, step_s: float, n_samples: int, batch: int, epochs: int, t_max_s: float) -> float:
    """The largest r whose ``epochs`` epochs of ceil(r n / b) steps fit t_max (at least one
    batch an epoch; 1 at most)."""
    if not (step_s > 0 and t_max_s > 0):
        raise ValueError(f"step_s and t_max_s must be positive, got {step_s!r}, {t_max_s!r}")
    steps = math.floor(t_max_s / (epochs * step_s) * (1 + 1e-9))
    return min(1.0, max(1, steps) * batch / n_samples)


class RandomSubsetsPerEpoch:
    """The epoch plan of RS2: ``batches(epoch, score)`` yields (positions, None)."""

    name = "rs2"

    def __init__(self, n_samples: int, batch_size: int, ratio: float, seed: int,
                 device: str | torch.device = "cpu") -> None:
        if not 0.0 < ratio <= 1.0:
            raise ValueError(f"ratio must lie in (0, 1], got {ratio!r}")
        for name, value in (("n_samples", n_samples), ("batch_size", batch_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.n_samples, self.batch_size, self.ratio, self.seed = n_samples, batch_size, float(ratio), int(seed)
        self.per_epoch = max(1, round(self.ratio * n_samples))
        self.device = torch.device(device)
        self._permutations = 0  # permutations drawn so far
        self._offset = 0  # samples of the current permutation used so far
        self._current: Tensor | None = None
        self._trained = 0

    def _permutation(self) -> Tensor:
        gen = torch.Generator(device=self.device)
        gen.manual_seed((self.seed * 1_000_003 + self._permutations * 101 + 0x52) % (2**63))
        self._permutations += 1
        return torch.randperm(self.n_samples, generator=gen, device=self.device)

    def epoch_kind(self, epoch: int) -> str:
        return "subset"

    def _take(self, count: int) -> Tensor:
        parts = []
        while count > 0:
            if self._current is None or self._offset >= self.n_samples:
                self._current, self._offset = self._permutation(), 0
            part = self._current[self._offset:self._offset + count]
            self._offset += len(part)
            count -= len(part)
            parts.append(part)
        return torch.cat(parts)

    def batches(self, epoch: int, score: Callable[[Tensor], Tensor] | None = None
                ) -> Iterator[tuple[Tensor, None]]:
        chosen = self._take(self.per_epoch)
        self._trained += len(chosen)
        for positions in chosen.split(self.batch_size):
            yield positions, None

    def observe(self, positions: Tensor, losses: Tensor) -> None:
        pass

    def stats(self) -> dict:
        return {"ratio": self.ratio, "per_epoch": self.per_epoch, "trained_total": self._trained,
                "permutations": self._permutations}

    def state_dict(self) -> dict:
        return {"permutations": self._permutations, "offset": self._offset, "trained": self._trained,
                "current": None if self._current is None else self._current.clone()}

    def load_state_dict(self, state: dict) -> None:
        self._permutations, self._offset = int(state["permutations"]), int(state["offset"])
        self._trained = int(state["trained"])
        current = state["current"]
        self._current = None if current is None else torch.as_tensor(current).to(self.device, torch.long).clone()
