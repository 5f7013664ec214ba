from __future__ import annotations

import numpy as np
import pytest

from darel.selection import kept_count, kept_counts_per_class, select_by_loss


def test_easy_keeps_lowest_and_hard_keeps_highest_per_class():
    losses = np.array([0.9, 0.1, 0.5, 0.3, 2.0, 1.0, 3.0, 0.2])
    labels = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    # class 0 losses by index: 0:0.9 1:0.1 2:0.5 3:0.3 ; class 1: 4:2.0 5:1.0 6:3.0 7:0.2
    easy = select_by_loss(losses, labels, 0.5, "easy")
    hard = select_by_loss(losses, labels, 0.5, "hard")
    assert easy.tolist() == [1, 3, 5, 7]
    assert hard.tolist() == [0, 2, 4, 6]
    assert easy.dtype == np.int64 and hard.dtype == np.int64


def test_ceiling_per_class_and_float_noise():
    assert kept_count(0.7, 10) == 7  # 0.7 * 10 is 7.000000000000001 in floats
    assert kept_count(0.25, 10) == 3  # 2.5 rounds up
    assert kept_count(0.8, 5) == 4
    labels = np.repeat([0, 1, 2], [10, 3, 7])
    losses = np.arange(20, dtype=float)
    kept = select_by_loss(losses, labels, 0.5, "hard")
    assert kept_counts_per_class(labels, kept) == {0: 5, 1: 2, 2: 4}
    assert len(select_by_loss(losses[:10], labels[:10], 0.7, "easy")) == 7


def test_no_labels_ranks_all_samples_together():
    losses = np.array([5.0, 1.0, 4.0, 2.0, 3.0])
    assert select_by_loss(losses, None, 0.4, "easy").tolist() == [1, 3]
    assert select_by_loss(losses, None, 0.4, "hard").tolist() == [0, 2]
    assert select_by_loss(losses, None, 1.0, "hard").tolist() == [0, 1, 2, 3, 4]


def test_ties_resolve_by_index_in_both_modes():
    losses = np.ones(6)
    assert select_by_loss(losses, None, 0.5, "easy").tolist() == [0, 1, 2]
    assert select_by_loss(losses, None, 0.5, "hard").tolist() == [0, 1, 2]


def test_output_is_sorted_and_unique():
    rng = np.random.default_rng(0)
    losses = rng.random(1000)
    labels = rng.integers(0, 10, 1000)
    kept = select_by_loss(losses, labels, 0.3, "hard")
    assert np.all(np.diff(kept) > 0)


@pytest.mark.parametrize("alpha", [0.0, -0.1, 1.5, float("nan")])
def test_bad_alpha(alpha):
    with pytest.raises(ValueError, match="alpha"):
        select_by_loss(np.ones(4), None, alpha, "easy")


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="'medium'"):
        select_by_loss(np.ones(4), None, 0.5, "medium")
    with pytest.raises(ValueError, match="2 non-finite"):
        select_by_loss(np.array([1.0, np.nan, np.inf, 0.0]), None, 0.5, "easy")
    with pytest.raises(ValueError, match="labels has 3 entries but losses has 4"):
        select_by_loss(np.ones(4), np.zeros(3), 0.5, "easy")
    with pytest.raises(ValueError, match="1-D"):
        select_by_loss(np.ones((2, 2)), None, 0.5, "easy")
    with pytest.raises(ValueError, match="kept indices"):
        kept_counts_per_class(np.zeros(3), np.array([5]))
