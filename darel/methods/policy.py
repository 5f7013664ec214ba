"""The selection policies of the training loop: which samples form each batch (shared by
the method folders; torch, imported only when a run builds its policy).

Every online rule (Algorithm 3 and its uniform control, selective backprop, InfoBatch,
and a plain run, where every epoch is a warm-up epoch) is a ``SelectionPolicy``; the
image training loop (darel.image_training) asks it for each epoch's kind and batches and tells
it each step's per-sample losses.
"""

from __future__ import annotations

from typing import Callable, Iterator, Protocol, runtime_checkable

import torch

from darel.sampler import OnlineSampler

ScoreFn = Callable[[torch.Tensor], torch.Tensor]


@runtime_checkable
class SelectionPolicy(Protocol):
    """What the training loop needs from an online selection rule."""

    name: str

    def epoch_kind(self, epoch: int) -> str:
        """"warmup" (all data), "refresh" (losses scored first) or "reuse" (stored losses)."""

    def batches(self, epoch: int, score: ScoreFn) -> Iterator[tuple[torch.Tensor, torch.Tensor | None]]:
        """The epoch's batches as (positions into the training set, per-sample loss weights or
        None); ``score(positions)`` gives the metered no-grad losses of those samples."""

    def observe(self, positions: torch.Tensor, losses: torch.Tensor) -> None:
        """The per-sample training losses of a batch just trained (device tensors)."""

    def stats(self) -> dict:
        """Counters for the run record (samples scored, kept, trained)."""

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


class OnlinePolicy:
    """Algorithm 3 (and its uniform control, and a plain run: every epoch a warm-up epoch)
    as the training loop's selection policy: a refresh epoch scores every sample first."""

    name = "online"

    def __init__(self, sampler: OnlineSampler) -> None:
        self.sampler = sampler

    def epoch_kind(self, epoch: int) -> str:
        if self.sampler.is_warmup(epoch):
            return "warmup"
        return "refresh" if self.sampler.needs_refresh(epoch) else "reuse"

    def batches(self, epoch: int, score: ScoreFn):
        if self.epoch_kind(epoch) == "refresh":
            every = torch.arange(self.sampler.n_samples, device=self.sampler.device)
            self.sampler.update_losses(epoch, score(every))
        for positions in self.sampler.plan_epoch(epoch):
            yield positions, None

    def observe(self, positions: torch.Tensor, losses: torch.Tensor) -> None:
        pass

    def stats(self) -> dict:
        return self.sampler.stats()

    def state_dict(self) -> dict:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.sampler.load_state_dict(state)
