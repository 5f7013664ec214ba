"""The study-spread diagnostics: BatchNorm statistics re-estimated over a pass, and the
curve figures of bench/study_spread.py, on tiny made-up inputs."""

from __future__ import annotations

import json
import statistics

import pytest
import torch
import torch.nn as nn

from darel import evaluation
from tests.conftest import load_script


def test_reestimate_gives_the_whole_pass_mean_and_variance_and_restores_the_model():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 1, bias=False), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten())
    bn = model[1]
    bn.running_mean.fill_(5.0)  # stale statistics from a "training"
    weights = model[0].weight.detach().clone()
    images = torch.randn(24, 3, 2, 2) * 3 + 1
    model.eval()

    assert evaluation.reestimate_batchnorm(model, images, lambda x: x, batch=8) == 1

    features = model[0](images).detach()  # the layer's input over the whole pass
    per_batch_mean = torch.stack([features[i:i + 8].mean(dim=(0, 2, 3)) for i in range(0, 24, 8)])
    torch.testing.assert_close(bn.running_mean, per_batch_mean.mean(0))  # equal batches: the pass's mean
    unbiased = torch.stack([features[i:i + 8].transpose(0, 1).reshape(4, -1).var(dim=1) for i in range(0, 24, 8)])
    torch.testing.assert_close(bn.running_var, unbiased.mean(0))
    assert bn.momentum == pytest.approx(0.1) and not model.training
    torch.testing.assert_close(model[0].weight, weights)
    assert int(bn.num_batches_tracked) == 3


def test_curve_figures_spread_and_correlation(tmp_path):
    bench = load_script("bench/study_spread.py", "study_spread")
    study = tmp_path / "study"
    curves = {0: [10, 20, 30, 40, 41], 1: [12, 18, 33, 44, 45], 2: [8, 22, 29, 35, 36]}
    for seed, curve in curves.items():
        folder = study / f"s{seed}" / "t0.50_m0.55" / "darel"
        folder.mkdir(parents=True)
        (folder / "train.json").write_text(json.dumps({"curves": {"test_top1": curve}}))

    [row] = bench.curve_figures(study, ["t0.50_m0.55"], [0, 1, 2])

    final = [41, 45, 36]
    at_30pc = [20, 18, 22]  # round(0.3 * 5) = 2nd epoch
    assert row["n"] == 3 and row["method"] == "darel"
    assert row["sd_final"] == pytest.approx(statistics.stdev(final))
    assert row["sd_first"] == pytest.approx(statistics.stdev([10, 12, 8]))
    assert row["r_30pc_final"] == pytest.approx(statistics.correlation(at_30pc, final))
    assert row["r_first_final"] == pytest.approx(statistics.correlation([10, 12, 8], final))
