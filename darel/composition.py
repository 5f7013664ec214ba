"""What a run trained on: its trained sample-steps counted by the data set's per-sample
groups (the generated benchmark's category: clean, label-noise, near-duplicate, hard; and
rare classes), beside the shares those groups have in the data. A method that drops the
noisy samples, or the rare classes, shows it here, by measurement rather than by story.

Pure functions on counts; the training loop counts on the device (darel.image_training).
"""

from __future__ import annotations

from typing import Mapping, Sequence

# The groups a data set's columns define: column -> the name of each code.
GROUPS = {"category": ("clean", "label-noise", "near-duplicate", "hard"), "rare": ("common-class", "rare-class")}


def shares(counts: Sequence[int]) -> list[float]:
    total = sum(counts)
    return [c / total if total else 0.0 for c in counts]


def summary(trained: Mapping[str, Sequence[int]], data: Mapping[str, Sequence[int]]) -> dict:
    """{"trained": {group: sample-steps}, "data": {group: samples}, "trained_share": ...,
    "data_share": ...} for every column both count, named by GROUPS."""
    out: dict = {"trained": {}, "data": {}, "trained_share": {}, "data_share": {}}
    for column, names in GROUPS.items():
        if column not in trained or column not in data:
            continue
        if len(trained[column]) != len(names) or len(data[column]) != len(names):
            raise ValueError(f"{column}: expected {len(names)} counts ({', '.join(names)}), got "
                             f"{len(trained[column])} trained and {len(data[column])} in the data")
        for name, steps, share in zip(names, trained[column], shares(trained[column])):
            out["trained"][name], out["trained_share"][name] = int(steps), share
        for name, count, share in zip(names, data[column], shares(data[column])):
            out["data"][name], out["data_share"][name] = int(count), share
    return out


def flat_columns(composition: Mapping | None) -> dict[str, float]:
    """A cell's composition as study columns: ``trained_share_<group>`` and
    ``data_share_<group>`` (none without one)."""
    if not composition:
        return {}
    return {**{f"trained_share_{k}": v for k, v in composition["trained_share"].items()},
            **{f"data_share_{k}": v for k, v in composition["data_share"].items()}}
