"""On a GPU, the steady-state training step of every training path makes no host
synchronisation (skipped without CUDA; run it on a GPU machine). Planning an epoch may
synchronise once (forming the kept indices), so batches are planned before the check."""

import pytest
import torch

from darel import evaluation, image_training
from darel.methods.darel import OnlineSettings
from darel.methods.infobatch import InfoBatchSettings
from darel.methods.rs2 import RS2Settings
from darel.methods.selective_backprop import SelectiveBackpropSettings
from darel.plans import RunPlan
from darel.schedules import LrSchedule
from darel.augment import DeviceAugment
from darel.measure import StepMemoryMeter
from darel.models import build_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _plans():
    base = dict(epochs=4, batch=32, lr_schedule=LrSchedule("multistep", 0.05, milestones=(3,), gamma=0.2),
                momentum=0.9, weight_decay=5e-4, seed=0, eval_batch=64, precision="auto")
    online = OnlineSettings(keep_fraction=0.5, eta=1, warmup_epochs=1, history_size=256, bins=10)
    return {
        "baseline": RunPlan(**base),
        "darel-online": RunPlan(**base, selection=online),
        "uniform-online": RunPlan(**base, selection=OnlineSettings(0.5, 1, 1, 256, 10, rule="uniform")),
        "infobatch": RunPlan(**base, selection=InfoBatchSettings(prune_count=128, anneal_start_epoch=3)),
        "short-schedule": RunPlan(**{**base, "lr_schedule": LrSchedule("linear", 0.05, total_steps=40)}),
        "selective-backprop": RunPlan(**base, selection=SelectiveBackpropSettings(
            beta=3.0, warmup_epochs=1, history_size=256)),
        "rs2": RunPlan(**base, selection=RS2Settings(ratio=0.4)),
    }


@pytest.mark.parametrize("name", list(_plans()))
def test_training_steps_make_no_host_sync(name):
    plan = _plans()[name]
    device = torch.device("cuda")
    n = 256
    images = torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8, device=device)
    labels = torch.randint(0, 10, (n,), device=device)
    aug = DeviceAugment(pad=4, hflip=True, max_rotation_deg=15, mean=[0.5, 0.5, 0.5], std=[0.25, 0.25, 0.25])
    model = build_model("resnet18", num_classes=10, in_channels=3, width=16).to(device)
    model.to(memory_format=torch.channels_last)
    optimizer = image_training.make_optimizer(model, plan, device)
    step = image_training.image_train_step(model, optimizer, images, labels, aug, device, plan.precision)
    policy = image_training.make_policy(plan, n, device)
    meter = StepMemoryMeter(model, optimizer, device)
    gen = image_training.epoch_generator(0, 0, 1, device)

    def score(positions):
        return evaluation.per_sample_losses(model, images, labels, aug.normalise, 64, plan.precision, rows=positions)

    for epoch in range(2):  # a warm-up epoch, then an online one
        batches = list(policy.batches(epoch, score))
        step(*((batches[0][0], gen, batches[0][1])))  # first step: allocations, cudnn autotuning
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for positions, weights in batches[1:4]:
                with meter.step(key=len(positions)):
                    stats = step(positions, gen, weights)
                policy.observe(positions, stats["losses"])
        finally:
            torch.cuda.set_sync_debug_mode("default")
