"""Measurements behind the tables, split along their seams: ``memory`` (peak memory of
every pass), ``timing`` (step probes, the training state put back, time and energy over
the same intervals), ``energy`` (codecarbon) and ``carbon`` (the paper's Eq. 6). Nothing
here writes files. Everything is importable from ``darel.measure`` directly, and each
name imports only its own module when first used: a job that needs the carbon record
(the cell record) does not pay torch's import (seconds per job on a GPU machine)."""

from __future__ import annotations

import importlib
from typing import Any

_HOME = {
    "carbon_record": "carbon", "eq6_co2e_kg": "carbon",
    "ENERGY_KEYS": "energy", "EnergyTracker": "energy",
    "CPU_MEMORY_SOURCE": "memory", "CUDA_MEMORY_SOURCE": "memory", "StepMemoryMeter": "memory", "open_nvml": "memory",
    "PROBE_CLOCK": "timing", "Stopwatch": "timing", "TimedWork": "timing", "preserved_training_state": "timing",
    "sync": "timing", "time_passes": "timing",
}

__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'darel.measure' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"darel.measure.{_HOME[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOME])
