"""Two costs every CPU training job paid before its work, before and after they were cut,
side by side in fresh processes (each workflow job is one), the two ways alternating:

* the optimizer: building torch.optim.SGD imports torch's compiler (torch._dynamo), which
  an eager job never uses; darel.sgd.PlainSGD does the same arithmetic without it. Timed:
  building the optimizer and its first step on the quick profile's ResNet18.
* codecarbon's start: it names the CPU with py-cpuinfo, which runs CPUID in a second Python
  interpreter; darel.measure.energy gives it the kernel's name for the same CPU instead.

Seconds are wall (perf_counter) and CPU (the process's and its children's, so py-cpuinfo's
interpreter counts) of the timed part only, medians over the rounds.

    python bench/lean_start.py [--rounds 5] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# One fresh interpreter: set up outside the clock, then time one way of one part.
PROBE = r"""
import json, resource, sys, time
import torch
import torch.nn.functional as F
part, way = sys.argv[1], sys.argv[2]

def cpu():
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime

if part == "optimizer":
    from darel.models import build_model
    from darel.sgd import PlainSGD
    torch.set_num_threads(1)
    model = build_model("resnet18", num_classes=10, in_channels=3, width=4)
    F.cross_entropy(model(torch.randn(8, 3, 16, 16)), torch.arange(8)).backward()
    make = torch.optim.SGD if way == "before" else PlainSGD
    wall, began = time.perf_counter(), cpu()
    optimizer = make(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    optimizer.step()
else:
    from darel.measure import energy
    if way == "before":
        energy.kernel_cpu_brand = lambda *args: None  # codecarbon names the CPU itself, as before
    tracker = energy.EnergyTracker("USA", measure_power_secs=60.0)
    wall, began = time.perf_counter(), cpu()
    tracker.start()
wall, used = time.perf_counter() - wall, cpu() - began
if part == "energy":
    tracker.stop()
print(json.dumps({"wall_s": wall, "cpu_s": used, "compiler_imported": "torch._dynamo" in sys.modules}))
"""

PARTS = {"optimizer": ("torch.optim.SGD", "darel PlainSGD"),
         "energy": ("codecarbon names the CPU (py-cpuinfo)", "the kernel's CPU name")}


def probe(part: str, way: str) -> dict:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run([sys.executable, "-c", PROBE, part, way], cwd=ROOT, env=env, capture_output=True,
                          text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def median(values: list[float]) -> float:
    values = sorted(values)
    return values[len(values) // 2]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error(f"--rounds must be at least 1, got {args.rounds}")
    rows = {(part, way): [] for part in PARTS for way in ("before", "after")}
    for round_ in range(args.rounds):
        for part in PARTS:
            for way in (("before", "after") if round_ % 2 == 0 else ("after", "before")):
                rows[part, way].append(probe(part, way))
    print(f"job start costs, {args.rounds} alternating rounds of fresh processes, {os.cpu_count()} cores, "
          f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}, torch {_torch_version()}")
    print(f"{'part':<10}{'way':<42}{'wall s':>8}{'cpu s':>8}  compiler imported")
    summary = {}
    for part, names in PARTS.items():
        for way, name in zip(("before", "after"), names):
            runs = rows[part, way]
            summary[part, way] = (median([r["wall_s"] for r in runs]), median([r["cpu_s"] for r in runs]))
            imported = sorted({r["compiler_imported"] for r in runs})
            print(f"{part:<10}{name:<42}{summary[part, way][0]:>8.3f}{summary[part, way][1]:>8.3f}  {imported}")
    for part in PARTS:
        (wall_b, cpu_b), (wall_a, cpu_a) = summary[part, "before"], summary[part, "after"]
        print(f"{part}: {wall_b - wall_a:.2f} s wall and {cpu_b - cpu_a:.2f} s CPU saved per job "
              f"({wall_b / wall_a:.0f}x wall)" if wall_a > 0 else f"{part}: after took no measurable time")
    if args.out:
        Path(args.out).write_text(json.dumps({f"{p}/{w}": runs for (p, w), runs in rows.items()}, indent=1))


def _torch_version() -> str:
    import torch

    return torch.__version__


if __name__ == "__main__":
    main()
