"""Measurements behind Table 1: peak training memory per step, the wall time of one
training step (Algorithm 1's probes), energy and CO2e through codecarbon, and the
paper's Eq. 6. Nothing here writes files."""

from __future__ import annotations

import contextlib
import logging
import math
import resource
import statistics
import sys
import threading
import time
import weakref
from typing import Any, Callable, Iterator

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

log = logging.getLogger(__name__)

CPU_MEMORY_SOURCE = "cpu-live-tensors (peak bytes of live tensor storages per pass, counted by a dispatch mode)"
CUDA_MEMORY_SOURCE = "torch.cuda.max_memory_allocated (peak of torch's caching allocator per step)"


# ----------------------------------------------------------------------------- memory


def _storage_key_and_bytes(tensor: torch.Tensor) -> tuple[int, int] | None:
    """(data pointer, bytes) of the storage behind ``tensor``; None when it has none
    (sparse, meta or other exotic tensors), so such tensors are simply not counted."""
    try:
        storage = tensor.untyped_storage()
        return storage.data_ptr(), storage.nbytes()
    except (RuntimeError, NotImplementedError, TypeError):
        return None


def _tensors_in(value: Any) -> Iterator[torch.Tensor]:
    """Every tensor inside an optimizer state entry (tensors, dicts, lists, tuples)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors_in(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors_in(item)


def _process_peak_rss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports kilobytes, macOS bytes.
    return int(peak if sys.platform == "darwin" else peak * 1024)


def open_nvml(device: torch.device | str | int) -> tuple[Any | None, str]:
    """An NVML handle for a CUDA device, or (None, why not). Never raises: NVML is an
    optional second opinion on memory, and a machine without a driver is normal."""
    try:
        import pynvml
    except ImportError as err:
        return None, f"NVML not used: pynvml is not importable ({err})"
    device = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
    if device.type != "cuda":
        return None, f"NVML not used: device is {device.type}, not cuda"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        return None, f"NVML unavailable: nvmlInit failed ({type(err).__name__}: {err})"
    index = device.index if device.index is not None else torch.cuda.current_device()
    try:
        # CUDA_VISIBLE_DEVICES can renumber devices; torch knows the NVML index.
        nvml_index = torch.cuda._get_nvml_device_index(index)  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - private helper; fall back to the CUDA index
        nvml_index = index
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(nvml_index)
        name = pynvml.nvmlDeviceGetName(handle)
    except pynvml.NVMLError as err:
        return None, f"NVML unavailable: no handle for device {nvml_index} ({type(err).__name__}: {err})"
    if isinstance(name, bytes):
        name = name.decode(errors="replace")
    return handle, f"ok: NVML device {nvml_index} ({name}), used memory sampled after every batch"


class _LiveTensorCounter(TorchDispatchMode):
    """Bytes of live tensor storages while a pass runs on the CPU.

    Every operator's outputs are seen here (forward, autograd's backward and the
    optimiser's kernels alike); each distinct storage is counted once, while any tensor
    that references it is alive, and released when the last one dies (weak-reference
    finalisers: torch keeps a tensor's Python object alive as long as C++ holds it, for
    example as a tensor saved for backward). Tensors alive at the start (parameters,
    gradients, optimiser state) are tracked the same way, so freeing an old gradient
    inside the pass is seen too. Allocations an operator makes internally and frees
    before returning (scratch buffers) are not visible: the figure is the peak of live
    tensor bytes, a deterministic lower bound of resident memory.
    """

    def __init__(self) -> None:
        super().__init__()
        self._refs: dict[int, int] = {}
        self._sizes: dict[int, int] = {}
        self._finalizers: list[weakref.finalize] = []
        self.current = 0
        self.peak = 0

    def track(self, tensor: torch.Tensor) -> None:
        found = _storage_key_and_bytes(tensor)
        if found is None or found[1] == 0:
            return
        ptr, nbytes = found
        if ptr not in self._refs:
            self._refs[ptr] = 0
            self._sizes[ptr] = nbytes
            self.current += nbytes
            self.peak = max(self.peak, self.current)
        self._refs[ptr] += 1
        self._finalizers.append(weakref.finalize(tensor, self._release, ptr))

    def _release(self, ptr: int) -> None:
        left = self._refs.get(ptr)
        if left is None:
            return
        if left > 1:
            self._refs[ptr] = left - 1
            return
        del self._refs[ptr]
        self.current -= self._sizes.pop(ptr)

    def close(self) -> None:
        """Drop the finalisers left on long-lived tensors (parameters, state)."""
        for finalizer in self._finalizers:
            finalizer.detach()
        self._finalizers.clear()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for item in tree_flatten(out)[0]:
            if isinstance(item, torch.Tensor):
                self.track(item)
        return out


class StepMemoryMeter:
    """Peak memory of a run's passes: ``with meter.step(key, kind=...):`` around each
    training step, scoring batch and evaluation batch, so the cell's peak is the maximum
    over every pass it runs (``peak_bytes``; per kind in ``peak_by_kind``).

    On CUDA the figure is torch's peak allocation within each pass (the data set on the
    device included); NVML's view of the whole device's used memory (what the paper's
    pynvml reads, including the CUDA context and the allocator's cache) is kept beside it
    as ``nvml_peak_bytes``. On CPU torch keeps no allocator peak, so the meter counts
    live tensors with a dispatch mode (``_LiveTensorCounter``): parameters, gradients,
    optimiser state and everything the pass creates, at its peak. On CPU that figure
    depends only on the shapes and the operator sequence, so passes with a ``key`` (e.g.
    the batch size) are counted on their first ``cpu_samples_per_key`` occurrences only
    (the first step of a run creates the optimiser state, the second is the steady state):
    the counting costs Python work per operator. A pass inside a timed interval can hand
    over a ``replay`` callable instead of being counted in place: the meter then runs it
    under counting at ``flush()``, after the interval, so the counting's own cost never
    enters a measured time (on a CPU; on a GPU the allocator's peak costs nothing and is
    read in place). The process's peak RSS is recorded for information.
    """

    cpu_samples_per_key = 2

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer | None, device: torch.device | str) -> None:
        self.model = model
        self.optimizer = optimizer
        self.device = torch.device(device)
        self.peak_bytes = 0
        self.peak_by_kind: dict[str, int] = {}
        self.steps = 0
        self.rss_peak_bytes = _process_peak_rss_bytes()
        self.nvml_peak_bytes: int | None = None
        self._nvml_handle: Any | None = None
        self._measured_keys: dict = {}
        self._deferred: list[tuple[str, Callable[[], None]]] = []
        if self.device.type == "cuda":
            self.source = CUDA_MEMORY_SOURCE
            self._nvml_handle, self.nvml_status = open_nvml(self.device)
        else:
            self.source = CPU_MEMORY_SOURCE
            self.nvml_status = f"NVML not used: device is {self.device.type}, not cuda"

    def _record(self, kind: str, peak: int) -> None:
        self.peak_bytes = max(self.peak_bytes, peak)
        self.peak_by_kind[kind] = max(self.peak_by_kind.get(kind, 0), peak)

    @contextlib.contextmanager
    def step(self, key: Any = None, kind: str = "train", replay: Callable[[], None] | None = None) -> Iterator[None]:
        if self.device.type == "cuda":
            with self._cuda_step(kind):
                yield
        elif key is not None and self._measured_keys.get((kind, key), 0) >= self.cpu_samples_per_key:
            yield
        elif replay is not None:
            self._deferred.append((kind, replay))
            self._measured_keys[(kind, key)] = self._measured_keys.get((kind, key), 0) + 1
            yield
        else:
            with self._cpu_step(kind):
                yield
            if key is not None:
                self._measured_keys[(kind, key)] = self._measured_keys.get((kind, key), 0) + 1
        self.steps += 1
        self.rss_peak_bytes = max(self.rss_peak_bytes, _process_peak_rss_bytes())

    def wants(self, key: Any, kind: str = "train") -> bool:
        """Whether a pass of this key would be counted (on a GPU every pass is read)."""
        return self.device.type == "cuda" or self._measured_keys.get((kind, key), 0) < self.cpu_samples_per_key

    def flush(self, around: Callable[[], contextlib.AbstractContextManager] | None = None) -> None:
        """Count the passes handed over as replays (``around()`` is entered first, outside
        the counting: e.g. a context that saves and restores the training state)."""
        deferred, self._deferred = self._deferred, []
        if not deferred:
            return
        with around() if around is not None else contextlib.nullcontext():
            for kind, replay in deferred:
                with self._cpu_step(kind):
                    replay()

    @contextlib.contextmanager
    def _cuda_step(self, kind: str) -> Iterator[None]:
        torch.cuda.reset_peak_memory_stats(self.device)
        yield
        # The caching allocator records allocations when ops are issued, so no sync is needed.
        self._record(kind, int(torch.cuda.max_memory_allocated(self.device)))
        if self._nvml_handle is not None:
            import pynvml

            try:
                used = int(pynvml.nvmlDeviceGetMemoryInfo(self._nvml_handle).used)
            except pynvml.NVMLError as err:
                self._nvml_handle = None
                self.nvml_status = f"NVML stopped: nvmlDeviceGetMemoryInfo failed ({err})"
            else:
                self.nvml_peak_bytes = max(self.nvml_peak_bytes or 0, used)

    def _resident(self) -> Iterator[torch.Tensor]:
        params = list(self.model.parameters())
        yield from params
        yield from (p.grad for p in params if p.grad is not None)
        yield from self.model.buffers()
        if self.optimizer is not None:
            yield from _tensors_in(list(self.optimizer.state.values()))

    @contextlib.contextmanager
    def _cpu_step(self, kind: str) -> Iterator[None]:
        counter = _LiveTensorCounter()
        for tensor in self._resident():
            counter.track(tensor)
        try:
            # Compiled code runs eagerly while counted: under a dispatch mode torch.compile
            # would give up on the compiled frame for the rest of the process. The count is
            # therefore of the eager operators (labelled so in docs/deviations.md).
            with torch.compiler.set_stance("force_eager"), counter:
                yield
        finally:
            counter.close()
        self._record(kind, counter.peak)


# ----------------------------------------------------------------------------- step timing


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
def preserved_training_state(model: nn.Module, optimizer: torch.optim.Optimizer, extra: Any = None,
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


# ----------------------------------------------------------------------------- energy


ENERGY_KEYS = (
    "energy_kwh", "co2e_kg", "duration_s", "cpu_power_w", "ram_power_w", "gpu_power_w",
    "cpu_energy_kwh", "ram_energy_kwh", "gpu_energy_kwh", "carbon_intensity_kg_per_kwh",
    "country_iso_code", "pue", "n_gpus", "energy_source", "codecarbon_version",
    "tracking_mode", "codecarbon_cpu_power_w", "codecarbon_ram_power_w", "codecarbon_gpu_power_w",
)

_TRACKING_MODES = ("process", "machine")


def _codecarbon_version() -> str:
    try:
        from codecarbon._version import __version__

        return str(__version__)
    except Exception:  # noqa: BLE001 - only a label
        return "unavailable"


def _codecarbon_countries() -> set[str] | None:
    """ISO codes of codecarbon's bundled carbon-intensity table; None if unreadable
    (then codecarbon itself is probably broken, and stop() will say so)."""
    try:
        from codecarbon.input import DataSource

        return set(DataSource().get_global_energy_mix_data())
    except Exception:  # noqa: BLE001 - validation is a convenience
        return None


def _serialised_tracker_class() -> type:
    """codecarbon's offline tracker with two timing faults of its periodic measurement
    (codecarbon 3.3.2) repaired; both show when the training loop holds the GIL, which
    slows one measurement to a second or more:

    * a measurement slower than ``measure_power_secs`` overlaps the next; both
      integrate power from the same start time and the energy is counted twice.
      A lock makes measurements take turns.
    * each device's window ends when that device is read, but the next window starts
      when the whole measurement has finished; the time spent measuring is lost
      (about 30 % of the energy with 1 s intervals and a pure-Python loop). While a
      measurement runs, ``_last_measured_time`` reads shifted by the time elapsed since
      it began, so every device integrates over the same window, and the next window
      starts exactly where this one ended.

    Only private names of codecarbon are involved; if they change, the tracker falls
    back to codecarbon's own timing (the test of energy = power x time would catch it).
    """
    from codecarbon import OfflineEmissionsTracker

    class SerialisedOfflineTracker(OfflineEmissionsTracker):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self._darel_measure_lock = threading.Lock()
            self._darel_window_end: float | None = None
            self._darel_window_start = time.perf_counter()
            super().__init__(*args, **kwargs)

        @property
        def _last_measured_time(self) -> float:
            if self._darel_window_end is None:
                return self._darel_window_start
            return self._darel_window_start + (time.perf_counter() - self._darel_window_end)

        @_last_measured_time.setter
        def _last_measured_time(self, value: float) -> None:
            self._darel_window_start = value

        def _measure_power_and_energy(self) -> None:
            with self._darel_measure_lock:
                began = time.perf_counter()
                self._darel_window_end = began
                try:
                    super()._measure_power_and_energy()
                finally:
                    self._darel_window_end = None
                self._darel_window_start = began

    return SerialisedOfflineTracker


class EnergyTracker:
    """Energy and CO2e of a training run through codecarbon's offline tracker (no
    network: the carbon intensity comes from its bundled table for the country).

    ``tracking_mode="process"`` (default) attributes to the run only the CPU load of
    this process and its children; on a machine shared by parallel workflow jobs,
    "machine" would charge each cell for its neighbours' work. RAM is codecarbon's
    size-based estimate and GPUs are read from NVML counters in both modes.

    ``stop()`` never raises: if codecarbon fails, every number is NaN and
    ``energy_source`` says what failed, so a measurement problem cannot lose a run.
    """

    def __init__(self, country_iso_code: str, pue: float = 1.0, measure_power_secs: float = 1.0,
                 tracking_mode: str = "process") -> None:
        if not (isinstance(country_iso_code, str) and len(country_iso_code) == 3 and country_iso_code.isalpha()):
            raise ValueError(f"country_iso_code must be a 3-letter ISO code, got {country_iso_code!r}")
        if not (isinstance(pue, (int, float)) and math.isfinite(pue) and pue >= 1.0):
            raise ValueError(f"pue must be a finite number >= 1, got {pue!r}")
        if not (isinstance(measure_power_secs, (int, float)) and measure_power_secs > 0):
            raise ValueError(f"measure_power_secs must be > 0, got {measure_power_secs!r}")
        if tracking_mode not in _TRACKING_MODES:
            raise ValueError(f"tracking_mode must be one of {_TRACKING_MODES}, got {tracking_mode!r}")
        self.country_iso_code = country_iso_code.upper()
        known = _codecarbon_countries()
        if known is not None and self.country_iso_code not in known:
            # codecarbon would only log this and fall back to a world-average intensity.
            raise ValueError(f"country_iso_code {country_iso_code!r} is not in codecarbon's energy-mix table")
        self.pue = float(pue)
        self.measure_power_secs = float(measure_power_secs)
        self.tracking_mode = tracking_mode
        self._tracker: Any | None = None
        self._failure: str | None = None
        self._started = False

    def start(self) -> None:
        if self._started:
            raise RuntimeError("EnergyTracker.start() called twice")
        self._started = True
        try:
            tracker_class = _serialised_tracker_class()
            # After the import (which sets its own level), before construction (which
            # warns before applying log_level).
            logging.getLogger("codecarbon").setLevel(logging.ERROR)
            self._tracker = tracker_class(
                country_iso_code=self.country_iso_code,
                pue=self.pue,
                measure_power_secs=self.measure_power_secs,
                tracking_mode=self.tracking_mode,
                allow_multiple_runs=True,  # no lock file: parallel jobs may each track
                output_methods=[],  # no CSV/API/logger output: save_to_file=False, undeprecated
                log_level="error",
                project_name="darel",
            )
            self._tracker.start()
            if getattr(self._tracker, "_start_time", None) is None:
                self._failure = "codecarbon start() did not start (its errors are logged, not raised)"
        except Exception as err:  # noqa: BLE001 - energy is optional, training is not
            self._failure = f"codecarbon failed to start: {type(err).__name__}: {err}"
            log.warning("energy tracking disabled: %s", self._failure)

    def stop(self) -> dict[str, Any]:
        if not self._started:
            raise RuntimeError("EnergyTracker.stop() called before start()")
        tracker, self._tracker = self._tracker, None
        if tracker is None or self._failure is not None:
            self._halt_threads(tracker)
            return self._failed(self._failure or "codecarbon tracker missing")
        try:
            tracker.stop()
            data = getattr(tracker, "final_emissions_data", None)
            if data is None:
                return self._failed("codecarbon stop() produced no emissions data (its errors are logged, not raised)")
            return self._result(tracker, data)
        except Exception as err:  # noqa: BLE001 - see class docstring
            log.warning("energy tracking failed at stop: %s", err)
            return self._failed(f"codecarbon failed at stop: {type(err).__name__}: {err}")
        finally:
            self._halt_threads(tracker)

    def reading(self) -> dict[str, float] | None:
        """Cumulative energies since start (kWh, PUE included) after a fresh measurement,
        with the moment it was taken; None once tracking has failed. Two readings bracket
        an interval exactly: each forces codecarbon to integrate power up to that moment."""
        tracker = self._tracker
        if tracker is None or self._failure is not None:
            return None
        try:
            tracker._measure_power_and_energy()
            return {
                "at": time.perf_counter(),
                "energy_kwh": float(tracker._total_energy.kWh),
                "cpu_energy_kwh": float(tracker._total_cpu_energy.kWh),
                "ram_energy_kwh": float(tracker._total_ram_energy.kWh),
                "gpu_energy_kwh": float(tracker._total_gpu_energy.kWh),
            }
        except Exception as err:  # noqa: BLE001 - energy is optional, training is not
            self._failure = f"codecarbon reading failed: {type(err).__name__}: {err}"
            log.warning("energy tracking disabled: %s", self._failure)
            return None

    def carbon_intensity_kg_per_kwh(self) -> float:
        """codecarbon's intensity for the configured country (offline: its energy-mix table)."""
        tracker = self._tracker
        try:
            from codecarbon.core.units import Energy

            # codecarbon builds these lazily (3.x); offline, the geo data is the configured country.
            tracker._ensure_emissions_engine()
            tracker._ensure_geo_metadata()
            return float(tracker._emissions.get_private_infra_emissions(Energy.from_energy(kWh=1.0), tracker._geo))
        except Exception:  # noqa: BLE001 - reported as NaN
            return float("nan")

    @staticmethod
    def _halt_threads(tracker: Any | None) -> None:
        """codecarbon's stop() normally cancels its timers; make sure of it even when
        it failed half-way, so no background thread outlives the run."""
        if tracker is None:
            return
        for name in ("_scheduler", "_scheduler_monitor_power"):
            scheduler = getattr(tracker, name, None)
            if scheduler is not None:
                with contextlib.suppress(Exception):
                    scheduler.stop()
        lock = getattr(tracker, "_darel_measure_lock", None)
        if lock is not None:
            # Wait for a measurement a timer thread may still be running.
            with lock:
                pass

    def _failed(self, why: str) -> dict[str, Any]:
        nan = float("nan")
        result: dict[str, Any] = {key: nan for key in ENERGY_KEYS}
        result.update(country_iso_code=self.country_iso_code, pue=self.pue, n_gpus=nan,
                      energy_source=f"unavailable: {why}", codecarbon_version=_codecarbon_version(),
                      tracking_mode=self.tracking_mode)
        return result

    def _result(self, tracker: Any, data: Any) -> dict[str, Any]:
        duration_s = float(data.duration)
        energy_kwh = float(data.energy_consumed)
        co2e_kg = float(data.emissions)
        n_gpus = int(data.gpu_count or 0)
        cpu_kwh, ram_kwh, gpu_kwh = float(data.cpu_energy), float(data.ram_energy), float(data.gpu_energy)

        def mean_power_w(kwh: float, devices: int = 1) -> float:
            # Time-averaged draw before PUE (codecarbon's energies include PUE,
            # Eq. 6 applies it itself); per device for the GPUs, as Eq. 6's g * p_g.
            if duration_s <= 0 or devices <= 0:
                return 0.0 if devices <= 0 else float("nan")
            return kwh * 3.6e6 / duration_s / self.pue / devices

        return {
            "energy_kwh": energy_kwh,
            "co2e_kg": co2e_kg,
            "duration_s": duration_s,
            "cpu_power_w": mean_power_w(cpu_kwh),
            "ram_power_w": mean_power_w(ram_kwh),
            "gpu_power_w": mean_power_w(gpu_kwh, n_gpus),
            "cpu_energy_kwh": cpu_kwh,
            "ram_energy_kwh": ram_kwh,
            "gpu_energy_kwh": gpu_kwh,
            "carbon_intensity_kg_per_kwh": co2e_kg / energy_kwh if energy_kwh > 0 else float("nan"),
            "country_iso_code": str(data.country_iso_code or self.country_iso_code),
            "pue": self.pue,
            "n_gpus": n_gpus,
            "energy_source": _describe_energy_source(tracker, n_gpus),
            "codecarbon_version": str(data.codecarbon_version),
            "tracking_mode": str(data.tracking_mode),
            # codecarbon's own figures: an unweighted mean of its samples, PUE included.
            "codecarbon_cpu_power_w": float(data.cpu_power),
            "codecarbon_ram_power_w": float(data.ram_power),
            "codecarbon_gpu_power_w": float(data.gpu_power),
        }


