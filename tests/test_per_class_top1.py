"""Top-1 on the rare classes and on the others (issue 50, item 3): exact figures on a known
prediction, the whole-set top-1 unchanged, a bad class list refused."""

from __future__ import annotations

import pytest
import torch

from darel.evaluation import accuracy_percent, rare_and_common_top1


def test_rare_and_common_top1_are_exact_and_the_whole_set_figure_is_their_weighted_mean():
    labels = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    pred = torch.tensor([0, 1, 1, 1, 2, 0, 0, 0])  # class 0: 1/2, 1: 2/2, 2: 1/2, 3: 0/2
    groups = rare_and_common_top1(pred, labels, [3, 2])
    assert groups == {"top1_rare": 25.0, "top1_common": 75.0}
    assert accuracy_percent(pred, labels) == 50.0 == (groups["top1_rare"] + groups["top1_common"]) / 2


def test_a_rare_class_list_that_leaves_one_side_empty_is_refused():
    labels, pred = torch.tensor([0, 1, 1]), torch.tensor([0, 1, 0])
    with pytest.raises(ValueError, match=r"rare classes \[7\]"):
        rare_and_common_top1(pred, labels, [7])
    with pytest.raises(ValueError, match="no test image on one side"):
        rare_and_common_top1(pred, labels, [0, 1])
