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
from typing import Any, Callable, Iterator

import torch
from torch import nn

log = logging.getLogger(__name__)

CPU_MEMORY_SOURCE = "cpu-tensor-accounting (params+grads+optimizer state+saved activations)"
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


def _distinct_bytes(tensors: Iterator[torch.Tensor], skip: set[int] | frozenset[int] = frozenset()) -> int:
    """Bytes of the distinct storages behind ``tensors``: two views of one buffer count once."""
    seen: set[int] = set()
    total = 0
    for tensor in tensors:
        found = _storage_key_and_bytes(tensor)
        if found is None:
            continue
        ptr, nbytes = found
        if ptr in seen or ptr in skip:
            continue
        seen.add(ptr)
        total += nbytes
    return total


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


class StepMemoryMeter:
    """Peak memory of training steps, one ``with meter.step():`` per batch.

    On CUDA the figure is torch's peak allocation within each step; NVML's view of
    the whole device's used memory (what the paper's pynvml reads, including the
    CUDA context and the allocator's cache) is kept beside it as ``nvml_peak_bytes``.
    On CPU torch keeps no allocator peak, so the meter counts tensors instead:
    parameters + gradients + optimizer state + every distinct storage saved for
    backward during the step. That count is deterministic and grows linearly with the
    batch, which is what Algorithm 1's regression needs; it leaves out the
    allocator's temporaries, so it is a lower bound of the true resident memory.
    The process's peak RSS is recorded too, for information only.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device | str) -> None:
        self.model = model
        self.optimizer = optimizer
        self.device = torch.device(device)
        self.peak_bytes = 0
        self.steps = 0
        self.rss_peak_bytes = _process_peak_rss_bytes()
        self.nvml_peak_bytes: int | None = None
        self._nvml_handle: Any | None = None
        if self.device.type == "cuda":
            self.source = CUDA_MEMORY_SOURCE
            self._nvml_handle, self.nvml_status = open_nvml(self.device)
        else:
            self.source = CPU_MEMORY_SOURCE
            self.nvml_status = f"NVML not used: device is {self.device.type}, not cuda"

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        if self.device.type == "cuda":
            with self._cuda_step():
                yield
        else:
            with self._cpu_step():
                yield
        self.steps += 1
        self.rss_peak_bytes = max(self.rss_peak_bytes, _process_peak_rss_bytes())

    @contextlib.contextmanager
    def _cuda_step(self) -> Iterator[None]:
        torch.cuda.reset_peak_memory_stats(self.device)
        yield
        # The caching allocator records allocations when ops are issued, so no sync is needed.
        self.peak_bytes = max(self.peak_bytes, int(torch.cuda.max_memory_allocated(self.device)))
        if self._nvml_handle is not None:
            import pynvml

            try:
                used = int(pynvml.nvmlDeviceGetMemoryInfo(self._nvml_handle).used)
            except pynvml.NVMLError as err:
                self._nvml_handle = None
                self.nvml_status = f"NVML stopped: nvmlDeviceGetMemoryInfo failed ({err})"
            else:
                self.nvml_peak_bytes = max(self.nvml_peak_bytes or 0, used)

    @contextlib.contextmanager
    def _cpu_step(self) -> Iterator[None]:
        params = [p for p in self.model.parameters()]
        param_ptrs: set[int] = set()
        for p in params:
            found = _storage_key_and_bytes(p)
            if found is not None:
                param_ptrs.add(found[0])
        saved_ptrs: set[int] = set()
        saved_bytes = 0

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            nonlocal saved_bytes
            found = _storage_key_and_bytes(tensor)
            # Weights saved by conv/linear are the parameters themselves: counted once, below.
            if found is not None and found[0] not in saved_ptrs and found[0] not in param_ptrs:
                saved_ptrs.add(found[0])
                saved_bytes += found[1]
            return tensor

        def unpack(tensor: torch.Tensor) -> torch.Tensor:
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            yield
        # Everything saved in one forward is alive together at its end, so the sum of
        # distinct saved storages is the activation peak of the step.
        resident = (
            _distinct_bytes(iter(params))
            + _distinct_bytes((p.grad for p in params if p.grad is not None), skip=param_ptrs)
            + _distinct_bytes(_tensors_in(list(self.optimizer.state.values())), skip=param_ptrs)
        )
        self.peak_bytes = max(self.peak_bytes, resident + saved_bytes)


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


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_training_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    make_batch: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
    batch: int,
    device: torch.device | str,
    warmup: int = 2,
    repeats: int = 3,
    amp: bool = False,
) -> tuple[float, int]:
    """Median wall time of one real training step (forward, backward, optimizer step)
    at ``batch`` and the peak memory over all its steps, warm-up included (the
    training run's meter also sees its first steps). Building the batch is not timed.

    Model weights and buffers, optimizer state, gradients, train/eval mode and the
    global RNG state are restored afterwards, so probing never changes the training.
    """
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    device = torch.device(device)
    params = list(model.parameters())
    saved_model = _to_cpu_copy(model.state_dict())
    saved_optimizer = _to_cpu_copy(optimizer.state_dict())
    saved_grads = [None if p.grad is None else p.grad.detach().to("cpu", copy=True) for p in params]
    was_training = model.training
    cpu_rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state(device) if device.type == "cuda" else None

    use_amp = amp and device.type == "cuda"
    scaler = torch.amp.GradScaler("cuda", enabled=use_amp)
    meter = StepMemoryMeter(model, optimizer, device)
    step_times: list[float] = []
    try:
        model.train()
        for index in range(warmup + repeats):
            inputs, targets = make_batch(batch)
            _sync(device)
            started = time.perf_counter()
            with meter.step():
                with torch.autocast(device_type=device.type, dtype=torch.float16, enabled=use_amp):
                    loss = loss_fn(model(inputs), targets)
                optimizer.zero_grad(set_to_none=True)
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            _sync(device)
            if index >= warmup:
                step_times.append(time.perf_counter() - started)
            del inputs, targets, loss
    finally:
        model.load_state_dict(saved_model)
        optimizer.load_state_dict(saved_optimizer)
        for p, grad in zip(params, saved_grads):
            p.grad = None if grad is None else grad.to(p.device)
        model.train(was_training)
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state(cuda_rng, device)
    return float(statistics.median(step_times)), int(meter.peak_bytes)


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