_INTERVAL_ENERGY_KEYS = ("energy_kwh", "cpu_energy_kwh", "ram_energy_kwh", "gpu_energy_kwh", "co2e_kg")


class TimedWork:
    """Wall time and energy of exactly the same intervals.

    ``with work.interval():`` brackets timed work (a training epoch, its scoring pass
    included). Time comes from perf_counter between device synchronisations, energy from
    two tracker readings around the same moments, so boost and CO2e cut are ratios over
    the same work. What happens between intervals (evaluation, checkpoint writes) is in
    neither. The totals survive a restart: ``state_dict`` goes into the checkpoint and
    ``load_state_dict`` adds the earlier segments, so a resumed run reports the whole run.
    """

    def __init__(self, tracker: EnergyTracker | None, device: torch.device | str) -> None:
        self.tracker = tracker
        self.device = torch.device(device)
        self.time_s = 0.0
        self.tracker_duration_s = 0.0
        self.energy = {key: 0.0 for key in _INTERVAL_ENERGY_KEYS}
        self.intervals = 0
        self.segments = 1
        self.energy_gaps = 0  # intervals without a valid reading (tracking failed)
        self.last_interval_s = 0.0
        self._intensity: float | None = None

    def _intensity_now(self) -> float:
        if self._intensity is None:
            self._intensity = self.tracker.carbon_intensity_kg_per_kwh() if self.tracker else float("nan")
        return self._intensity

    @contextlib.contextmanager
    def interval(self) -> Iterator[None]:
        sync(self.device)
        before = self.tracker.reading() if self.tracker else None
        started = time.perf_counter()
        yield
        sync(self.device)
        elapsed = time.perf_counter() - started
        after = self.tracker.reading() if self.tracker else None
        self.time_s += elapsed
        self.last_interval_s = elapsed
        self.intervals += 1
        if before is None or after is None:
            self.energy_gaps += 1
            return
        self.tracker_duration_s += after["at"] - before["at"]
        for key in ("energy_kwh", "cpu_energy_kwh", "ram_energy_kwh", "gpu_energy_kwh"):
            self.energy[key] += after[key] - before[key]
        self.energy["co2e_kg"] += (after["energy_kwh"] - before["energy_kwh"]) * self._intensity_now()

    def state_dict(self) -> dict:
        return {"time_s": self.time_s, "tracker_duration_s": self.tracker_duration_s, "energy": dict(self.energy),
                "intervals": self.intervals, "segments": self.segments, "energy_gaps": self.energy_gaps}

    def load_state_dict(self, state: dict) -> None:
        self.time_s = float(state["time_s"])
        self.tracker_duration_s = float(state["tracker_duration_s"])
        self.energy = {key: float(state["energy"][key]) for key in _INTERVAL_ENERGY_KEYS}
        self.intervals = int(state["intervals"])
        self.segments = int(state["segments"]) + 1
        self.energy_gaps = int(state["energy_gaps"])

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


