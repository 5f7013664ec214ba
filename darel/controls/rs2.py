"""rs2 (Okanovic et al. 2023, "Repeated Random Sampling for Minimizing the Time-to-Accuracy
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
