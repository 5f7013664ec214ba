"""What torch.compile's on-disk cache saves a job: the same compiled training step (forward,
loss, backward of ResNet18) in two fresh processes that share one cache folder, the first
with the folder empty (cold), the second after it (warm), side by side in one run. Every
workflow job is a fresh process, so on a compiled profile each training and scoring job
pays the first call's compile unless the cache already holds its graphs. torch keeps that
cache in ``TORCHINDUCTOR_CACHE_DIR`` (default ``/tmp/torchinductor_<user>``); a cluster
whose jobs get a private /tmp starts every job cold (docs/gpu.md, "torch.compile's cache").

    python bench/compile_cache.py [--device cpu|cuda] [--width 8] [--batch 8] [--size 8] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# One fresh interpreter: build the model, compile its forward and loss, time the first call
# (forward and backward), print the seconds and inductor's cache counters as JSON.
PROBE = r"""
import json, sys, time
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters
from darel.models import build_model
device, width, batch, size, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
torch.set_num_threads(threads)
torch.manual_seed(0)
model = build_model("resnet18", num_classes=10, in_channels=3, width=width).to(device)
x = torch.randn(batch, 3, size, size, device=device)
y = torch.arange(batch, device=device) % 10
step = torch.compile(lambda x, y: F.cross_entropy(model(x), y), dynamic=False)
if device == "cuda":
    torch.cuda.synchronize()
start = time.perf_counter()
step(x, y).backward()
if device == "cuda":
    torch.cuda.synchronize()
first = time.perf_counter() - start
start = time.perf_counter()
step(x, y).backward()
if device == "cuda":
    torch.cuda.synchronize()
hits = {k: v for group in ("inductor", "aot_autograd") for k, v in counters[group].items() if "cache" in k}
print(json.dumps({"first_call_s": first, "second_call_s": time.perf_counter() - start, "cache": hits}))
"""


def probe(cache: Path, args: argparse.Namespace) -> dict:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache),
           "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run([sys.executable, "-c", PROBE, args.device, str(args.width), str(args.batch), str(args.size),
                           str(args.threads)], env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--width", type=int, default=8, help="ResNet18's width (64: the paper's)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--size", type=int, default=8, help="image side in pixels")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads in each probe")
    ap.add_argument("--out", help="also write the figures as JSON here")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="compile-cache-") as folder:
        cold = probe(Path(folder), args)
        warm = probe(Path(folder), args)
    print(f"ResNet18 width {args.width}, batch {args.batch}, {args.size}x{args.size} px, {args.device}, "
          f"{args.threads} thread(s); each in a fresh process sharing one cache folder")
    for name, run in (("cold (empty cache)", cold), ("warm (same folder)", warm)):
        print(f"  {name:<20} first call {run['first_call_s']:7.2f} s, second call {run['second_call_s']:6.3f} s; "
              f"cache {json.dumps(run['cache'], sort_keys=True)}")
    print(f"  the warm cache cuts the first call to {warm['first_call_s'] / cold['first_call_s']:.3f} of the cold one "
          f"({cold['first_call_s'] - warm['first_call_s']:.1f} s saved per process)")
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "cold": cold, "warm": warm}, indent=2) + "\n")


if __name__ == "__main__":
    main()
