"""The paper's Eq. 6 and the carbon record of a cell (codecarbon's figures beside the
equation recomputed from the measured average powers)."""

from __future__ import annotations

import math




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
