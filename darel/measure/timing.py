"""Time: synchronised step timings for Algorithm 1's probes, the training state put back
after them, and ``TimedWork``: wall time and energy over exactly the same intervals."""

from __future__ import annotations

import contextlib
import logging
import math
import statistics
import time
from typing import Any, Callable, Iterator

import psutil
import torch
from torch import nn

from darel.measure.energy import EnergyTracker
from darel.sgd import Optimizer

log = logging.getLogger(__name__)


def _to_cpu_copy(value: Any) -> Any:
    """Deep copy with every tensor cloned to host memory, so that the saved state does
    not itself occupy (and inflate the measured peak of) the accelerator."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {key: _to_cpu_copy(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_to_cpu_copy(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_to_cpu_copy(item) for item in value)
    return value


def sync(device: torch.device | str) -> None:
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def preserved_training_state(model: nn.Module, optimizer: Optimizer, extra: Any = None,
                             device: torch.device | str = "cpu") -> Iterator[None]:
    """Run probes on a model and put everything back afterwards: weights and buffers,
    optimiser state, gradients, train/eval mode, the global RNG and ``extra`` (an object
    with state_dict/load_state_dict, e.g. a TrainStep's loss scaler)."""
    device = torch.device(device)
    params = list(model.parameters())
    saved_model = _to_cpu_copy(model.state_dict())
    saved_optimizer = _to_cpu_copy(optimizer.state_dict())
    saved_extra = _to_cpu_copy(extra.state_dict()) if extra is not None else None
    saved_grads = [None if p.grad is None else p.grad.detach().to("cpu", copy=True) for p in params]
    was_training = model.training
    cpu_rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    try:
        yield
    finally:
        model.load_state_dict(saved_model)
        optimizer.load_state_dict(saved_optimizer)
        if extra is not None:
            extra.load_state_dict(saved_extra)
        for p, grad in zip(params, saved_grads):
            p.grad = None if grad is None else grad.to(p.device)
        model.train(was_training)
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state(cuda_rng, device)


def time_passes(passes: dict[Any, Callable[[], None]], device: torch.device | str, *, warmup: int = 2,
                repeats: int = 3, rounds: int = 3) -> dict[Any, float]:
    """Median time of each pass, measured in interleaved rounds.

    Each round runs every pass ``repeats`` times (after ``warmup`` untimed runs before
    the first round) before moving to the next pass, and the rounds alternate the order.
    A change of the machine's load during the session then hits every pass alike, so the
    ratios between passes (what the budget uses) stay meaningful on a busy machine.

    The clock: on a GPU, wall time between device synchronisations; on a CPU, the
    process's CPU time, so time spent waiting for a core that another program holds is
    not counted (with one torch thread that is the step's compute time; wall time on a
    loaded 2-core machine swings the ratio of a small to a large batch by tens of percent).
    """
    for name, value in (("repeats", repeats), ("rounds", rounds)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be a non-negative integer, got {warmup!r}")
    if not passes:
        raise ValueError("no passes to time")
    device = torch.device(device)
    clock = time.perf_counter if device.type == "cuda" else time.process_time
    names = list(passes)
    for name in names:
        for _ in range(warmup):
            passes[name]()
    samples: dict[Any, list[float]] = {name: [] for name in names}
    for round_index in range(rounds):
        order = names if round_index % 2 == 0 else names[::-1]
        for name in order:
            for _ in range(repeats):
                sync(device)
                started = clock()
                passes[name]()
                sync(device)
                samples[name].append(clock() - started)
    return {name: float(statistics.median(values)) for name, values in samples.items()}


PROBE_CLOCK = {"cuda": "wall time between device synchronisations",
               "cpu": "process CPU time (time waiting for a core is not counted)"}


_INTERVAL_ENERGY_KEYS = ("energy_kwh", "cpu_energy_kwh", "ram_energy_kwh", "gpu_energy_kwh", "co2e_kg")


def machine_busy_cpu_s() -> float:
    """CPU seconds every process of this machine has run so far (all cores; waiting for
    I/O, idling and time the hypervisor gave to other machines are not counted)."""
    times = psutil.cpu_times()
    return float(times.user + times.nice + times.system + getattr(times, "irq", 0.0) + getattr(times, "softirq", 0.0))


def cores_beside(cpu_beside_s: float, wall_time_s: float) -> float | None:
    """How many cores other processes kept busy, on average, while a run's timed work ran.
    The machine's counters tick in 10 ms steps, so an idle machine may read slightly below 0."""
    if not math.isfinite(cpu_beside_s) or wall_time_s <= 0:
        return None
    return max(0.0, cpu_beside_s) / wall_time_s


class Stopwatch:
    """The seconds of one piece of work on the probes' clock (``PROBE_CLOCK``): ``with
    watch:`` around it, then ``watch.seconds`` (e.g. the scoring pass whose time the total
    accounting charges to the methods that use its losses)."""

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self.clock = time.perf_counter if self.device.type == "cuda" else time.process_time
        self.seconds = 0.0

    def __enter__(self) -> Stopwatch:
        sync(self.device)
        self._started = self.clock()
        return self

    def __exit__(self, *exc) -> None:
        sync(self.device)
        self.seconds += self.clock() - self._started


class TimedWork:
    """Time and energy of exactly the same intervals.

    ``with work.interval():`` brackets timed work (a training epoch, its scoring pass
    included); energy comes from two tracker readings around the same moments, so boost
    and CO2e cut are ratios over the same work. What happens between intervals
    (evaluation, checkpoint writes) is in neither. The totals survive a restart:
    ``state_dict`` goes into the checkpoint and ``load_state_dict`` adds the earlier
    segments, so a resumed run reports the whole run.

    The clock of ``time_s`` is the calibration's (``PROBE_CLOCK``): on a GPU the wall time
    between device synchronisations; on a CPU the process's CPU time, so a budget planned
    from the probes and the run it planned are measured alike, and a neighbour holding a
    core does not change a cell's time. ``wall_time_s`` is kept beside it (the same on a
    GPU). ``cpu_beside_s`` is what other processes ran meanwhile: the machine's busy CPU
    seconds over the same intervals less this process's own, so a time measured beside a
    neighbour (a second training on the other core, a user's browser) says so in its
    record. It is the host's CPU on a GPU too.
    """

    def __init__(self, tracker: EnergyTracker | None, device: torch.device | str) -> None:
        self.tracker = tracker
        self.device = torch.device(device)
        self.time_s = 0.0
        self.wall_time_s = 0.0
        self.cpu_beside_s = 0.0
        self.clock = time.perf_counter if self.device.type == "cuda" else time.process_time
        self.clock_name = PROBE_CLOCK.get(self.device.type, PROBE_CLOCK["cpu"])
        self.tracker_duration_s = 0.0
        self.energy = {key: 0.0 for key in _INTERVAL_ENERGY_KEYS}
        self.intervals = 0
        self.segments = 1
        self.energy_gaps = 0  # intervals without a valid reading (tracking failed)
        self.last_interval_s = 0.0
        self._intensity: float | None = None
        # One-off work inside an interval that is not the training's (torch.compile's
        # compilation): its clock seconds, taken out of the interval and kept here.
        self.excluded_s = 0.0
        self._window: dict[str, float] | None = None  # what the open interval's excluded windows took

    def _intensity_now(self) -> float:
        if self._intensity is None:
            self._intensity = self.tracker.carbon_intensity_kg_per_kwh() if self.tracker else float("nan")
        return self._intensity

    def _marks(self, *, end: bool = False) -> tuple[dict | None, float, float, float, float]:
        """The readings an interval (or an excluded window) is the difference of. The energy
        reading lies outside the clocks' span on both sides: its own cost is in no time."""
        sync(self.device)
        if not end:
            reading = self.tracker.reading() if self.tracker else None
        clocks = (self.clock(), time.perf_counter(), time.process_time(), machine_busy_cpu_s())
        if end:
            reading = self.tracker.reading() if self.tracker else None
        return (reading, *clocks)

    @staticmethod
    def _between(start: tuple, end: tuple) -> dict[str, float]:
        """Clock, wall, own and machine CPU seconds and energy between two marks (``gap``
        1 and no energy keys when a reading is missing)."""
        (before, clock0, wall0, own0, machine0), (after, clock1, wall1, own1, machine1) = start, end
        spent = {"clock": clock1 - clock0, "wall": wall1 - wall0, "own": own1 - own0, "machine": machine1 - machine0}
        if before is None or after is None:
            spent["gap"] = 1.0
        else:
            spent["tracker"] = after["at"] - before["at"]
            for key in ("energy_kwh", "cpu_energy_kwh", "ram_energy_kwh", "gpu_energy_kwh"):
                spent[key] = after[key] - before[key]
        return spent

    @contextlib.contextmanager
    def interval(self) -> Iterator[None]:
        start = self._marks()
        self._window = {}
        try:
            yield
        finally:
            window, self._window = self._window, None
        spent = self._between(start, self._marks(end=True))
        # A window without readings leaves the interval's energy on no common footing.
        window_gap = window.pop("gap", 0.0)
        for key, value in window.items():  # the excluded windows inside it are not its work
            spent[key] = spent.get(key, 0.0) - value
        self.time_s += spent["clock"]
        self.wall_time_s += spent["wall"]
        self.cpu_beside_s += spent["machine"] - spent["own"]
        self.last_interval_s = spent["clock"]
        self.intervals += 1
        if spent.get("gap") or window_gap:
            self.energy_gaps += 1
            return
        self.tracker_duration_s += spent["tracker"]
        for key in ("energy_kwh", "cpu_energy_kwh", "ram_energy_kwh", "gpu_energy_kwh"):
            self.energy[key] += spent[key]
        self.energy["co2e_kg"] += spent["energy_kwh"] * self._intensity_now()

    @contextlib.contextmanager
    def excluded(self) -> Iterator[None]:
        """Inside an interval: work that is not the training's (a step's compilation, paid
        once per process and batch shape) leaves the interval's time, wall time, CPU beside
        and energy alike, so they stay measures of one footing; its clock seconds are kept in
        ``excluded_s``. Outside an interval it is untimed anyway (a no-op)."""
        if self._window is None:
            yield
            return
        start = self._marks()
        try:
            yield
        finally:
            spent = self._between(start, self._marks(end=True))
            for key, value in spent.items():
                self._window[key] = self._window.get(key, 0.0) + value
            self.excluded_s += spent["clock"]

    def state_dict(self) -> dict:
        return {"time_s": self.time_s, "wall_time_s": self.wall_time_s, "cpu_beside_s": self.cpu_beside_s,
                "tracker_duration_s": self.tracker_duration_s,
                "energy": dict(self.energy),
                "intervals": self.intervals, "segments": self.segments, "energy_gaps": self.energy_gaps,
                "excluded_s": self.excluded_s}

    def load_state_dict(self, state: dict) -> None:
        self.time_s = float(state["time_s"])
        self.wall_time_s = float(state["wall_time_s"])
        # A checkpoint written before the neighbour was measured: the earlier segments' is unknown.
        self.cpu_beside_s = float(state.get("cpu_beside_s", math.nan))
        self.tracker_duration_s = float(state["tracker_duration_s"])
        self.energy = {key: float(state["energy"][key]) for key in _INTERVAL_ENERGY_KEYS}
        self.intervals = int(state["intervals"])
        self.segments = int(state["segments"]) + 1
        self.energy_gaps = int(state["energy_gaps"])
        self.excluded_s = float(state.get("excluded_s", 0.0))  # checkpoints before it had none

    def energy_record(self, session: dict[str, Any], pue: float) -> dict[str, Any]:
        """The run's energy in the keys of ``EnergyTracker.stop()``: totals of the timed
        intervals of every segment; device counts and labels from this segment's tracker
        session (``session``, the result of ``stop()``)."""
        record = dict(session)
        duration = self.tracker_duration_s
        if self.energy_gaps or not self.intervals:
            why = (f"{self.energy_gaps} of {self.intervals} timed intervals have no energy reading"
                   if self.intervals else "no timed interval")
            for key in (*_INTERVAL_ENERGY_KEYS, "duration_s", "cpu_power_w", "ram_power_w", "gpu_power_w",
                        "carbon_intensity_kg_per_kwh"):
                record[key] = float("nan")
            record["energy_source"] = f"unavailable: {why}; {session.get('energy_source')}"
            record["energy_covers"] = "nothing"
            return record
        n_gpus = session.get("n_gpus")
        n_gpus = int(n_gpus) if isinstance(n_gpus, (int, float)) and math.isfinite(n_gpus) else 0

        def mean_power_w(kwh: float, devices: int = 1) -> float:
            if devices <= 0:
                return 0.0
            return kwh * 3.6e6 / duration / pue / devices if duration > 0 else float("nan")

        record.update(
            energy_kwh=self.energy["energy_kwh"], co2e_kg=self.energy["co2e_kg"],
            cpu_energy_kwh=self.energy["cpu_energy_kwh"], ram_energy_kwh=self.energy["ram_energy_kwh"],
            gpu_energy_kwh=self.energy["gpu_energy_kwh"], duration_s=duration,
            cpu_power_w=mean_power_w(self.energy["cpu_energy_kwh"]),
            ram_power_w=mean_power_w(self.energy["ram_energy_kwh"]),
            gpu_power_w=mean_power_w(self.energy["gpu_energy_kwh"], n_gpus),
            carbon_intensity_kg_per_kwh=(self.energy["co2e_kg"] / self.energy["energy_kwh"]
                                         if self.energy["energy_kwh"] > 0 else float("nan")),
            timed_intervals=self.intervals, segments=self.segments,
            energy_covers=("the timed intervals of the whole run" if self.segments == 1 else
                           f"the timed intervals of the whole run ({self.segments} segments, resumed)"),
        )
        return record
