"""Algorithm 2 (offline selection): keep a loss-ranked share of every class.

A scorer model gives each training sample a loss. Within each class the samples are
ranked by that loss and the first ceil(alpha * class size) of the ranking survive:
the lowest losses first for mode "easy", the highest first for mode "hard". Language
tasks have no classes; passing ``labels=None`` ranks all samples as one group.
"""

from __future__ import annotations

import math

import numpy as np

MODES = ("easy", "hard")


def kept_count(alpha: float, n: int) -> int:
    """ceil(alpha * n), immune to float noise such as 0.7 * 10 = 7.000000000000001."""
    return int(math.ceil(round(alpha * n, 9)))


def _validate(losses: np.ndarray, labels: np.ndarray | None, alpha: float, mode: str) -> tuple[np.ndarray, np.ndarray | None]:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if not (isinstance(alpha, (int, float, np.floating, np.integer)) and 0.0 < float(alpha) <= 1.0):
        raise ValueError(f"alpha must be in (0, 1], got {alpha!r}")
    losses = np.asarray(losses, dtype=np.float64)
    if losses.ndim != 1:
        raise ValueError(f"losses must be 1-D, got shape {losses.shape}")
    bad = int((~np.isfinite(losses)).sum())
    if bad:
        raise ValueError(f"losses contain {bad} non-finite value(s) (NaN or inf) out of {losses.size}")
    if labels is not None:
        labels = np.asarray(labels)
        if labels.ndim != 1:
            raise ValueError(f"labels must be 1-D, got shape {labels.shape}")
        if labels.shape[0] != losses.shape[0]:
            raise ValueError(f"labels has {labels.shape[0]} entries but losses has {losses.shape[0]}")
    return losses, labels


def _rank_group(group_losses: np.ndarray, mode: str) -> np.ndarray:
    # Stable sort keeps equal losses in index order for both directions; negating
    # (rather than reversing an ascending sort) is what preserves that for "hard".
    key = group_losses if mode == "easy" else -group_losses
    return np.argsort(key, kind="stable")


def select_by_loss(losses: np.ndarray, labels: np.ndarray | None, alpha: float, mode: str) -> np.ndarray:
    """Indices (int64, ascending) of the samples that Algorithm 2 keeps.

    losses: per-sample scorer loss, 1-D and finite.
    labels: class of each sample, or None to treat all samples as one class.
    alpha:  share of each class to keep, in (0, 1]; a class of n keeps ceil(alpha * n).
    mode:   "easy" keeps the lowest losses, "hard" keeps the highest.
    """
    losses, labels = _validate(losses, labels, alpha, mode)
    n = losses.shape[0]
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if labels is None:
        order = _rank_group(losses, mode)
        kept = order[: kept_count(float(alpha), n)]
        return np.sort(kept).astype(np.int64)

    kept_parts = []
    for cls in np.unique(labels):
        members = np.flatnonzero(labels == cls)
        order = _rank_group(losses[members], mode)
        kept_parts.append(members[order[: kept_count(float(alpha), members.size)]])
    return np.sort(np.concatenate(kept_parts)).astype(np.int64)


def kept_counts_per_class(labels: np.ndarray, kept: np.ndarray) -> dict[int, int]:
    """How many kept samples each class contributes (classes with none show 0)."""
    labels = np.asarray(labels)
    kept = np.asarray(kept, dtype=np.int64)
    if kept.size and (kept.min() < 0 or kept.max() >= labels.shape[0]):
        raise ValueError(f"kept indices must lie in [0, {labels.shape[0]}), got range [{kept.min()}, {kept.max()}]")
    classes = np.unique(labels)
    kept_labels = labels[kept]
    return {int(c): int((kept_labels == c).sum()) for c in classes}
