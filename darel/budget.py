"""Algorithm 1 (batch size for a memory budget) and equations 2-5 (selection ratios).

A budget B(t, m) allows t times the wall time T and m times the peak memory M of the
full baseline run. Algorithm 1 measures real training steps at b = 1, 2, 4, ... until
the memory reaches m * M, regresses batch size on memory and reads off the batch size
that the memory budget allows. Equations 2-5 then split the remaining time reduction
between the offline ratio alpha and the online ratio A, and choose how often (eta)
the online stage refreshes its losses.

Load-proof timing: a wall time means little on a shared machine, so no absolute probe
time is compared with the baseline's T. Every probe is timed in one session together with
a probe at the baseline's own batch B, and the baseline's T is rescaled by the ratio:
T_new = T * (t_b * N_b) / (t_B * N_B), N_x = ceil(|D| / x) steps per epoch. A load that
slows the whole session cancels.

The plan: equations 2-5 choose alpha, A and eta as the paper writes them; a fuller cost
model (warm-up epochs on the whole subset, online epochs training about A of it, a
no-grad scoring pass over the subset every eta epochs, the per-epoch planning of
Algorithm 3), expressed in the baseline run's seconds, then says how many epochs fit
t_max. Under plan enforcement the run trains exactly that many epochs.

Everything here is free of I/O and of the training framework: the caller supplies the
measurements (``measure_memory(b) -> peak_bytes`` and ``time_batches(batches) ->
{b: seconds_per_step}``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np

MIB = 2**20


@dataclass(frozen=True)
class Probe:
    """One measured training step: batch size, its step time and its peak memory."""

    batch: int
    step_time_s: float
    peak_mem_bytes: int


class BudgetError(ValueError):
    """The budget cannot be met at all (e.g. not even batch 1 fits in memory);
    ``needed_bytes`` is what the smallest step measured."""

    def __init__(self, message: str, needed_bytes: int | None = None) -> None:
        super().__init__(message)
        self.needed_bytes = needed_bytes


def _check_positive(name: str, value: float) -> None:
    if not (isinstance(value, (int, float, np.integer, np.floating)) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")


def _check_fraction(name: str, value: float) -> None:
    if not (isinstance(value, (int, float, np.integer, np.floating)) and 0.0 < float(value) <= 1.0):
        raise ValueError(f"{name} must be in (0, 1], got {value!r}")


def _check_positive_int(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def floor_pow2(x: float) -> int:
    """Largest power of two <= x (1 for x < 2)."""
    if not math.isfinite(x) or x < 2:
        return 1
    return 1 << (int(math.floor(x)).bit_length() - 1)


def probe_batch_sizes(measure_step: Callable[[int], tuple[float, int]], m_max_bytes: float,
                      max_batch: int) -> list[Probe]:
    """Measure b = 1, 2, 4, ... until a probe's memory reaches m_max or b reaches max_batch.

    Never probes beyond max_batch; when max_batch is not a power of two it is itself
    the last probe. Raises BudgetError if batch 1 already needs more than m_max.
    """
    _check_positive("m_max_bytes", m_max_bytes)
    _check_positive_int("max_batch", max_batch)
    probes: list[Probe] = []
    b = 1
    while True:
        step_s, peak = measure_step(b)
        _check_positive(f"measured step time at batch {b}", step_s)
        if not (math.isfinite(peak) and peak >= 0):
            raise ValueError(f"measured peak memory at batch {b} must be >= 0, got {peak!r}")
        probe = Probe(batch=b, step_time_s=float(step_s), peak_mem_bytes=int(peak))
        if b == 1 and probe.peak_mem_bytes > m_max_bytes:
            raise BudgetError(
                f"memory budget m_max = {m_max_bytes:.0f} bytes ({m_max_bytes / MIB:.1f} MiB) cannot hold "
                f"the model even at batch 1, which needs {probe.peak_mem_bytes} bytes "
                f"({probe.peak_mem_bytes / MIB:.1f} MiB)", needed_bytes=probe.peak_mem_bytes)
        probes.append(probe)
        if probe.peak_mem_bytes >= m_max_bytes or b >= max_batch:
            return probes
        b = min(2 * b, max_batch)


def regress_batch_on_memory(probes: list[Probe], m_max_bytes: float) -> float:
    """h(m_max): least-squares line of batch size against memory, evaluated at m_max.

    One probe gives no slope, so it scales proportionally through that point. If the
    fitted slope is not positive (memory that does not grow with batch, or noise), the
    line says nothing useful and the result is +inf: the caps in fit_batch_size decide.
    """
    if not probes:
        raise ValueError("need at least one probe, got none")
    _check_positive("m_max_bytes", m_max_bytes)
    mem = np.array([p.peak_mem_bytes for p in probes], dtype=np.float64)
    batch = np.array([p.batch for p in probes], dtype=np.float64)
    if len(probes) == 1 or np.ptp(mem) == 0:
        if mem[-1] <= 0:
            return math.inf
        return float(batch[-1] * m_max_bytes / mem[-1])
    slope, intercept = np.polyfit(mem, batch, 1)
    if not slope > 0:
        return math.inf
    return float(slope * m_max_bytes + intercept)


def fit_batch_size(probes: list[Probe], m_max_bytes: float, max_batch: int) -> int:
    """Batch size for the memory budget: h(m_max) rounded DOWN to a power of two.

    Rounding down (the paper's text; its pseudo-code writes a ceiling) keeps the
    budget. Then: capped at max_batch and at the largest probed batch (so t_b is a
    measurement, never an extrapolation), halved while its own probe measured more
    than m_max (guards against a curved memory profile), never below the largest probed
    batch whose own measurement fits m_max (a measured point beats the fitted line: at
    m = 1 the line through slightly curved memory can pass just under the baseline's own
    point), and at least 1.
    """
    _check_positive_int("max_batch", max_batch)
    h = regress_batch_on_memory(probes, m_max_bytes)
    # round() absorbs float noise from the fit, e.g. 127.99999999 meant as 128.
    b = floor_pow2(round(h, 6)) if math.isfinite(h) else max_batch
    b = max(1, min(b, max_batch, max(p.batch for p in probes)))
    measured = {p.batch: p.peak_mem_bytes for p in probes}
    while b > 1 and measured.get(b, 0) > m_max_bytes:
        b //= 2
    # Probes in the order taken; only the run of them that all fit counts as evidence.
    fitting = 1
    for p in sorted(probes, key=lambda p: p.batch):
        if p.peak_mem_bytes > m_max_bytes:
            break
        if p.batch <= max_batch and p.batch & (p.batch - 1) == 0:
            fitting = p.batch
    return max(b, fitting)


def step_time_for(probes: list[Probe], batch: int) -> float:
    """Measured step time t_b of the probe at exactly this batch size."""
    for p in probes:
        if p.batch == batch:
            return p.step_time_s
    raise ValueError(f"no probe at batch {batch}; probed batches are {[p.batch for p in probes]}")


def predicted_full_time(step_time_s: float, n_samples: int, batch: int, epochs: int) -> float:
    """T_new = t_b * ceil(|D| / b) * E: the full run's time at the budget's batch size."""
    _check_positive("step_time_s", step_time_s)
    _check_positive_int("n_samples", n_samples)
    _check_positive_int("batch", batch)
    _check_positive_int("epochs", epochs)
    return float(step_time_s) * math.ceil(n_samples / batch) * epochs


def selection_ratios(T_full_s: float, t: float, T_new_s: float, alpha_default: float = 0.8,
                     A_min: float = 0.1, A_max: float = 0.8) -> dict:
    """Equations 2-5: offline ratio alpha, online ratio A and refresh period eta.

    A = T*t / (T_new*alpha), floored at A_min; when even A_min misses the time budget
    alpha is lowered to T*t / (T_new*A). eta comes from A before clipping (3 if
    A <= 0.5, 2 if 0.5 < A < 0.8, else 1), then A is clipped to [A_min, A_max].
    """
    _check_positive("T_full_s", T_full_s)
    _check_positive("T_new_s", T_new_s)
    _check_fraction("t", t)
    _check_fraction("alpha_default", alpha_default)
    _check_fraction("A_min", A_min)
    _check_fraction("A_max", A_max)
    if A_min > A_max:
        raise ValueError(f"A_min ({A_min}) must not exceed A_max ({A_max})")

    t_max_s = T_full_s * t
    alpha = alpha_default
    # Comparing against the floor directly (not T_new*alpha*A after dividing) avoids
    # float noise lowering alpha by 1e-16 when A was computed exactly to fit.
    floor_misses_budget = t_max_s < T_new_s * alpha_default * A_min
    A_unclipped = A_min if floor_misses_budget else t_max_s / (T_new_s * alpha)
    if floor_misses_budget:
        alpha = t_max_s / (T_new_s * A_unclipped)
    if A_unclipped <= 0.5:
        eta = 3
    elif A_unclipped < 0.8:
        eta = 2
    else:
        eta = 1
    A = min(max(A_unclipped, A_min), A_max)
    return {
        "T_full_s": float(T_full_s), "t": float(t), "T_new_s": float(T_new_s), "t_max_s": float(t_max_s),
        "alpha_default": float(alpha_default), "A_min": float(A_min), "A_max": float(A_max),
        "A_unclipped": float(A_unclipped), "A": float(A), "alpha": float(alpha),
        "alpha_lowered": bool(floor_misses_budget), "eta": int(eta),
        "predicted_time_s": float(T_new_s * alpha * A),
    }


def relative_full_time(T_full_s: float, t_b_s: float, t_ref_s: float, n_samples: int, batch: int,
                       ref_batch: int) -> float:
    """T_new = T * (t_b * ceil(n/b)) / (t_B * ceil(n/B)): the baseline's measured time
    rescaled by step-time ratios taken in one session (machine speed cancels)."""
    _check_positive("T_full_s", T_full_s)
    _check_positive("t_b_s", t_b_s)
    _check_positive("t_ref_s", t_ref_s)
    for name, value in (("n_samples", n_samples), ("batch", batch), ("ref_batch", ref_batch)):
        _check_positive_int(name, value)
    return float(T_full_s) * (t_b_s * math.ceil(n_samples / batch)) / (t_ref_s * math.ceil(n_samples / ref_batch))


def epoch_kinds(epochs: int, warmup_epochs: int, eta: int) -> list[str]:
    """Kind of every epoch of an online run, as Algorithm 3's sampler schedules them:
    "warmup" for the first omega epochs, then "refresh" (a scoring pass first) at the
    first online epoch and every eta epochs after it, "reuse" in between."""
    _check_positive_int("epochs", epochs)
    _check_positive_int("eta", eta)
    if isinstance(warmup_epochs, bool) or not isinstance(warmup_epochs, int) or warmup_epochs < 0:
        raise ValueError(f"warmup_epochs must be a non-negative integer, got {warmup_epochs!r}")
    kinds: list[str] = []
    last_refresh: int | None = None
    for epoch in range(epochs):
        if epoch < warmup_epochs:
            kinds.append("warmup")
        elif last_refresh is None or epoch - last_refresh >= eta:
            kinds.append("refresh")
            last_refresh = epoch
        else:
            kinds.append("reuse")
    return kinds


def online_epoch_costs(*, seconds_per_probe_second: float, t_b_s: float, batch: int, n_kept: int,
                       keep_fraction: float, t_score_s: float, score_batch: int, t_plan_s: float) -> dict[str, float]:
    """Predicted seconds of each epoch kind, in the baseline run's seconds.

    warmup:  every kept sample once, ceil(n_kept / b) steps;
    reuse:   the full batches Algorithm 3 emits, floor(A * n_kept / b) steps, plus planning;
    refresh: reuse plus a no-grad scoring pass over the kept set, ceil(n_kept / e) batches.
    ``seconds_per_probe_second`` = T / (baseline steps * t_B) converts probe seconds.
    """
    _check_positive("seconds_per_probe_second", seconds_per_probe_second)
    _check_positive("t_b_s", t_b_s)
    _check_positive("t_score_s", t_score_s)
    _check_fraction("keep_fraction", keep_fraction)
    for name, value in (("batch", batch), ("n_kept", n_kept), ("score_batch", score_batch)):
        _check_positive_int(name, value)
    if not (math.isfinite(t_plan_s) and t_plan_s >= 0):
        raise ValueError(f"t_plan_s must be >= 0, got {t_plan_s!r}")
    k = float(seconds_per_probe_second)
    warmup = k * t_b_s * math.ceil(n_kept / batch)
    reuse = k * (t_b_s * math.floor(keep_fraction * n_kept / batch) + t_plan_s)
    refresh = reuse + k * t_score_s * math.ceil(n_kept / score_batch)
    return {"warmup": float(warmup), "refresh": float(refresh), "reuse": float(reuse)}


def plan_epochs(costs: dict[str, float], kinds: list[str], t_max_s: float) -> dict:
    """The most epochs (in schedule order, at least one) whose predicted time fits t_max."""
    _check_positive("t_max_s", t_max_s)
    if not kinds:
        raise ValueError("kinds is empty")
    cumulative: list[float] = []
    total = 0.0
    for kind in kinds:
        total += costs[kind]
        cumulative.append(total)
    fitting = sum(1 for value in cumulative if value <= t_max_s * (1 + 1e-9))
    planned = max(1, fitting)
    return {"planned_epochs": int(planned), "predicted_time_s": float(cumulative[planned - 1]),
            "predicted_adherence": float(cumulative[planned - 1] / t_max_s),
            "plan_exceeds_budget": bool(fitting == 0), "epoch_kinds": kinds[:planned]}


def probe_memory(measure_memory: Callable[[int], int], m_max_bytes: float, max_batch: int) -> list[tuple[int, int]]:
    """Algorithm 1's probe loop on memory alone: [(b, peak bytes)] for b = 1, 2, 4, ...
    (see ``probe_batch_sizes``)."""
    probes = probe_batch_sizes(lambda b: (1.0, measure_memory(b)), m_max_bytes, max_batch)
    return [(p.batch, p.peak_mem_bytes) for p in probes]


def calibrate(measure_memory: Callable[[int], int], time_batches: Callable[[list[int]], dict[int, float]],
              T_full_s: float, M_full_bytes: float, t: float, m: float, n_samples: int, epochs: int,
              max_batch: int, alpha_default: float = 0.8, A_min: float = 0.1, A_max: float = 0.8) -> dict:
    """Algorithm 1 followed by equations 2-5 for budget B(t, m); one flat JSON-ready dict.

    ``measure_memory(b)`` gives the peak memory of a training step at batch b;
    ``time_batches(batches)`` times steps at every listed batch in one session (the
    baseline batch ``max_batch`` always among them). Every input and intermediate is
    returned so that the numbers can be recomputed from the artifact alone.
    """
    _check_positive("T_full_s", T_full_s)
    _check_positive("M_full_bytes", M_full_bytes)
    _check_fraction("t", t)
    _check_fraction("m", m)
    _check_positive_int("n_samples", n_samples)
    _check_positive_int("epochs", epochs)
    _check_positive_int("max_batch", max_batch)
    m_max_bytes = float(m) * float(M_full_bytes)
    memory = probe_memory(measure_memory, m_max_bytes, max_batch)
    timed = sorted({b for b, _ in memory} | {max_batch})
    times = time_batches(timed)
    missing = [b for b in timed if b not in times]
    if missing:
        raise ValueError(f"time_batches returned no time for batches {missing}")
    for b in timed:
        _check_positive(f"measured step time at batch {b}", times[b])
    probes = [Probe(batch=b, step_time_s=float(times[b]), peak_mem_bytes=int(peak)) for b, peak in memory]
    unrounded = regress_batch_on_memory(probes, m_max_bytes)
    batch = fit_batch_size(probes, m_max_bytes, max_batch)
    t_b = step_time_for(probes, batch)
    t_ref = float(times[max_batch])
    T_new = relative_full_time(T_full_s, t_b, t_ref, n_samples, batch, max_batch)
    ratios = selection_ratios(T_full_s, t, T_new, alpha_default, A_min, A_max)
    return {
        "T_full_s": float(T_full_s), "M_full_bytes": float(M_full_bytes), "t": float(t), "m": float(m),
        "t_max_s": float(T_full_s) * float(t), "m_max_bytes": m_max_bytes,
        "probes": [asdict(p) for p in probes],
        "reference_batch": int(max_batch), "t_ref_s": t_ref,
        # JSON has no infinity: a non-positive slope is recorded as null.
        "fitted_batch_unrounded": unrounded if math.isfinite(unrounded) else None,
        "batch": int(batch), "t_b_s": float(t_b), "n_samples": int(n_samples), "epochs": int(epochs),
        # The paper's absolute T_new from this session's probe, for comparison only.
        "T_new_absolute_s": predicted_full_time(t_b, n_samples, batch, epochs),
        "T_new_s": float(T_new), **ratios,
    }
