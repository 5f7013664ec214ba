"""Evaluation and scoring passes run without cuDNN's algorithm search, so that a run's
first pass at a shape meters what the calibration's probe of that pass metered (the
GPU run of 2026-11-27: 8.9 GB against 5.6 GB). The flag is process-wide, so the test
runs on a CPU too; training steps keep the search unless the profile turns it off
(``cudnn_benchmark: false``, the gpu profile: the search's seconds per new shape are paid
by every short run and every calibration probe)."""

import logging

import pytest
import torch
import torch.nn as nn

from darel import config, evaluation, plans, runtime
from tests.conftest import ROOT


class _Spy(nn.Module):
    """A linear classifier that notes cuDNN's benchmark flag on every forward."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(12, 3)
        self.seen = []

    def forward(self, x):
        self.seen.append(torch.backends.cudnn.benchmark)
        return self.fc(x.flatten(1))


@pytest.fixture
def search_on():
    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True  # as runtime.configure_runtime sets it for a non-deterministic run
    yield
    torch.backends.cudnn.benchmark = before


def test_every_evaluation_pass_runs_without_the_search_and_restores_it(search_on):
    model = _Spy()
    images, labels = torch.randn(10, 3, 2, 2), torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2, 0])
    losses = evaluation.per_sample_losses(model, images, labels, lambda x: x, batch=4)
    top1 = evaluation.top1_percent(model, images, labels, lambda x: x, batch=3)
    evaluation.penultimate_features(type("M", (), {"features": model, "eval": model.eval, "train": model.train,
                                                   "training": True})(), images, lambda x: x, batch=5)
    assert losses.shape == (10,) and 0.0 <= top1 <= 100.0
    assert len(model.seen) == 3 + 4 + 2 and not any(model.seen)  # batches of 4, 3 and 5 over 10 samples
    assert torch.backends.cudnn.benchmark is True
    assert model.training  # the pass restores the training mode too


def test_the_flag_comes_back_when_a_pass_fails(search_on):
    def head(*_):
        raise RuntimeError("out of memory (simulated)")

    with pytest.raises(RuntimeError, match="simulated"):
        evaluation._eval_batches(nn.Linear(12, 3), torch.randn(4, 12), lambda x: x, 2, "fp32", head)
    assert torch.backends.cudnn.benchmark is True


# ---- a profile's cudnn_benchmark: the search off in training and the calibration's probes too ----

def test_configure_runtime_sets_the_search_from_the_profile(search_on):
    """The flag is only set for a CUDA device; setting it needs no GPU."""
    cuda = torch.device("cuda")
    runtime.configure_runtime(cuda, 1, take_turn=False, algorithm_search=False)
    assert torch.backends.cudnn.benchmark is False
    runtime.configure_runtime(cuda, 1, take_turn=False)
    assert torch.backends.cudnn.benchmark is True
    runtime.configure_runtime(cuda, 1, deterministic=False, take_turn=False, algorithm_search=True)
    assert torch.backends.cudnn.benchmark is True
    torch.backends.cudnn.benchmark = False
    runtime.configure_runtime(torch.device("cpu"), 1, take_turn=False, algorithm_search=True)
    assert torch.backends.cudnn.benchmark is False  # a CPU run leaves cuDNN alone


def test_only_a_profile_that_sets_it_carries_it_in_its_slices():
    """The gpu profile turns the search off; the other profiles' slices, and so their jobs'
    parameter hashes, stay as they were without the key."""
    quick = config.load_params(ROOT / "params.yaml")
    gpu = config.load_params(ROOT / "params.yaml", {"profile": "gpu"})
    assert "cudnn_benchmark" not in config.training_params(quick, "resnet18")
    assert "cudnn_benchmark" not in config.training_params(config.load_params(ROOT / "params.yaml",
                                                                              {"profile": "paper"}), "resnet18")
    sliced = config.calibration_params(gpu, "resnet18", "t0.80_m0.80")
    assert sliced["cudnn_benchmark"] is False
    assert plans.ImageSettings.from_slice(config.online_params(gpu, "resnet18", "t0.80_m0.80")).runtime \
        .cudnn_benchmark is False
    assert plans.ImageSettings.from_slice(config.online_params(quick, "resnet18", "t0.80_m0.80")).runtime \
        .cudnn_benchmark is True
    with pytest.raises(config.ConfigError, match="cudnn_benchmark"):
        config.load_params(ROOT / "params.yaml", {"profiles": {"gpu": {"cudnn_benchmark": "no"}}})


def test_training_runs_and_data_stages_pass_the_profile_setting_on(monkeypatch):
    """A training run (TrainingRun) and a stage that loads the data (calibration probes,
    scoring, evaluation, IDS) configure the runtime with the profile's setting."""
    from darel.stagekit import models, training

    seen = []
    monkeypatch.setattr(runtime, "configure_runtime", lambda device, threads, **kw: seen.append(kw))
    monkeypatch.setattr(models, "load_split", lambda folder, device: {"folder": folder})
    training.TrainingRun(logging.getLogger("t"), device="cpu", threads=1, carbon={}, defer_turn=True,
                         algorithm_search=False)
    models.device_and_split({"device": "cpu", "threads": 1, "cudnn_benchmark": False}, "data")
    models.device_and_split({"device": "cpu", "threads": 1}, "data")
    assert [kw["algorithm_search"] for kw in seen] == [False, False, True]
