"""What the first epoch of a run pays once, piece by piece, with and without cuDNN's
algorithm search, each variant in a fresh process (as every workflow job is one).

On the GPU profile every run's first epoch took about 11 s more of timed training and 6 s
more outside it than its later epochs (bench/results/gpu_2026-11-27b: baseline epoch 1
16.9 s, epochs 2-4 5.7-5.9 s), across 6 runs most of a minute of the profile's wall. This
measures, for ResNet18 at the gpu profile's shapes (32x32x3, 100 classes, width 64, batch
128, bf16 where the GPU has it, channels-last), the first step of each batch shape the
epoch meets (the full batch and the epoch's last, smaller one), the steady step, and the
first and second evaluation passes (batch 1024 and its remainder), with
``torch.backends.cudnn.benchmark`` on (the training step's setting today) and off.

    python bench/gpu_warmup.py --device cuda [--out warmup.json]
    python bench/gpu_warmup.py --device cpu --width 8 --n-train 512 --n-test 300   (the path, on a CPU)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# One variant in a fresh interpreter; prints a JSON object of piece -> seconds.
PROBE = r"""
import json, sys, time
settings = json.loads(sys.argv[1])
t0 = time.perf_counter()
import torch
from darel.augment import DeviceAugment
from darel.evaluation import top1_percent
from darel.image_training import image_train_step
from darel.models import build_model
from darel.step import resolve_precision, sgd
device = torch.device(settings["device"])
torch.set_num_threads(settings["threads"])
torch.backends.cudnn.benchmark = settings["cudnn_benchmark"]
out = {"imports": time.perf_counter() - t0}

def sync():
    if device.type == "cuda":
        torch.cuda.synchronize()

def timed(name, fn):
    sync(); t = time.perf_counter(); value = fn(); sync()
    out[name] = time.perf_counter() - t
    return value

gen = torch.Generator().manual_seed(0)
n, n_test, side = settings["n_train"], settings["n_test"], 32
images = timed("data onto the device (context included)", lambda: torch.randint(
    0, 256, (n, 3, side, side), dtype=torch.uint8, generator=gen).to(device))
labels = torch.randint(0, 100, (n,), generator=gen).to(device)
test_x = torch.randint(0, 256, (n_test, 3, side, side), dtype=torch.uint8, generator=gen).to(device)
test_y = torch.randint(0, 100, (n_test,), generator=gen).to(device)
torch.manual_seed(0)
model = build_model("resnet18", num_classes=100, in_channels=3, width=settings["width"]).to(device)
if device.type == "cuda":
    model = model.to(memory_format=torch.channels_last)
precision = resolve_precision("auto", device)
out["precision"] = precision
aug = DeviceAugment(pad=2, hflip=False, max_rotation_deg=10, mean=[0.5] * 3, std=[0.25] * 3)
optimizer = sgd(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4, device=device)
step = image_train_step(model, optimizer, images, labels, aug, device, precision)
batch = settings["batch"]
last = n % batch or batch
step_gen = torch.Generator(device=device).manual_seed(1)
order = torch.randperm(n, device=device)
timed("first step, full batch", lambda: step(order[:batch], step_gen))
timed("second step, full batch", lambda: step(order[batch:2 * batch], step_gen))
timed("first step, the epoch's last batch (%d)" % last, lambda: step(order[:last], step_gen))
timed("second step, the epoch's last batch", lambda: step(order[:last], step_gen))
steps = settings["steady_steps"]
def steady():
    for i in range(steps):
        step(order[(i % (n // batch)) * batch:][:batch], step_gen)
timed("_steady", steady)
out["steady step (mean of %d)" % steps] = out.pop("_steady") / steps
timed("first evaluation pass", lambda: top1_percent(model, test_x, test_y, aug.normalise, 1024, precision))
timed("second evaluation pass", lambda: top1_percent(model, test_x, test_y, aug.normalise, 1024, precision))
model.train()
print(json.dumps(out))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--n-train", type=int, default=50_000)
    ap.add_argument("--n-test", type=int, default=10_000)
    ap.add_argument("--steady-steps", type=int, default=50)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--out")
    args = ap.parse_args()
    results = {}
    for search in (True, False):
        settings = {"device": args.device, "width": args.width, "batch": args.batch, "n_train": args.n_train,
                    "n_test": args.n_test, "steady_steps": args.steady_steps, "threads": args.threads,
                    "cudnn_benchmark": search}
        done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(settings)], cwd=ROOT, capture_output=True,
                              text=True, env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
        if done.returncode != 0:
            sys.exit(f"cudnn.benchmark={search}: the probe failed:\n{done.stderr[-3000:]}")
        results[f"cudnn.benchmark={search}"] = json.loads(done.stdout.strip().splitlines()[-1])
    pieces = [key for key in results["cudnn.benchmark=True"] if key != "precision"]
    print(f"ResNet18 width {args.width}, batch {args.batch}, {args.n_train} + {args.n_test} images 32x32x3, "
          f"{args.device}, precision {results['cudnn.benchmark=True']['precision']}; seconds, one fresh process each")
    print("| piece | cudnn.benchmark on | off |")
    print("|---|---|---|")
    for piece in pieces:
        on, off = results["cudnn.benchmark=True"][piece], results["cudnn.benchmark=False"][piece]
        print(f"| {piece} | {on:.4f} | {off:.4f} |")
    steady = next(p for p in pieces if p.startswith("steady"))
    for name, row in results.items():
        extra = (row["first step, full batch"] + row[next(p for p in pieces if p.startswith("first step, the epoch"))]
                 - 2 * row[steady])
        print(f"{name}: the first steps of the two shapes cost {extra:.2f} s more than two steady steps; "
              f"the first evaluation {row['first evaluation pass'] - row['second evaluation pass']:.2f} s more "
              f"than the second")
    if args.out:
        Path(args.out).write_text(json.dumps({"settings": vars(args), "results": results}, indent=1))


if __name__ == "__main__":
    main()
