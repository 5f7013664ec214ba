"""Evaluation and scoring passes run without cuDNN's algorithm search, so that a run's
first pass at a shape meters what the calibration's probe of that pass metered (the
GPU run of 2026-11-27: 8.9 GB against 5.6 GB). The flag is process-wide, so the test
runs on a CPU too; training steps keep the search."""

import pytest
import torch
import torch.nn as nn

from darel import evaluation


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
