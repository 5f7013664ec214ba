"""What one workflow job pays before its work starts, phase by phase, in a fresh process
per phase group (as every Snakemake job is one): the interpreter, torch's import, the
device's context, MLflow's import and its SQLite store opened, codecarbon's tracker
started. The GPU profile's wall time is mostly such start-ups (bench/README.md "On a
GPU"); this says which phase to cut.

    python bench/job_startup.py [--device cuda] [--repeats 3] [--out startup.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Each probe runs in a fresh interpreter and prints a JSON object of phase -> seconds.
PROBE = r"""
import json, sys, time
t0 = time.perf_counter()
phases = {}
import torch
phases["import torch"] = time.perf_counter() - t0
device = sys.argv[1]
t = time.perf_counter()
if device == "cuda":
    torch.zeros(1, device="cuda"); torch.cuda.synchronize()
phases["device context"] = time.perf_counter() - t
t = time.perf_counter()
import darel.stagekit, darel.image_training, darel.plans
phases["import darel (stage, training)"] = time.perf_counter() - t
if sys.argv[2] == "mlflow":
    from darel import tracking
    t = time.perf_counter()
    tracking.start_cell_run(sys.argv[3], "startup", "bench/startup/s0/x", {"a": 1}, {"b": "c"})
    phases["MLflow import, store opened, run created"] = time.perf_counter() - t
    t = time.perf_counter()
    tracking.start_cell_run(sys.argv[3], "startup", "bench/startup/s0/y", {"a": 1}, {"b": "c"})
    phases["a second run in the same process"] = time.perf_counter() - t
    t = time.perf_counter()
    from darel.measure import EnergyTracker
    tracker = EnergyTracker(country_iso_code="USA", pue=1.0, measure_power_secs=1.0)
    tracker.start()
    phases["codecarbon tracker created and started"] = time.perf_counter() - t
    tracker.stop()
print(json.dumps(phases))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out")
    args = ap.parse_args()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MLFLOW_DISABLE_TELEMETRY": "true"}
    rows: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(dir=ROOT) as tmp:
        uri = f"sqlite:///{Path(tmp).relative_to(ROOT)}/startup.db"
        # The store created once first: every job but the first finds it there.
        subprocess.run([sys.executable, "-c", PROBE, "cpu", "mlflow", uri], cwd=ROOT, env=env, check=True,
                       capture_output=True)
        for _ in range(args.repeats):
            began = time.perf_counter()
            out = subprocess.run([sys.executable, "-c", PROBE, args.device, "mlflow", uri], cwd=ROOT, env=env,
                                 check=True, capture_output=True, text=True).stdout
            total = time.perf_counter() - began
            for phase, seconds in {**json.loads(out.strip().splitlines()[-1]), "whole process": total}.items():
                rows.setdefault(phase, []).append(seconds)
    print(f"job start-up phases on {args.device}, {args.repeats} fresh processes (s: median, min, max)")
    for phase, values in rows.items():
        values = sorted(values)
        print(f"  {phase:42s} {values[len(values) // 2]:6.2f} {values[0]:6.2f} {values[-1]:6.2f}")
    if args.out:
        Path(args.out).write_text(json.dumps({"device": args.device, "seconds": rows}, indent=1))


if __name__ == "__main__":
    main()
