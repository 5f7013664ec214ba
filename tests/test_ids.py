from __future__ import annotations

import warnings

import numpy as np
import pytest

from darel.ids import ids_select, prototype_distances
from darel.selection import kept_counts_per_class


def _blobs(sizes: list[int], dim: int = 8, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(len(sizes)), sizes)
    rng.shuffle(labels)
    centres = rng.normal(size=(len(sizes), dim)) * 5
    features = centres[labels] + rng.normal(size=(labels.size, dim))
    return features, labels


@pytest.mark.parametrize("distance", ["cosine", "euclidean"])
@pytest.mark.parametrize("keep", ["far", "near"])
def test_keeps_ceil_share_of_every_class_including_tiny_ones(distance, keep):
    features, labels = _blobs([10, 7, 3, 1, 2])
    kept = ids_select(features, labels, keep_ratio=0.8, distance=distance, keep=keep)
    # ceil(0.8 * n) for n = 10, 7, 3, 1, 2
    assert kept_counts_per_class(labels, kept) == {0: 8, 1: 6, 2: 3, 3: 1, 4: 2}
    assert kept.dtype == np.int64
    assert np.all(np.diff(kept) > 0)
    assert len(ids_select(features, labels, keep_ratio=1.0, distance=distance, keep=keep)) == labels.size


def test_euclidean_one_prototype_is_class_mean_and_rules_pick_known_samples():
    # Class 0 lies on the x axis with mean 0, so distances are |x|: 5, 1, 0, 2, 4.
    # Class 1 is the same pattern shifted by 100: its own mean must be used.
    xs = np.array([-5.0, -1.0, 0.0, 2.0, 4.0])
    features = np.zeros((10, 2))
    features[:5, 0] = xs
    features[5:, 0] = xs + 100.0
    labels = np.repeat([0, 1], 5)

    distances = prototype_distances(features, labels, clusters_per_class=1, distance="euclidean")
    np.testing.assert_allclose(distances, np.tile(np.abs(xs), 2), atol=1e-12)

    far = ids_select(features, labels, keep_ratio=0.6, clusters_per_class=1, distance="euclidean", keep="far")
    near = ids_select(features, labels, keep_ratio=0.6, clusters_per_class=1, distance="euclidean", keep="near")
    assert far.tolist() == [0, 3, 4, 5, 8, 9]  # distances 5, 4, 2
    assert near.tolist() == [1, 2, 3, 6, 7, 8]  # distances 0, 1, 2


def test_cosine_one_prototype_uses_angles_and_ignores_norms():
    # Unit vectors (sqrt(1 - s^2), s): the sines sum to 0, so the mean direction is the
    # x axis and each sample's angle to it is asin(s). Norms are scrambled on purpose.
    sines = np.array([0.5, 0.0, -0.9, 0.1, 0.3])
    norms = np.array([1.0, 9.0, 0.2, 3.0, 0.5])
    features = np.stack([np.sqrt(1 - sines**2), sines], axis=1) * norms[:, None]
    labels = np.zeros(5, dtype=np.int64)

    distances = prototype_distances(features, labels, clusters_per_class=1, distance="cosine")
    np.testing.assert_allclose(distances, 1 - np.sqrt(1 - sines**2), atol=1e-12)

    far = ids_select(features, labels, keep_ratio=0.6, clusters_per_class=1, distance="cosine", keep="far")
    near = ids_select(features, labels, keep_ratio=0.6, clusters_per_class=1, distance="cosine", keep="near")
    assert far.tolist() == [0, 2, 4]  # |s| = 0.5, 0.9, 0.3
    assert near.tolist() == [1, 3, 4]  # |s| = 0.0, 0.1, 0.3


def test_several_prototypes_measure_distance_to_the_nearest_one():
    # One class made of two tight groups: two prototypes sit on the groups, one sits between them.
    rng = np.random.default_rng(1)
    features = np.concatenate([rng.normal(0, 0.01, (6, 2)), rng.normal(0, 0.01, (6, 2)) + [10.0, 0.0]])
    labels = np.zeros(12, dtype=np.int64)
    two = prototype_distances(features, labels, clusters_per_class=2, distance="euclidean")
    one = prototype_distances(features, labels, clusters_per_class=1, distance="euclidean")
    assert two.max() < 0.1
    assert one.min() > 4.9


def test_ties_break_by_index_and_duplicates_do_not_break_kmeans():
    # Identical rows: one distinct point, so the cap drops K-Means to one centre.
    features = np.ones((5, 3))
    labels = np.zeros(5, dtype=np.int64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        far = ids_select(features, labels, keep_ratio=0.4, clusters_per_class=4, keep="far")
        near = ids_select(features, labels, keep_ratio=0.4, clusters_per_class=4, keep="near", distance="euclidean")
    assert far.tolist() == [0, 1]
    assert near.tolist() == [0, 1]


@pytest.mark.parametrize("distance", ["cosine", "euclidean"])
def test_same_seed_same_result(distance):
    features, labels = _blobs([40, 30], dim=6, seed=3)
    first = ids_select(features, labels, clusters_per_class=3, distance=distance, seed=7)
    second = ids_select(features, labels, clusters_per_class=3, distance=distance, seed=7)
    np.testing.assert_array_equal(first, second)
    np.testing.assert_array_equal(
        prototype_distances(features, labels, 3, distance, 7), prototype_distances(features, labels, 3, distance, 7)
    )


def test_empty_input_keeps_nothing():
    kept = ids_select(np.zeros((0, 4)), np.zeros(0, dtype=np.int64))
    assert kept.dtype == np.int64 and kept.size == 0


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"keep_ratio": 0.0}, "keep_ratio"),
        ({"keep_ratio": 1.5}, "keep_ratio"),
        ({"keep_ratio": float("nan")}, "keep_ratio"),
        ({"keep_ratio": True}, "keep_ratio"),
        ({"distance": "manhattan"}, "distance"),
        ({"keep": "middle"}, "keep"),
        ({"clusters_per_class": 0}, "clusters_per_class"),
        ({"clusters_per_class": 2.0}, "clusters_per_class"),
        ({"seed": -1}, "seed"),
    ],
)
def test_bad_arguments_are_named(kwargs, message):
    features, labels = _blobs([4, 4])
    with pytest.raises(ValueError, match=message):
        ids_select(features, labels, **kwargs)


def test_bad_arrays_are_rejected():
    features, labels = _blobs([4, 4])
    with pytest.raises(ValueError, match="2-D"):
        ids_select(features[:, 0], labels)
    with pytest.raises(ValueError, match="labels has 7 entries"):
        ids_select(features, labels[:7])
    with pytest.raises(ValueError, match="labels must be 1-D"):
        ids_select(features, labels[:, None])
    with pytest.raises(ValueError, match="labels must be integers"):
        ids_select(features, labels.astype(float))
    broken = features.copy()
    broken[2, 1] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        ids_select(broken, labels)
    zero_row = features.copy()
    zero_row[3] = 0.0
    with pytest.raises(ValueError, match="all-zero"):
        ids_select(zero_row, labels, distance="cosine")
    # Euclidean distance is fine with a zero row.
    assert len(ids_select(zero_row, labels, distance="euclidean")) == 8
    with pytest.raises(ValueError, match="clusters_per_class"):
        prototype_distances(features, labels, clusters_per_class=-2)
