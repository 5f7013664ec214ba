"""bench/retest.py: a model.pt of a study build is matched to exactly one study row, and
the larger test split leaves the training split and the prototypes as they are."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from darel import config, data
from tests.conftest import ROOT, TINY_SYNTH, load_script

ROWS = pd.DataFrame({
    "method": ["baseline", "darel", "random", "darel", "darel"],
    "seed": [36, 36, 36, 36, 37],
    "t": [np.nan, 0.8, 0.8, 0.5, 0.8],
    "m": [np.nan, 0.8, 0.8, 0.8, 0.8],
})


def test_a_model_path_names_its_one_row():
    retest = load_script("bench/retest.py", "retest")
    assert retest.row_of("runs/quick/table1/resnet18/s36/baseline/model.pt", ROWS) == 0
    assert retest.row_of("runs/quick/study_table1/resnet18/s36/t0.80_m0.80/random/model.pt", ROWS) == 2
    assert retest.row_of("runs/quick/study_table1/resnet18/s36/t0.50_m0.80/darel/model.pt", ROWS) == 3
    assert retest.row_of("runs/quick/study_table1/resnet18/s37/t0.80_m0.80/darel/model.pt", ROWS) == 4
    with pytest.raises(ValueError, match="0 study rows"):
        retest.row_of("runs/quick/study_table1/resnet18/s38/t0.80_m0.80/darel/model.pt", ROWS)
    with pytest.raises(ValueError, match="not a study model path"):
        retest.row_of("runs/quick/study_table1/resnet18/s36/t0.80_m0.80/darel/ckpt.pt", ROWS)


def test_another_test_size_leaves_the_training_split_alone():
    cfg = config.load_params(ROOT / "params.yaml", {"datasets": {"synth": {"sizes": {"cpu": dict(TINY_SYNTH)}}}})
    settings = config.dataset_params(cfg)
    train, test, meta = data.make_synth_dataset(settings)
    more_train, more_test, more_meta = data.make_synth_dataset({**settings, "n_test": 3 * settings["n_test"]})
    for key in train:
        np.testing.assert_array_equal(train[key], more_train[key])
    assert (meta["mean"], meta["std"]) == (more_meta["mean"], more_meta["std"])  # the normalisation too
    assert len(more_test["labels"]) == 3 * len(test["labels"])
    assert np.bincount(more_test["labels"]).min() == np.bincount(more_test["labels"]).max()  # balanced
