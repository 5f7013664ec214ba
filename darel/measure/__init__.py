"""Measurements behind the tables, split along their seams: ``memory`` (peak memory of
every pass), ``timing`` (step probes, the training state put back, time and energy over
the same intervals), ``energy`` (codecarbon) and ``carbon`` (the paper's Eq. 6). Nothing
here writes files. Everything is importable from ``darel.measure`` directly."""

from darel.measure.carbon import carbon_record, eq6_co2e_kg
from darel.measure.energy import ENERGY_KEYS, EnergyTracker
from darel.measure.memory import CPU_MEMORY_SOURCE, CUDA_MEMORY_SOURCE, StepMemoryMeter, open_nvml
from darel.measure.timing import PROBE_CLOCK, Stopwatch, TimedWork, preserved_training_state, sync, time_passes

__all__ = ["CPU_MEMORY_SOURCE", "CUDA_MEMORY_SOURCE", "ENERGY_KEYS", "EnergyTracker", "PROBE_CLOCK", "StepMemoryMeter",
           "Stopwatch", "TimedWork", "carbon_record", "eq6_co2e_kg", "open_nvml", "preserved_training_state", "sync", "time_passes"]