def _describe_energy_source(tracker: Any, n_gpus: int) -> str:
    """One sentence saying which figures codecarbon measured and which it estimated."""
    parts: list[str] = []
    measured_cpu = False
    try:
        from codecarbon.external.hardware import CPU, GPU
        from codecarbon.external.ram import RAM

        hardware = list(getattr(tracker, "_hardware", []))
        for item in hardware:
            if isinstance(item, CPU):
                mode = getattr(item, "_mode", "unknown")
                tdp = getattr(item, "_tdp", None)
                if mode in ("intel_rapl", "intel_power_gadget", "apple_powermetrics", "windows_emi"):
                    measured_cpu = True
                    parts.append(f"CPU energy from {mode} counters")
                elif mode == "cpu_load":
                    parts.append(f"CPU power from TDP ({tdp} W) and {getattr(item, '_tracking_mode', '?')} load "
                                 "(no RAPL)")
                elif mode == "constant":
                    parts.append(f"CPU power a constant share of TDP ({tdp} W) (no RAPL)")
                else:
                    parts.append(f"CPU power via {mode}")
            elif isinstance(item, RAM):
                parts.append("RAM power from installed memory size")
            elif isinstance(item, GPU):
                parts.append(f"GPU energy from NVML counters ({n_gpus} GPU(s))")
        if not any(isinstance(item, GPU) for item in hardware):
            parts.append("no GPU")
    except Exception as err:  # noqa: BLE001 - only a label
        parts.append(f"hardware modes unknown ({type(err).__name__})")
    kind = "codecarbon measurement" if measured_cpu else "codecarbon estimate"
    return f"{kind}: " + "; ".join(parts)


