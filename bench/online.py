"""Benchmarks of the online stage (Algorithm 3), measured side by side in one run.

1. Selection overhead: the time the selection machinery adds per emitted training
   batch (history push, histogram, keep probabilities, Bernoulli draws, batch
   assembly: everything in OnlineSampler.plan_epoch) relative to one plain training
   step of the same batch size. Goal: under 2 %.
2. Online boost: wall time of plain training against DAREL online training with
   A = 0.3 and eta = 1 / eta = 3, same model, data and epochs, next to the boost
   predicted from the measured forward (scoring) and training-step times:
       plain epoch  = N * t_step
       online epoch = A * N * t_step + N * t_fwd / eta
   (warm-up epochs cost a plain epoch).

Synthetic CIFAR-shaped data (3x32x32, 100 classes) by default; nothing is downloaded.
Usage: python bench/online.py [--width 16] [--n 1024] [--epochs 4] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from darel import evaluation, image_training, runtime
from darel.methods.darel import OnlineSettings
from darel.plans import RunPlan
from darel.schedules import LrSchedule
from darel.augment import DeviceAugment
from darel.models import build_model
from darel.sampler import OnlineSampler


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device, repeats):
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--warmup-epochs", type=int, default=1)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", help="also write the figures to this JSON file")
    args = ap.parse_args()
    device = runtime.resolve_device(args.device)
    runtime.configure_runtime(device, args.threads)
    gen = torch.Generator(device=device).manual_seed(0)
    images = torch.randint(0, 256, (args.n, 3, 32, 32), dtype=torch.uint8, generator=gen, device=device)
    labels = torch.randint(0, 100, (args.n,), generator=gen, device=device)
    aug = DeviceAugment(pad=4, hflip=True, max_rotation_deg=15, mean=[0.5071, 0.4865, 0.4409],
                        std=[0.2673, 0.2564, 0.2762])
    precision = "auto"  # fp32 on a CPU, bf16 (or fp16) on a GPU: the run's own step

    def fresh_model():
        torch.manual_seed(0)
        model = build_model("resnet18", num_classes=100, in_channels=3, width=args.width).to(device)
        return model.to(memory_format=torch.channels_last) if device.type == "cuda" else model

    # ---- per-step costs (the training loop's own step: gather, augment, update) ----------
    model = fresh_model()
    base_plan = RunPlan(epochs=args.epochs, batch=args.batch,
                        lr_schedule=LrSchedule("multistep", 0.05, milestones=(args.epochs,), gamma=0.2),
                        momentum=0.9, weight_decay=5e-4, seed=0, precision=precision, eval_batch=512)
    opt = image_training.make_optimizer(model, base_plan, device)
    train_step = image_training.image_train_step(model, opt, images, labels, aug, device, precision)
    rows = torch.arange(args.batch, device=device)

    def step():
        train_step(rows, gen)

    timed(step, device, 3)
    t_step_batch = timed(step, device, 7)
    t_fwd_all = timed(lambda: evaluation.per_sample_losses(model, images, labels, aug.normalise, 512, precision), device, 3)
    t_step_sample = t_step_batch / args.batch
    t_fwd_sample = t_fwd_all / args.n

    # ---- selection overhead per emitted batch --------------------------------------
    big_n = 50_000  # a CIFAR-sized epoch, so the per-chunk costs are representative
    sampler = OnlineSampler(n_samples=big_n, batch_size=args.batch, keep_fraction=0.3, eta=1, warmup_epochs=0,
                            history_size=4096, bins=20, seed=0, device=device)
    sampler.update_losses(0, torch.rand(big_n, device=device, generator=gen))
    sampler.plan_epoch(0)
    start = time.perf_counter()
    batches = sampler.plan_epoch(1)
    _sync(device)
    select_s = time.perf_counter() - start
    per_batch = select_s / max(len(batches), 1)
    overhead = {"selection_s_per_batch": per_batch, "train_step_s": t_step_batch,
                "overhead_pct": 100 * per_batch / t_step_batch, "batches": len(batches)}

    # ---- measured boost -------------------------------------------------------------
    runs = {}
    for name, online in [
        ("plain", None),
        ("A0.3_eta1", OnlineSettings(0.3, 1, args.warmup_epochs, 4096, 20)),
        ("A0.3_eta3", OnlineSettings(0.3, 3, args.warmup_epochs, 4096, 20)),
    ]:
        plan = RunPlan(**{**base_plan.__dict__, "selection": online})
        summary = image_training.train(fresh_model(), images, labels, aug, aug.normalise, plan, device, progress=False)
        runs[name] = summary["time_s"]

    def predicted(eta):
        online_epochs = args.epochs - args.warmup_epochs
        refreshes = len([e for e in range(online_epochs) if e % eta == 0])
        plain = args.epochs * args.n * t_step_sample
        online = (args.warmup_epochs * args.n * t_step_sample + online_epochs * 0.3 * args.n * t_step_sample
                  + refreshes * args.n * t_fwd_sample)
        return plain / online

    device_name = torch.cuda.get_device_name() if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"device: {device_name}; ResNet18 width {args.width}, 3x32x32, batch {args.batch}, N {args.n}, "
          f"{args.epochs} epochs ({args.warmup_epochs} warm-up)")
    print(f"train step {t_step_batch * 1e3:.2f} ms/batch; scoring forward {t_fwd_sample * 1e6:.1f} us/sample "
          f"({t_fwd_sample / t_step_sample:.2f} of a training step per sample)")
    print(f"selection overhead: {per_batch * 1e3:.3f} ms per emitted batch = {overhead['overhead_pct']:.2f} % "
          f"of a training step (goal < 2 %)")
    print(f"{'run':<12}{'time s':>10}{'boost':>10}{'predicted':>12}")
    print(f"{'plain':<12}{runs['plain']:>10.2f}{1.0:>10.2f}{1.0:>12.2f}")
    for eta in (1, 3):
        name = f"A0.3_eta{eta}"
        print(f"{name:<12}{runs[name]:>10.2f}{runs['plain'] / runs[name]:>10.2f}{predicted(eta):>12.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": device_name, "args": vars(args), "overhead": overhead,
                                               "times_s": runs, "t_step_s": t_step_batch, "t_fwd_sample_s": t_fwd_sample,
                                               "predicted_boost": {"eta1": predicted(1), "eta3": predicted(3)}},
                                              indent=2))


if __name__ == "__main__":
    main()
