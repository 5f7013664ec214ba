"""Every method of a study, trained end to end on a GPU at CIFAR shapes (3 x 32 x 32,
ResNet18, mixed precision, channels-last), under the matched schedule rule: each ends at
the schedule's final rate, trains the samples its plan says, and is timed on the GPU's
clock (wall time between device synchronisations, so time_s and wall_time_s agree).
Skipped without CUDA; run on a GPU machine (bench/README.md, "On a GPU")."""

import pytest
import torch

from darel import image_training
from darel import schedules
from darel.augment import DeviceAugment
from darel.measure.timing import PROBE_CLOCK
from darel.models import build_model
from test_controls import _matched_plans, _plan

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

N = 256  # _matched_plans' epoch sample counts are written for this n


def _cifar_like(n: int, classes: int = 4):
    gen = torch.Generator().manual_seed(0)
    labels = torch.arange(n) % classes
    images = (torch.rand(n, 3, 32, 32, generator=gen) * 120 + labels.view(-1, 1, 1, 1) * 30).to(torch.uint8)
    return images.cuda(), labels.cuda()


@pytest.mark.parametrize("name", list(_matched_plans(N)))
def test_each_study_method_trains_its_plan_on_the_gpu(name):
    settings = _matched_plans(N)[name]
    plan = _plan(epochs=6, precision="auto", **settings)
    images, labels = _cifar_like(N)
    torch.manual_seed(0)
    model = build_model("resnet18", num_classes=4, in_channels=3, width=16)
    aug = DeviceAugment(pad=4, hflip=True, max_rotation_deg=15, mean=[0.5] * 3, std=[0.25] * 3)
    rates = []
    summary = image_training.train(model, images, labels, aug, aug.normalise, plan, torch.device("cuda"), progress=False,
                           on_epoch_end=lambda epoch, record: rates.append(record["lr"]))

    assert summary["epochs_completed"] == settings["train_epochs"]
    final = 0.05 * schedules.final_factor(settings["lr_schedule"].shape, fractions=(0.3, 0.6, 0.8), gamma=0.2)
    assert rates[-1] == pytest.approx(final, abs=1e-12)
    assert summary["precision"] in ("bf16", "fp16")

    # The GPU clock: time_s is wall time between synchronisations, wall_time_s the same intervals.
    assert summary["clock"] == PROBE_CLOCK["cuda"]
    assert summary["time_s"] > 0
    assert summary["wall_time_s"] == pytest.approx(summary["time_s"], rel=0.02, abs=0.05)  # one clock, read twice

    # Samples trained against the plan: exact for the deterministic selections, within
    # binomial noise for the Bernoulli keeps of the online rules.
    planned = dict(settings["lr_schedule"].epoch_samples)
    trained = summary["curves"]["samples_trained"]
    if name in ("full (short-schedule)", "cosine"):
        assert trained == [N] * settings["train_epochs"]
    elif name == "rs2":
        assert trained == [round(planned["subset"])] * settings["train_epochs"]
    elif name == "infobatch":
        assert trained == [N, N - 20, N - 20, N]  # a full epoch, pruned ones, then the annealed full one
    else:
        assert trained[0] == N  # the warm-up epoch trains everything
        assert abs(sum(trained[1:]) - N / 2 * (len(trained) - 1)) < 0.25 * N
