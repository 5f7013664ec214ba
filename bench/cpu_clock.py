"""One training run idle and beside CPU hogs: the CPU clock of ``time_s`` against the wall.

    python bench/cpu_clock.py                # the quick profile's ResNet18 baseline, 4 epochs
    python bench/cpu_clock.py --hogs 2 --epochs 6

On a CPU a cell's ``time_s`` is the process CPU time of its timed intervals (the clock of
the calibration's probes), ``wall_time_s`` the wall time beside it. The same run (same
seed, same plan: the same trained model) is timed twice in this process, first alone,
then with ``--hogs`` busy-looping processes competing for the cores; the table gives both
figures and their ratio hogged / idle. A budget planned in CPU seconds holds on a busy
machine only if ``time_s`` stays put while ``wall_time_s`` grows.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from darel import config, image_training, plans  # noqa: E402
from darel.data import build_dataset  # noqa: E402
from darel.augment import DeviceAugment, to_tensors  # noqa: E402
from darel.models import build_model  # noqa: E402


def _hog() -> None:
    while True:
        pass


def planned_run(settings: plans.ImageSettings, meta: dict):
    """The run's plan, its freshly seeded model and its augmentation (also bench/side_by_side.py)."""
    plan = plans.run_plan(settings)
    torch.manual_seed(settings.seed)
    model = build_model("resnet18", num_classes=meta["num_classes"], in_channels=meta["channels"],
                        width=settings.protocol.width)
    aug = DeviceAugment(pad=settings.augment["pad"], hflip=settings.augment["hflip"],
                        max_rotation_deg=settings.augment["rotation_deg"], mean=meta["mean"], std=meta["std"])
    return plan, model, aug


def _run(settings: plans.ImageSettings, split: dict, meta: dict) -> dict:
    plan, model, aug = planned_run(settings, meta)
    summary = image_training.train(model, split["train_x"], split["train_y"], aug, aug.normalise, plan,
                                   torch.device("cpu"), progress=False)
    weights = torch.cat([p.detach().reshape(-1) for p in model.state_dict().values() if p.dtype.is_floating_point])
    return {"time_s": summary["time_s"], "wall_time_s": summary["wall_time_s"], "checksum": float(weights.sum())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--hogs", type=int, default=os.cpu_count() or 2, help="busy processes beside the second run")
    args = ap.parse_args()
    cfg = config.load_params(ROOT / "params.yaml")
    cfg["profiles"]["quick"]["models"]["resnet18"]["epochs"] = args.epochs
    cfg["profiles"]["quick"]["models"]["resnet18"]["milestones"] = [max(1, args.epochs // 2)]
    cfg["profiles"]["quick"]["models"]["resnet18"]["warmup_epochs"] = 1
    settings = plans.ImageSettings.from_slice(config.training_params(cfg, "resnet18", 0))
    torch.set_num_threads(settings.runtime.threads)
    train, test, meta = build_dataset(config.dataset_params(cfg), ROOT / "data/raw", progress=False)
    split = dict(zip(("train_x", "train_y"), to_tensors(train, "cpu")))
    idle = _run(settings, split, meta)
    hogs = [multiprocessing.Process(target=_hog, daemon=True) for _ in range(args.hogs)]
    for hog in hogs:
        hog.start()
    try:
        busy = _run(settings, split, meta)
    finally:
        for hog in hogs:
            hog.kill()
            hog.join()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; torch threads "
          f"{settings.runtime.threads}; ResNet18 width {settings.protocol.width}, {args.epochs} epochs of the quick "
          f"profile's data; {args.hogs} busy-looping processes beside the second run")
    print(f"{'':<22}{'idle':>10}{'beside hogs':>14}{'hogged / idle':>15}")
    for key in ("time_s", "wall_time_s"):
        print(f"{key + ' (s)':<22}{idle[key]:>10.2f}{busy[key]:>14.2f}{busy[key] / idle[key]:>15.2f}")
    print(f"same trained weights: {idle['checksum'] == busy['checksum']}")


if __name__ == "__main__":
    main()
