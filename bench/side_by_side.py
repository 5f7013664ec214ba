"""Two planned trainings side by side against one alone: what a neighbour on the other core
costs a run's ``time_s``, and what running two at once gains in throughput.

    python bench/side_by_side.py                 # quick profile's ResNet18, 4 epochs, 2 rounds
    python bench/side_by_side.py --epochs 6 --rounds 3

The profile key ``planned_side_by_side`` lets the workflow run two trainings that follow a
fixed plan at once, one core each, where they used to hold every core and run one at a
time (workflow/rules/common.smk). The plan fixes the trained model; what can change is
the measured time. Each round trains the same run (same seed, same plan) once alone and
then twice at once, in fresh processes, alternating so that a drift of the machine's speed
falls on both sides. Printed: ``time_s`` (process CPU time, the clock of every CPU budget),
``wall_time_s``, the neighbour each run recorded (``cores_beside``), the ratios beside /
alone, the throughput of a pair against one run at a time, and whether all the trained
weights are identical.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _settings(epochs: int):
    from darel import config, plans

    cfg = config.load_params(ROOT / "params.yaml")
    model = cfg["profiles"]["quick"]["models"]["resnet18"]
    model.update(epochs=epochs, milestones=[max(1, epochs // 2)], warmup_epochs=1)
    return cfg, plans.ImageSettings.from_slice(config.training_params(cfg, "resnet18", 0))


def _train(epochs: int, start, results) -> None:
    """One training in this (fresh) process; waits for ``start`` so a pair begins together."""
    import torch

    from darel import config, image_training
    from darel.augment import to_tensors
    from darel.data import build_dataset

    sys.path.insert(0, str(ROOT / "bench"))
    from cpu_clock import planned_run

    cfg, settings = _settings(epochs)
    torch.set_num_threads(settings.runtime.threads)
    train, _test, meta = build_dataset(config.dataset_params(cfg), ROOT / "data/raw", progress=False)
    x, y = to_tensors(train, "cpu")
    plan, model, aug = planned_run(settings, meta)
    start.wait()
    began = time.perf_counter()
    summary = image_training.train(model, x, y, aug, aug.normalise, plan, torch.device("cpu"), progress=False)
    weights = torch.cat([p.detach().reshape(-1) for p in model.state_dict().values() if p.dtype.is_floating_point])
    results.put({"time_s": summary["time_s"], "wall_time_s": summary["wall_time_s"],
                 "cores_beside": summary["cores_beside"], "process_wall_s": time.perf_counter() - began,
                 "checksum": float(weights.double().sum())})


def _at_once(copies: int, epochs: int) -> tuple[list[dict], float]:
    """``copies`` trainings started together; their records and the wall time until the last ends."""
    ctx = multiprocessing.get_context("spawn")
    start, results = ctx.Barrier(copies + 1), ctx.Queue()
    procs = [ctx.Process(target=_train, args=(epochs, start, results)) for _ in range(copies)]
    for proc in procs:
        proc.start()
    start.wait()  # every copy has its data and model: the clock starts for all at once
    began = time.perf_counter()
    records = [results.get() for _ in range(copies)]
    elapsed = time.perf_counter() - began
    for proc in procs:
        proc.join()
        if proc.exitcode:
            raise SystemExit(f"a training process failed (exit code {proc.exitcode})")
    return records, elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2, help="alone-then-pair rounds (alternating)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    if args.epochs < 1 or args.rounds < 1:
        ap.error(f"--epochs {args.epochs} and --rounds {args.rounds} must be at least 1")
    alone, beside, pair_walls, alone_walls = [], [], [], []
    for round_index in range(args.rounds):
        for copies in ((1, 2) if round_index % 2 == 0 else (2, 1)):
            records, elapsed = _at_once(copies, args.epochs)
            (alone if copies == 1 else beside).extend(records)
            (alone_walls if copies == 1 else pair_walls).append(elapsed)
            print(f"round {round_index + 1}: {copies} at once, {elapsed:.1f} s: "
                  + ", ".join(f"time_s {r['time_s']:.2f} beside {r['cores_beside']:.2f}" for r in records), flush=True)

    def median(rows: list[dict], key: str) -> float:
        return statistics.median(r[key] for r in rows)

    figures = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "epochs": args.epochs, "rounds": args.rounds,
        "alone": {k: median(alone, k) for k in ("time_s", "wall_time_s", "cores_beside")},
        "beside": {k: median(beside, k) for k in ("time_s", "wall_time_s", "cores_beside")},
        "time_s_ratio": median(beside, "time_s") / median(alone, "time_s"),
        "wall_time_s_ratio": median(beside, "wall_time_s") / median(alone, "wall_time_s"),
        # two runs per pair against one run per alone interval
        "throughput_gain": 2 * statistics.median(alone_walls) / statistics.median(pair_walls),
        "same_weights": len({r["checksum"] for r in alone + beside}) == 1,
    }
    print(f"machine: {figures['machine']}; quick profile ResNet18 width 4, batch 32, {args.epochs} epochs, one torch "
          f"thread per run; {args.rounds} rounds (alone and two at once, alternating), medians")
    print(f"{'':<24}{'alone':>10}{'beside':>10}{'beside / alone':>16}")
    for key in ("time_s", "wall_time_s"):
        a, b = figures["alone"][key], figures["beside"][key]
        print(f"{key + ' (s)':<24}{a:>10.2f}{b:>10.2f}{b / a:>16.3f}")
    print(f"{'cores_beside':<24}{figures['alone']['cores_beside']:>10.2f}{figures['beside']['cores_beside']:>10.2f}")
    print(f"throughput of two at once against one at a time: {figures['throughput_gain']:.2f}x")
    print(f"same trained weights in every run: {figures['same_weights']}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
