"""Algorithm 3 (online selection): loss-histogram importance sampling, vectorised.

After ``warmup_epochs`` full epochs, every epoch walks a random permutation of the
training set in chunks of ``batch_size``. Each chunk's stored losses enter a ring
buffer of the last ``history_size`` losses; a histogram of that buffer gives each
sample of the chunk a keep probability proportional to how common its loss is, scaled
so that the expected kept share is ``keep_fraction`` (A). Kept samples queue up and
leave in full training batches of exactly ``batch_size``; whatever is left at the end
of an epoch waits for the next one.

Stored losses come from a no-grad pass that the caller runs when ``needs_refresh``
says so (every ``eta`` epochs); in between, the old losses are reused.

The work per chunk is a handful of tensor operations on the device; there is no
per-sample Python loop. All randomness of an epoch comes from a generator seeded by
(seed, epoch), so replaying an epoch from a saved state gives the same batches.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor


def _check_int(name: str, value: int, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _check_fraction(name: str, value: float) -> None:
    if not (isinstance(value, (int, float, np.integer, np.floating)) and 0.0 < float(value) <= 1.0):
        raise ValueError(f"{name} must be in (0, 1], got {value!r}")


class LossHistory:
    """Ring buffer holding the most recent ``capacity`` losses (gamma) on a device."""

    def __init__(self, capacity: int, device: str | torch.device = "cpu") -> None:
        _check_int("capacity", capacity, 1)
        self.capacity = int(capacity)
        self.device = torch.device(device)
        self._buffer = torch.zeros(self.capacity, dtype=torch.float32, device=self.device)
        self._next = 0  # slot the next loss goes to
        self._count = 0  # filled slots

    def push(self, losses: Tensor) -> None:
        """Append losses (any shape, flattened); the oldest fall out once full."""
        flat = losses.detach().reshape(-1).to(device=self.device, dtype=torch.float32)
        if flat.numel() >= self.capacity:
            # Only the newest `capacity` survive: overwrite the whole buffer in order.
            self._buffer.copy_(flat[-self.capacity:])
            self._next = 0
            self._count = self.capacity
            return
        k = flat.numel()
        slots = (self._next + torch.arange(k, device=self.device)) % self.capacity
        self._buffer[slots] = flat
        self._next = (self._next + k) % self.capacity
        self._count = min(self._count + k, self.capacity)

    def values(self) -> Tensor:
        """The stored losses, oldest first."""
        if self._count < self.capacity:
            return self._buffer[: self._count]
        return torch.roll(self._buffer, -self._next)

    def __len__(self) -> int:
        return self._count

    def state_dict(self) -> dict:
        return {"capacity": self.capacity, "values": self.values().clone()}

    def load_state_dict(self, state: dict) -> None:
        if int(state["capacity"]) != self.capacity:
            raise ValueError(f"history capacity mismatch: state has {state['capacity']}, this buffer {self.capacity}")
        self._buffer.zero_()
        self._next = 0
        self._count = 0
        self.push(torch.as_tensor(state["values"]))


def _bin_index(x: Tensor, low: Tensor, width: Tensor, bins: int) -> Tensor:
    # Values outside [low, high] fall into the edge bins.
    return ((x - low) / width).floor().clamp(0, bins - 1).long()


def _scale_to_mean(weights: Tensor, keep_fraction: float) -> Tensor:
    """min(1, c * w) with c chosen so that the mean is keep_fraction (water-filling).

    Solved exactly by sorting: if the k largest weights are capped at 1, the rest
    must supply n*A - k, so c_k = (n*A - k) / (sum of the other weights). The answer
    is the smallest k whose first uncapped weight stays <= 1 under c_k.
    """
    n = weights.numel()
    if keep_fraction >= 1.0:
        return torch.ones_like(weights)
    target = keep_fraction * n
    ordered, _ = torch.sort(weights, descending=True)
    tail_sums = ordered.sum() - torch.cat([ordered.new_zeros(1), torch.cumsum(ordered, 0)[:-1]])  # sum of ordered[k:]
    capped = torch.arange(n, device=weights.device, dtype=weights.dtype)
    scale = (target - capped) / tail_sums
    feasible = (capped < target) & (tail_sums > 0) & (scale * ordered <= 1.0 + 1e-12)
    # argmax on bools returns the first True; if none is True (fewer positive weights
    # than n*A), every positive weight is capped at 1, the closest reachable mean.
    k = torch.argmax(feasible.to(torch.uint8))
    chosen = torch.where(feasible.any(), scale[k], torch.full_like(scale[k], math.inf))
    return torch.where(weights > 0, (chosen * weights).clamp(max=1.0), torch.zeros_like(weights))


def keep_probabilities(losses: Tensor, history: Tensor, keep_fraction: float, bins: int) -> Tensor:
    """Keep probability of each loss, proportional to its bin's frequency in ``history``.

    The histogram has ``bins`` equal-width bins between the history's min and max;
    losses outside that range count in the edge bins. Probabilities are scaled so that
    their mean is ``keep_fraction`` with none above 1 (the excess of capped samples goes
    to the rest). Returns float64 on the losses' device. A loss whose bin is empty in
    the history gets 0; the sampler avoids that by pushing a chunk before scoring it.
    """
    _check_fraction("keep_fraction", keep_fraction)
    _check_int("bins", bins, 1)
    losses = losses.detach().reshape(-1)
    history = history.detach().reshape(-1).to(losses.device)
    if history.numel() == 0:
        raise ValueError("history is empty: push losses before asking for keep probabilities")
    if losses.numel() == 0:
        return torch.zeros(0, dtype=torch.float64, device=losses.device)
    if not bool(torch.isfinite(losses).all()) or not bool(torch.isfinite(history).all()):
        raise ValueError("losses and history must be finite (found NaN or inf)")
    return _histogram_probabilities(losses, history, float(keep_fraction), int(bins))


def _histogram_probabilities(losses: Tensor, history: Tensor, keep_fraction: float, bins: int) -> Tensor:
    # Unchecked core of keep_probabilities: no host synchronisation, for the per-chunk loop.
    history = history.to(torch.float64)
    low, high = history.min(), history.max()
    spread = high > low
    width = torch.where(spread, (high - low) / bins, torch.ones_like(high))  # 1: any value avoids 0/0
    counts = torch.zeros(bins, dtype=torch.float64, device=losses.device)
    counts.scatter_add_(0, _bin_index(history, low, width, bins), torch.ones_like(history))
    frequency = counts / history.numel()
    weights = frequency[_bin_index(losses.to(torch.float64), low, width, bins)]
    # A flat history (every loss equal) has no shape to prefer: equal weights for all.
    weights = torch.where(spread, weights, torch.ones_like(weights))
    return _scale_to_mean(weights, keep_fraction)


def _epoch_seed(seed: int, epoch: int) -> int:
    # SeedSequence mixes (seed, epoch) so neighbouring epochs get unrelated streams.
    return int(np.random.SeedSequence([int(seed), int(epoch)]).generate_state(1, dtype=np.uint64)[0]) >> 1


class OnlineSampler:
    """Plans the index batches of each epoch: everything during warm-up, Algorithm 3 after.

    Call order per epoch: if ``needs_refresh(epoch)``, compute all per-sample losses and
    pass them to ``update_losses``; then ``plan_epoch(epoch)`` once. ``plan_epoch``
    advances the state (history, carry-over, counters), so it must not be repeated for
    the same epoch unless the state is restored first.
    """

    def __init__(self, n_samples: int, batch_size: int, keep_fraction: float, eta: int, warmup_epochs: int,
                 history_size: int, bins: int, seed: int, device: str | torch.device = "cpu") -> None:
        _check_int("n_samples", n_samples, 1)
        _check_int("batch_size", batch_size, 1)
        _check_fraction("keep_fraction", keep_fraction)
        _check_int("eta", eta, 1)
        _check_int("warmup_epochs", warmup_epochs, 0)
        _check_int("history_size", history_size, 1)
        _check_int("bins", bins, 1)
        _check_int("seed", seed, 0)
        self.n_samples = int(n_samples)
        self.batch_size = int(batch_size)
        self.keep_fraction = float(keep_fraction)
        self.eta = int(eta)
        self.warmup_epochs = int(warmup_epochs)
        self.bins = int(bins)
        self.seed = int(seed)
        self.device = torch.device(device)
        self.history = LossHistory(history_size, self.device)
        self._losses: Tensor | None = None
        self._last_update: int | None = None
        self._pending = torch.zeros(0, dtype=torch.long, device=self.device)
        self._counters = {"seen_total": 0, "kept_total": 0, "seen_last_epoch": 0, "kept_last_epoch": 0,
                          "batches_last_epoch": 0, "trained_last_epoch": 0}

    # -- schedule -----------------------------------------------------------------
    def is_warmup(self, epoch: int) -> bool:
        """Epochs 0 .. warmup_epochs-1 (0-based) train on every sample."""
        return epoch < self.warmup_epochs

    def needs_refresh(self, epoch: int) -> bool:
        """Whether fresh per-sample losses are needed before planning this epoch.

        Never during warm-up; always at the first online epoch (no losses yet, or only
        losses from warm-up); afterwards once ``eta`` epochs have passed since the last.
        """
        if self.is_warmup(epoch):
            return False
        if self._last_update is None or self._last_update < self.warmup_epochs:
            return True
        return epoch - self._last_update >= self.eta

    def update_losses(self, epoch: int, losses: Tensor) -> None:
        """Store every sample's loss (length n_samples, indexed like the dataset)."""
        flat = losses.detach().reshape(-1)
        if flat.numel() != self.n_samples:
            raise ValueError(f"expected {self.n_samples} losses, got {flat.numel()}")
        flat = flat.to(device=self.device, dtype=torch.float32)
        bad = int((~torch.isfinite(flat)).sum())
        if bad:
            raise ValueError(f"losses contain {bad} non-finite value(s) (NaN or inf)")
        self._losses = flat.clone()
        self._last_update = int(epoch)

    # -- planning -----------------------------------------------------------------
    def _generator(self, epoch: int) -> torch.Generator:
        gen = torch.Generator(device=self.device)
        gen.manual_seed(_epoch_seed(self.seed, epoch))
        return gen

    def plan_epoch(self, epoch: int) -> list[Tensor]:
        """The index batches (int64 tensors on the device) to train in this epoch."""
        _check_int("epoch", epoch, 0)
        gen = self._generator(epoch)
        order = torch.randperm(self.n_samples, generator=gen, device=self.device)
        if self.is_warmup(epoch):
            batches = list(order.split(self.batch_size))
            self._counters.update(batches_last_epoch=len(batches), trained_last_epoch=self.n_samples)
            return batches
        if self._losses is None:
            raise ValueError(f"epoch {epoch} is an online epoch but no losses were stored: call update_losses first")

        # Keep/drop decisions chunk by chunk; the history evolves with every chunk, but
        # the decisions do not feed back into it, so batching can happen afterwards.
        keep_masks = []
        for chunk in order.split(self.batch_size):
            chunk_losses = self._losses[chunk]
            self.history.push(chunk_losses)
            p = _histogram_probabilities(chunk_losses, self.history.values(), self.keep_fraction, self.bins)
            keep_masks.append(torch.bernoulli(p, generator=gen).bool())
        keep = torch.cat(keep_masks)
        kept = order[keep]

        carry = self._pending
        if carry.numel():
            # A sample kept again while still waiting from last epoch is trained once.
            kept = kept[~torch.isin(kept, carry)]
        queue = torch.cat([carry, kept])
        n_full = queue.numel() // self.batch_size
        batches = list(queue[: n_full * self.batch_size].split(self.batch_size)) if n_full else []
        self._pending = queue[n_full * self.batch_size:].clone()

        n_kept = int(keep.sum())
        c = self._counters
        c["seen_total"] += self.n_samples
        c["kept_total"] += n_kept
        c.update(seen_last_epoch=self.n_samples, kept_last_epoch=n_kept, batches_last_epoch=len(batches),
                 trained_last_epoch=n_full * self.batch_size)
        return batches

    # -- reporting and resuming ---------------------------------------------------------
    def stats(self) -> dict:
        """Counters of the online epochs (warm-up epochs are not selections)."""
        c = dict(self._counters)
        c["keep_fraction_target"] = self.keep_fraction
        c["keep_fraction_observed"] = c["kept_total"] / c["seen_total"] if c["seen_total"] else None
        c["keep_fraction_last_epoch"] = c["kept_last_epoch"] / c["seen_last_epoch"] if c["seen_last_epoch"] else None
        c["pending"] = int(self._pending.numel())
        c["last_update"] = self._last_update
        return c

    def state_dict(self) -> dict:
        return {
            "n_samples": self.n_samples,
            "batch_size": self.batch_size,
            "losses": None if self._losses is None else self._losses.clone(),
            "last_update": self._last_update,
            "history": self.history.state_dict(),
            "pending": self._pending.clone(),
            "counters": dict(self._counters),
        }

    def load_state_dict(self, state: dict) -> None:
        for key in ("n_samples", "batch_size"):
            if int(state[key]) != getattr(self, key):
                raise ValueError(f"sampler state has {key}={state[key]}, this sampler {getattr(self, key)}")
        losses = state["losses"]
        self._losses = None if losses is None else torch.as_tensor(losses).to(self.device, torch.float32).clone()
        self._last_update = None if state["last_update"] is None else int(state["last_update"])
        self.history.load_state_dict(state["history"])
        self._pending = torch.as_tensor(state["pending"]).to(self.device, torch.long).clone()
        self._counters = {k: int(v) for k, v in state["counters"].items()}
