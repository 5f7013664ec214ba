"""The per-epoch test curve on a prefix of the test split (profiles.<p>.curve_test): it
reports, it never steers, so the trained model is the same whatever its size, and the
curve's last point is the model's top-1 on exactly that prefix."""

import hashlib
import json
import logging

import pytest
import torch

from darel import config, data, evaluation
from darel.config import ConfigError
from darel.stagekit import models as stage_models
from darel.stagekit import training as stage_training
from tests.conftest import ROOT, TINY_SYNTH

PREFIX = 50


def _params(**profile):
    return config.load_params(ROOT / "params.yaml", {
        "datasets": {"synth": {"sizes": {"cpu": dict(TINY_SYNTH)}}},
        "profiles": {"quick": {"models": {"resnet18": {"width": 4, "epochs": 2, "milestones": [1],
                                                        "warmup_epochs": 0}}, **profile}}})


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("curve")
    cfg = _params()
    train, test, meta = data.make_synth_dataset(config.dataset_params(cfg))
    data.write_dataset(root / "data", train, test, meta)
    runs = {}
    # More than the split holds: the whole split (the tiny test split has 200 images).
    for name, curve_test in (("all", 10**6), ("prefix", PREFIX)):
        params = config.training_params(_params(curve_test=curve_test), "resnet18", 0)
        assert params["curve_test"] == curve_test
        stage_training.run_training(params, data_dir=str(root / "data"), out_dir=str(root / name),
                                    log=logging.getLogger("t"), progress=False)
        runs[name] = root / name
    return root, runs


def test_the_curve_size_changes_no_model_and_its_last_point_is_the_prefix_top1(trained):
    root, runs = trained
    digest = {name: hashlib.sha256((folder / "model.pt").read_bytes()).hexdigest() for name, folder in runs.items()}
    assert digest["all"] == digest["prefix"]

    split = stage_models.load_split(root / "data", torch.device("cpu"))
    model, _ = stage_models.load_model(runs["prefix"] / "model.pt", torch.device("cpu"))
    _, normalise = stage_models.transforms(split["meta"], config.training_params(_params(), "resnet18", 0)["augment"])
    expected = {"all": evaluation.top1_percent(model, split["test_x"], split["test_y"], normalise, 64),
                "prefix": evaluation.top1_percent(model, split["test_x"][:PREFIX], split["test_y"][:PREFIX],
                                                  normalise, 64)}
    for name, folder in runs.items():
        curve = json.loads((folder / "train.json").read_text())["curves"]["test_top1"]
        assert len(curve) == 2 and curve[-1] == pytest.approx(expected[name], abs=1e-9)
    # 50 images give top-1 in steps of 2 %; the whole split of 200 in steps of 0.5 %
    assert (expected["prefix"] * PREFIX / 100) == pytest.approx(round(expected["prefix"] * PREFIX / 100))


def test_curve_data_takes_a_prefix_or_everything():
    split = {"test_x": torch.arange(10), "test_y": torch.arange(10) % 3}
    x, y = stage_training.curve_data(split, 4)
    assert x.tolist() == [0, 1, 2, 3] and y.tolist() == [0, 1, 2, 0]
    assert stage_training.curve_data(split, None)[0] is split["test_x"]
    assert len(stage_training.curve_data(split, 99)[0]) == 10


@pytest.mark.parametrize("bad", [0, -5, 2.5, "all"])
def test_a_bad_curve_size_is_refused_by_name(bad):
    with pytest.raises(ConfigError, match="curve_test"):
        _params(curve_test=bad)