# ----------------------------------------------------------------------------- Eq. 6


def eq6_co2e_kg(duration_s: float, cpu_power_w: float, ram_power_w: float, gpu_power_w: float, n_gpus: int,
                pue: float, carbon_intensity_kg_per_kwh: float) -> float:
    """The paper's Eq. 6: CO2e = C_e * PUE * t_hours * (p_c + p_d + g * p_g) / 1000,
    powers in watts (per GPU for p_g), intensity in kg CO2e per kWh."""
    if duration_s < 0:
        raise ValueError(f"duration_s must be >= 0, got {duration_s}")
    if n_gpus < 0:
        raise ValueError(f"n_gpus must be >= 0, got {n_gpus}")
    if pue < 1:
        raise ValueError(f"pue must be >= 1, got {pue}")
    hours = duration_s / 3600.0
    total_power_w = cpu_power_w + ram_power_w + n_gpus * gpu_power_w
    return carbon_intensity_kg_per_kwh * pue * hours * total_power_w / 1000.0


def _nan_to_none(value):
    return None if isinstance(value, float) and math.isnan(value) else value


def carbon_record(energy: dict, pue: float) -> dict:
    """The tracker's record plus the Eq. 6 cross-check, NaN turned into None for JSON."""
    record = dict(energy)
    try:
        record["eq6_co2e_kg"] = eq6_co2e_kg(
            duration_s=energy["duration_s"], cpu_power_w=energy["cpu_power_w"], ram_power_w=energy["ram_power_w"],
            gpu_power_w=energy["gpu_power_w"], n_gpus=energy["n_gpus"], pue=pue,
            carbon_intensity_kg_per_kwh=energy["carbon_intensity_kg_per_kwh"])
    except (KeyError, TypeError, ValueError) as err:
        record["eq6_co2e_kg"] = None
        record["eq6_error"] = str(err)
    return {k: _nan_to_none(v) for k, v in record.items()}
