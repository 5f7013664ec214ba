"""Energy and CO2e through codecarbon's offline tracker, with a sentence saying what was
measured and what estimated."""

from __future__ import annotations

import contextlib
import logging
import math
import platform
import re
import threading
import time
from typing import Any, Iterator


log = logging.getLogger(__name__)


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


def kernel_cpu_brand(cpuinfo_text: str | None = None) -> str | None:
    """The CPU's brand string as the Linux kernel reports it (``model name`` in
    /proc/cpuinfo), or None where there is none (another system, most ARM kernels)."""
    if cpuinfo_text is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
                cpuinfo_text = handle.read()
        except OSError:
            return None
    match = re.search(r"^model name[ \t]*:[ \t]*(.*?)[ \t]*$", cpuinfo_text, flags=re.MULTILINE)
    if match is None or not match.group(1):
        return None
    return match.group(1)


# Where py-cpuinfo's own answer is the kernel's model name: on x86 Linux it reads /proc/cpuinfo
# before CPUID, and there the first field it takes for the brand is "model name".
_KERNEL_NAMES_THE_BRAND = {"x86_64", "amd64", "i386", "i686"}


@contextlib.contextmanager
def _brand_from_kernel() -> Iterator[None]:
    """codecarbon names the CPU (its key to the TDP table, hence to the power estimate) with
    py-cpuinfo, which starts a second Python interpreter to read it: about 1.1 s of CPU per
    tracked job on the 2-core machine, every training paying it. On x86 Linux, where
    py-cpuinfo's answer is the kernel's ``model name``, that name is given instead for the
    tracker's construction and start (tests/test_measure.py compares the two); elsewhere
    py-cpuinfo runs as before."""
    brand = kernel_cpu_brand() if platform.machine().lower() in _KERNEL_NAMES_THE_BRAND else None
    try:
        import cpuinfo
    except ImportError:
        brand = None
    if brand is None:
        yield
        return
    original = cpuinfo.get_cpu_info
    cpuinfo.get_cpu_info = lambda: {"brand_raw": brand}
    try:
        yield
    finally:
        cpuinfo.get_cpu_info = original


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
            with _brand_from_kernel():
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
