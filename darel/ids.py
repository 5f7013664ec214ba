"""IDS offline selection (the "IDS + ADONIS" comparison row): keep samples by their
distance to per-class K-Means prototypes in a pretrained network's feature space.

For every class the samples' penultimate-layer features are clustered with K-Means;
the centroids are that class's prototypes. Each sample is scored by its distance to
the nearest prototype of its own class, and each class keeps exactly
ceil(keep_ratio * class size) samples.

DAREL's paper says IDS does not select from the "center group", so the default rule
("far") keeps the samples farthest from their prototype and drops the most central,
most redundant ones; "near" is the opposite rule, kept for ablations.

Distances:
  "cosine":    features are L2-normalised, clustered with K-Means on the unit sphere
               (spherical-style), centroids re-normalised, distance = 1 - cosine.
  "euclidean": plain K-Means on the raw features, Euclidean distance.
"""

from __future__ import annotations

import numpy as np
from sklearn.cluster import KMeans

from darel.selection import kept_count

DISTANCES = ("cosine", "euclidean")
KEEP_RULES = ("far", "near")

# Four prototypes per class: a class of CIFAR-100 (500 images) gives ~125 samples per
# centroid, enough for stable centres, while several modes (poses, backgrounds) are
# not blurred into one mean the way a single prototype would. Capped per class.
DEFAULT_CLUSTERS_PER_CLASS = 4

# Fixed restarts so results depend only on the seed, not on a library default.
KMEANS_RESTARTS = 10

