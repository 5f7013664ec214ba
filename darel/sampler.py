"""Algorithm 3 (online selection): loss-histogram importance sampling, batched over an epoch.

After ``warmup_epochs`` full epochs, every epoch walks a random permutation of the
training set in chunks of ``batch_size``. Each chunk's stored losses enter a ring
buffer of the last ``history_size`` losses (gamma); a histogram of that buffer gives
each sample of the chunk a keep probability proportional to how common its loss is,
scaled so that the expected kept share of the chunk is ``keep_fraction`` (A). Kept
samples queue up and leave in full training batches of exactly ``batch_size``;
whatever is left at the end of an epoch waits for the next one.

Stored losses come from a no-grad pass that the caller runs when ``needs_refresh``
says so (every ``eta`` epochs); in between, the old losses are reused.

How an epoch is planned (method card)
-------------------------------------
The keep/drop decisions never feed back into the buffer, so the buffer's whole
evolution over an epoch is known in advance: chunk k sees the last gamma values of
the stream [buffer before the epoch, oldest first] ++ [this epoch's losses in
permutation order], cut at the end of chunk k. ``chunked_keep_probabilities`` builds
those windows for all chunks at once (a chunks x gamma gather), takes per-row min and
max, bins every window value against its own row's edges with the same float64
arithmetic as the per-chunk definition, counts all rows with ONE scatter-add (row k
owns slots k*bins .. k*bins+bins-1; slots of a buffer that is not full yet go to a
discard slot), and water-fills every row at once (sort, cumulative sums, first
feasible cap count per row). The partial last chunk is a row padded with zero
weights. The result equals ``per_chunk_keep_probabilities`` (the loop the sampler
used before, kept as the reference) to rounding: bin counts are identical, sums may
be reduced in another order (tests: 1e-12 in float64). The cost is a fixed set of
about 100 tensor operations per epoch, whatever the number of chunks (the old loop
issued about 60 per chunk; ``bench/gpu.py`` counts both). Memory: chunks x gamma
window values (about 24 bytes each at the peak), split into several passes only
above ``MAX_WINDOW_ELEMENTS`` (2**24; CIFAR-100 at batch 128 and gamma 4096 is 1.6 M,
at batch 16 12.8 M).

Host synchronisation: exactly one per online epoch, when the kept indices are formed
(their number decides how many batches the epoch has); none during warm-up. Counters
of kept samples stay on the device until ``stats`` or ``state_dict`` reads them.
(``update_losses`` checks the losses for NaN/inf, one more sync on refresh epochs.)

Draws: one uniform float64 per sample per epoch, kept where u < p (a Bernoulli(p)
draw). Before the batched planner each chunk drew ``torch.bernoulli`` separately, so
the same seed now gives other (equally distributed) batches than older versions.

Keep rules: ``rule="histogram"`` is Algorithm 3; ``rule="uniform"`` keeps every
sample with probability A whatever its loss (the uniform-online control). The uniform
rule uses no losses, so it never asks for a refresh.

All randomness of an epoch comes from a generator seeded by (seed, epoch), so
replaying an epoch from a saved state gives the same batches.
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
    # Unchecked core of keep_probabilities: no host synchronisation, for the per-chunk reference.
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


RULES = ("histogram", "uniform")
PLANNERS = ("batched", "per_chunk")
# Most window values (chunks x gamma) one pass of chunked_keep_probabilities holds; above
# it the chunks are split into passes of the same operations (memory ~24 bytes a value).
MAX_WINDOW_ELEMENTS = 1 << 24


def per_chunk_keep_probabilities(history: LossHistory, losses: Tensor, chunk: int, keep_fraction: float,
                                 bins: int) -> Tensor:
    """REFERENCE: the per-chunk definition, literally (the loop the sampler ran before).

    Splits ``losses`` (this epoch's stored losses in permutation order) into chunks of
    ``chunk``; each chunk is pushed into ``history`` (which this call advances), then
    scored against the buffer's values. Returns float64 probabilities, one per loss.
    About 66 small tensor operations per chunk; kept for tests and benchmarks.
    """
    parts = []
    for part in losses.detach().reshape(-1).split(chunk):
        history.push(part)
        parts.append(_histogram_probabilities(part, history.values(), keep_fraction, bins))
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64, device=losses.device)


def chunked_keep_probabilities(history: Tensor, losses: Tensor, chunk: int, capacity: int, keep_fraction: float,
                               bins: int, max_elements: int = MAX_WINDOW_ELEMENTS) -> Tensor:
    """The values of ``per_chunk_keep_probabilities`` for all chunks at once, without a loop.

    ``history``: the buffer's values before the epoch, oldest first (at most ``capacity``);
    ``losses``: this epoch's losses in permutation order. Nothing is mutated; the caller
    advances its buffer with one ``push(losses)``, which leaves the state the per-chunk
    pushes would have left. No host synchronisation. See the module doc for the method.
    """
    _check_int("chunk", chunk, 1)
    _check_int("capacity", capacity, 1)
    _check_int("bins", bins, 1)
    _check_fraction("keep_fraction", keep_fraction)
    losses = losses.detach().reshape(-1)
    history = history.detach().reshape(-1).to(losses.device)
    n = losses.numel()
    if history.numel() > capacity:
        raise ValueError(f"history holds {history.numel()} values, more than the capacity {capacity}")
    if n == 0:
        return torch.zeros(0, dtype=torch.float64, device=losses.device)
    stream = torch.cat([history.to(torch.float32), losses.to(torch.float32)]).to(torch.float64)
    # `capacity` stand-ins in front of the stream, so that every window is a fixed-length
    # gather. They repeat the stream's first value (in every window that reaches them, as
    # the window then starts at the stream's start): min and max stay right, and the
    # counting sends them to a discard slot.
    padded = torch.cat([stream[:1].expand(capacity), stream])
    n_chunks = -(-n // chunk)
    rows_per_pass = max(1, int(max_elements) // max(capacity, chunk))
    parts = [_window_probabilities(padded, history.numel(), n, chunk, capacity, float(keep_fraction), int(bins),
                                   first, min(n_chunks, first + rows_per_pass))
             for first in range(0, n_chunks, rows_per_pass)]
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _window_probabilities(padded: Tensor, n_history: int, n: int, chunk: int, capacity: int, keep_fraction: float,
                          bins: int, first: int, last: int) -> Tensor:
    # Keep probabilities of the losses of chunks first .. last-1 (see chunked_keep_probabilities).
    device = padded.device
    rows = last - first
    starts = torch.arange(first, last, device=device) * chunk  # first loss of each chunk
    ends = (starts + chunk).clamp_(max=n)  # one past its last loss
    # After pushing chunk k the buffer holds stream[e - capacity : e] with e = n_history + end_k
    # (fewer when e < capacity); in `padded` coordinates that is [e, e + capacity).
    stream_ends = ends + n_history
    positions = stream_ends[:, None] + torch.arange(capacity, device=device)
    window = padded[positions]
    low = window.amin(1, keepdim=True)
    high = window.amax(1, keepdim=True)
    spread = high > low
    width = torch.where(spread, (high - low) / bins, torch.ones_like(high))
    slots = _bin_index(window, low, width, bins) + (torch.arange(rows, device=device) * bins)[:, None]
    slots = torch.where(positions >= capacity, slots, rows * bins)  # stand-ins -> discard slot
    counts = torch.zeros(rows * bins + 1, dtype=torch.float64, device=device)
    counts.scatter_add_(0, slots.reshape(-1), torch.ones((), dtype=torch.float64, device=device).expand(slots.numel()))
    window_sizes = stream_ends.clamp(max=capacity)
    frequency = counts[:-1].view(rows, bins) / window_sizes[:, None]

    # The chunks' own losses, one row per chunk; the partial last chunk is padded.
    offsets = starts[:, None] + torch.arange(chunk, device=device)
    real = offsets < n
    chunk_losses = padded[offsets.clamp(max=n - 1) + (capacity + n_history)]
    weights = frequency.gather(1, _bin_index(chunk_losses, low, width, bins))
    # A flat history (every loss equal) has no shape to prefer: equal weights for all.
    weights = torch.where(spread, weights, 1.0)
    weights = torch.where(real, weights, 0.0)  # padding: weight 0 is never kept nor counted
    p = _scale_rows_to_mean(weights, (ends - starts).to(torch.float64), keep_fraction)
    return p.reshape(-1)[: min(last * chunk, n) - first * chunk]


def _scale_rows_to_mean(weights: Tensor, sizes: Tensor, keep_fraction: float) -> Tensor:
    """``_scale_to_mean`` for every row at once: row k's mean over its first sizes[k]
    entries becomes keep_fraction; entries beyond (weight 0) stay 0."""
    if keep_fraction >= 1.0:
        return torch.ones_like(weights)
    width = weights.shape[1]
    target = (sizes * keep_fraction)[:, None]
    ordered = torch.sort(weights, dim=1, descending=True).values
    before = torch.cumsum(ordered, 1)[:, :-1]  # sum of ordered[:k] for k >= 1
    tail_sums = ordered.sum(1, keepdim=True) - torch.cat([ordered.new_zeros(len(ordered), 1), before], 1)
    capped = torch.arange(width, device=weights.device, dtype=weights.dtype)
    scale = (target - capped) / tail_sums
    feasible = (capped < target) & (tail_sums > 0) & (scale * ordered <= 1.0 + 1e-12)
    # The smallest feasible cap count of each row; none feasible: every positive weight -> 1.
    first = torch.where(feasible, capped, float(width)).amin(1, keepdim=True)
    chosen = torch.where(first < width, scale.gather(1, first.clamp(max=width - 1).long()), math.inf)
    return torch.where(weights > 0, (chosen * weights).clamp(max=1.0), 0.0)


def _epoch_seed(seed: int, epoch: int) -> int:
    # SeedSequence mixes (seed, epoch) so neighbouring epochs get unrelated streams.
    return int(np.random.SeedSequence([int(seed), int(epoch)]).generate_state(1, dtype=np.uint64)[0]) >> 1


class OnlineSampler:
    """Plans the index batches of each epoch: everything during warm-up, Algorithm 3 after.

    Call order per epoch: if ``needs_refresh(epoch)``, compute all per-sample losses and
    pass them to ``update_losses``; then ``plan_epoch(epoch)`` once. ``plan_epoch``
    advances the state (history, carry-over, counters), so it must not be repeated for
    the same epoch unless the state is restored first.

    ``rule``: "histogram" (Algorithm 3) or "uniform" (keep with probability A whatever
    the loss; needs no losses). ``floor`` (0 <= floor <= 1, histogram rule): every keep
    probability becomes ``floor * A + (1 - floor) * p``, so no sample is kept with less
    than ``floor * A`` and each chunk's mean stays A (0: Algorithm 3 exactly, the same
    operations and draws). ``planner``: "batched" (default) or "per_chunk", the
    reference loop, for tests and benchmarks; both give the same batches up to draws
    falling within rounding of a probability.
    """

    def __init__(self, n_samples: int, batch_size: int, keep_fraction: float, eta: int, warmup_epochs: int,
                 history_size: int, bins: int, seed: int, device: str | torch.device = "cpu", *,
                 rule: str = "histogram", planner: str = "batched", floor: float = 0.0) -> None:
        _check_int("n_samples", n_samples, 1)
        _check_int("batch_size", batch_size, 1)
        _check_fraction("keep_fraction", keep_fraction)
        _check_int("eta", eta, 1)
        _check_int("warmup_epochs", warmup_epochs, 0)
        _check_int("history_size", history_size, 1)
        _check_int("bins", bins, 1)
        _check_int("seed", seed, 0)
        if rule not in RULES:
            raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
        if planner not in PLANNERS:
            raise ValueError(f"planner must be one of {PLANNERS}, got {planner!r}")
        if not (isinstance(floor, (int, float, np.integer, np.floating)) and 0.0 <= float(floor) <= 1.0):
            raise ValueError(f"floor must be in [0, 1], got {floor!r}")
        if floor > 0 and rule != "histogram":
            raise ValueError(f"floor = {floor} applies to the histogram rule only, not to rule {rule!r}")
        self.n_samples = int(n_samples)
        self.batch_size = int(batch_size)
        self.keep_fraction = float(keep_fraction)
        self.eta = int(eta)
        self.warmup_epochs = int(warmup_epochs)
        self.bins = int(bins)
        self.seed = int(seed)
        self.rule = rule
        self.floor = float(floor)
        self.planner = planner
        self.device = torch.device(device)
        self.history = LossHistory(history_size, self.device)
        self._losses: Tensor | None = None
        self._last_update: int | None = None
        self._pending = torch.zeros(0, dtype=torch.long, device=self.device)
        # kept_* may hold device tensors between reads (no host sync while planning).
        self._counters: dict = {"seen_total": 0, "kept_total": 0, "seen_last_epoch": 0, "kept_last_epoch": 0,
                                "batches_last_epoch": 0, "trained_last_epoch": 0}

    # -- schedule -----------------------------------------------------------------
    def is_warmup(self, epoch: int) -> bool:
        """Epochs 0 .. warmup_epochs-1 (0-based) train on every sample."""
        return epoch < self.warmup_epochs

    def needs_refresh(self, epoch: int) -> bool:
        """Whether fresh per-sample losses are needed before planning this epoch.

        Never during warm-up, never for the uniform rule; always at the first online
        epoch (no losses yet, or only losses from warm-up); afterwards once ``eta``
        epochs have passed since the last.
        """
        if self.is_warmup(epoch) or self.rule == "uniform":
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

    def _keep_probabilities(self, order: Tensor) -> Tensor:
        """Keep probability of each sample of ``order`` (float64), advancing the history."""
        if self.rule == "uniform":
            if self._losses is not None:  # the buffer follows the stream as under Algorithm 3
                self.history.push(self._losses[order])
            return torch.full((order.numel(),), self.keep_fraction, dtype=torch.float64, device=self.device)
        losses = self._losses[order]
        if self.planner == "per_chunk":
            return self._with_floor(per_chunk_keep_probabilities(self.history, losses, self.batch_size,
                                                                 self.keep_fraction, self.bins))
        p = chunked_keep_probabilities(self.history.values(), losses, self.batch_size, self.history.capacity,
                                       self.keep_fraction, self.bins)
        self.history.push(losses)  # one push leaves what the per-chunk pushes would have left
        return self._with_floor(p)

    def _with_floor(self, p: Tensor) -> Tensor:
        # A mix with the uniform rule: the mean stays A, and none falls below floor * A.
        if self.floor == 0:
            return p
        return self.floor * self.keep_fraction + (1.0 - self.floor) * p

    def plan_epoch(self, epoch: int) -> list[Tensor]:
        """The index batches (int64 tensors on the device, views of one tensor) of this epoch."""
        _check_int("epoch", epoch, 0)
        gen = self._generator(epoch)
        order = torch.randperm(self.n_samples, generator=gen, device=self.device)
        if self.is_warmup(epoch):
            batches = list(order.split(self.batch_size))
            self._counters.update(batches_last_epoch=len(batches), trained_last_epoch=self.n_samples)
            return batches
        if self._losses is None and self.rule != "uniform":
            raise ValueError(f"epoch {epoch} is an online epoch but no losses were stored: call update_losses first")

        p = self._keep_probabilities(order)
        keep = torch.rand(self.n_samples, generator=gen, device=self.device, dtype=torch.float64) < p
        # A sample kept again while still waiting from last epoch is trained once. (Done
        # even when nothing waits, so that planning always issues the same operations.)
        carry = self._pending
        waiting = torch.zeros(self.n_samples, dtype=torch.bool, device=self.device).index_fill_(0, carry, True)
        fresh = keep & ~waiting[order]
        kept = order[fresh]  # the epoch's one host synchronisation: how many were kept
        queue = torch.cat([carry, kept])
        n_full = queue.numel() // self.batch_size
        batches = list(queue[: n_full * self.batch_size].split(self.batch_size)) if n_full else []
        self._pending = queue[n_full * self.batch_size:].clone()

        n_kept = keep.sum()  # stays on the device until stats() / state_dict()
        c = self._counters
        c["seen_total"] += self.n_samples
        c["kept_total"] = c["kept_total"] + n_kept
        c.update(seen_last_epoch=self.n_samples, kept_last_epoch=n_kept, batches_last_epoch=len(batches),
                 trained_last_epoch=n_full * self.batch_size)
        return batches

    # -- reporting and resuming ---------------------------------------------------------
    def _host_counters(self) -> dict:
        return {k: int(v) for k, v in self._counters.items()}

    def stats(self) -> dict:
        """Counters of the online epochs (warm-up epochs are not selections)."""
        c = self._host_counters()
        c["keep_fraction_target"] = self.keep_fraction
        c["keep_fraction_observed"] = c["kept_total"] / c["seen_total"] if c["seen_total"] else None
        c["keep_fraction_last_epoch"] = c["kept_last_epoch"] / c["seen_last_epoch"] if c["seen_last_epoch"] else None
        c["pending"] = int(self._pending.numel())
        c["last_update"] = self._last_update
        c["rule"] = self.rule
        if self.floor:
            c["floor"] = self.floor
        return c

    def state_dict(self) -> dict:
        return {
            "n_samples": self.n_samples,
            "batch_size": self.batch_size,
            "losses": None if self._losses is None else self._losses.clone(),
            "last_update": self._last_update,
            "history": self.history.state_dict(),
            "pending": self._pending.clone(),
            "counters": self._host_counters(),
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
