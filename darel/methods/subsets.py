"""The per-class random draws of the random subset methods (random-offline, random,
oracle-clean) and of the fine-tuning's random control (darel.plans): numpy only."""

from __future__ import annotations

import numpy as np

from darel.selection import kept_count


def check_subset_args(labels, alpha: float, seed: int) -> np.ndarray:
    """The labels as an array, once labels, alpha and seed are valid for a per-class draw."""
    labels = np.asarray(labels)
    if labels.ndim != 1 or labels.size == 0:
        raise ValueError(f"labels must be a non-empty 1-D array, got shape {labels.shape}")
    if not 0.0 < float(alpha) <= 1.0:
        raise ValueError(f"alpha must be in (0, 1], got {alpha!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    return labels


def random_per_class(labels: np.ndarray, alpha: float, seed: int) -> np.ndarray:
    """Indices (int64, ascending) of ceil(alpha * n_c) random samples of every class c."""
    labels = check_subset_args(labels, alpha, seed)
    kept = []
    for cls in np.unique(labels):
        members = np.flatnonzero(labels == cls)
        rng = np.random.default_rng([int(seed), int(cls), 0x52414E44])  # independent stream per class
        kept.append(rng.choice(members, size=kept_count(float(alpha), members.size), replace=False))
    return np.sort(np.concatenate(kept)).astype(np.int64)