_MAX_SEED = 2**32 - 1  # numpy RandomState's accepted range


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _validate_inputs(
    features: np.ndarray, labels: np.ndarray, clusters_per_class: int, distance: str, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    if distance not in DISTANCES:
        raise ValueError(f"distance must be one of {DISTANCES}, got {distance!r}")
    if not _is_int(clusters_per_class) or clusters_per_class < 1:
        raise ValueError(f"clusters_per_class must be an integer >= 1, got {clusters_per_class!r}")
    if not _is_int(seed) or not 0 <= seed <= _MAX_SEED:
        raise ValueError(f"seed must be an integer in [0, {_MAX_SEED}], got {seed!r}")

    features = np.asarray(features)
    if features.ndim != 2:
        raise ValueError(f"features must be 2-D (N, D), got shape {features.shape}")
    if features.shape[1] == 0:
        raise ValueError(f"features must have at least one dimension, got shape {features.shape}")
    if not (np.issubdtype(features.dtype, np.floating) or np.issubdtype(features.dtype, np.integer)):
        raise ValueError(f"features must be numeric, got dtype {features.dtype}")
    features = features.astype(np.float64, copy=False)
    bad = int((~np.isfinite(features)).any(axis=1).sum())
    if bad:
        raise ValueError(f"features contain non-finite values (NaN or inf) in {bad} of {features.shape[0]} rows")

    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ValueError(f"labels must be 1-D, got shape {labels.shape}")
    if labels.shape[0] != features.shape[0]:
        raise ValueError(f"labels has {labels.shape[0]} entries but features has {features.shape[0]} rows")
    if labels.size and not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels must be integers, got dtype {labels.dtype}")

    if distance == "cosine":
        norms = np.linalg.norm(features, axis=1)
        zero_rows = np.flatnonzero(norms == 0.0)
        if zero_rows.size:
            raise ValueError(
                f"cosine distance is undefined for all-zero feature rows; {zero_rows.size} found "
                f"(first at index {int(zero_rows[0])})"
            )
    return features, labels


def _unit_rows(matrix: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    # A centroid of opposite unit vectors can be ~0; leaving it at zero makes its
    # cosine 0 (distance 1) instead of dividing by zero.
    return np.divide(matrix, norms, out=np.zeros_like(matrix), where=norms > 0)


def _class_prototypes(points: np.ndarray, clusters: int, seed: int) -> np.ndarray:
    """Centroids of one class's points (already in the clustering space)."""
    # K-Means cannot place more centres than there are distinct points: cap there,
    # which also covers the cap at class size.
    distinct = np.unique(points, axis=0).shape[0]
    clusters = min(clusters, distinct)
    if clusters == 1:
        # One centre is the mean; skipping K-Means makes it exact and cheap.
        return points.mean(axis=0, keepdims=True)
    kmeans = KMeans(n_clusters=clusters, n_init=KMEANS_RESTARTS, random_state=seed)
    kmeans.fit(points)
    return kmeans.cluster_centers_


def _distances_to_prototypes(points: np.ndarray, prototypes: np.ndarray, distance: str) -> np.ndarray:
    """Distance of every point to its nearest prototype."""
    if distance == "cosine":
        similarity = points @ _unit_rows(prototypes).T
        return np.clip(1.0 - similarity.max(axis=1), 0.0, 2.0)
    gaps = points[:, None, :] - prototypes[None, :, :]
    return np.sqrt(np.einsum("npd,npd->np", gaps, gaps)).min(axis=1)


def _prototype_distances(
    features: np.ndarray, labels: np.ndarray, clusters_per_class: int, distance: str, seed: int
) -> np.ndarray:
    space = _unit_rows(features) if distance == "cosine" else features
    distances = np.zeros(features.shape[0], dtype=np.float64)
    for cls in np.unique(labels):
        members = np.flatnonzero(labels == cls)
        prototypes = _class_prototypes(space[members], clusters_per_class, seed)
        distances[members] = _distances_to_prototypes(space[members], prototypes, distance)
    return distances


def prototype_distances(
    features: np.ndarray,
    labels: np.ndarray,
    clusters_per_class: int = DEFAULT_CLUSTERS_PER_CLASS,
    distance: str = "cosine",
    seed: int = 0,
) -> np.ndarray:
    """Each sample's distance (float64, shape (N,)) to the nearest prototype of its class.

    features:           (N, D) finite features from a pretrained network.
    labels:             (N,) integer class of each sample.
    clusters_per_class: K-Means centres per class, capped at the class's distinct points.
    distance:           "cosine" (1 - cosine, spherical-style K-Means) or "euclidean".
    seed:               K-Means random_state; equal seeds give equal results.
    """
    features, labels = _validate_inputs(features, labels, clusters_per_class, distance, seed)
    return _prototype_distances(features, labels, clusters_per_class, distance, int(seed))


def ids_select(
    features: np.ndarray,
    labels: np.ndarray,
    keep_ratio: float = 0.8,
    clusters_per_class: int = DEFAULT_CLUSTERS_PER_CLASS,
    distance: str = "cosine",
    keep: str = "far",
    seed: int = 0,
) -> np.ndarray:
    """Indices (int64, ascending) of the samples IDS keeps.

    keep_ratio: share of every class to keep, in (0, 1]; a class of n keeps ceil(keep_ratio * n).
    keep:       "far" keeps the samples farthest from their prototype (IDS default),
                "near" the closest. Equal distances are broken by lower index first.
    Other arguments as in ``prototype_distances``.
    """
    if keep not in KEEP_RULES:
        raise ValueError(f"keep must be one of {KEEP_RULES}, got {keep!r}")
    if not (_is_int(keep_ratio) or isinstance(keep_ratio, (float, np.floating))) or not 0.0 < float(keep_ratio) <= 1.0:
        raise ValueError(f"keep_ratio must be in (0, 1], got {keep_ratio!r}")
    features, labels = _validate_inputs(features, labels, clusters_per_class, distance, seed)
    if features.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)

    distances = _prototype_distances(features, labels, clusters_per_class, distance, int(seed))
    kept_parts = []
    for cls in np.unique(labels):
        members = np.flatnonzero(labels == cls)
        # Negating (not reversing) keeps the stable sort's index order among ties for "far".
        key = -distances[members] if keep == "far" else distances[members]
        order = np.argsort(key, kind="stable")
        kept_parts.append(members[order[: kept_count(float(keep_ratio), members.size)]])
    return np.sort(np.concatenate(kept_parts)).astype(np.int64)
