"""What device turns can take off a GPU run's wall, and what they took: read from the stage
logs that a GPU session brings back (bench/gpu_session.sh packs them into table1_run.tar.gz).

For every GPU job (baseline, scoring, calibration, training, evaluation, IDS) it prints the
seconds from the process's start to its first use of the device: the start-up that a job
can do while another one works (darel/devicelock.py). For logs written with turns it also
prints how long the job waited for its turn. Old logs (before turns) have no turn line:
the first use of the device is then the moment the data set went onto it, and for the
image trainings the live MLflow run, which turns moved before it, is added.

    python bench/gpu_turns.py bench/results/gpu_2026-11-27b/table1_run_call1.tar.gz
"""

from __future__ import annotations

import argparse
import re
import tarfile
from collections import defaultdict
from datetime import datetime
from pathlib import Path

GPU_STAGES = ("pretrain", "score", "calibrate", "train", "evaluate", "ids_subset")
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def _at(line: str) -> datetime:
    return datetime.strptime(STAMP.match(line).group(1), "%Y-%m-%d %H:%M:%S,%f")


def before_device(text: str) -> dict | None:
    """{"start_s": seconds before the first use of the device, "wait_s": the turn's wait or None}."""
    lines = [line for line in text.splitlines() if STAMP.match(line)]
    age = next((float(m.group(1)) for line in lines if (m := re.search(r"([\d.]+) s since the process started", line))),
               None)
    if age is None or not lines:
        return None
    first = _at(lines[0])
    turn = next((line for line in lines if "for its turn" in line), None)
    if turn is not None:
        wait = float(re.search(r"wait of ([\d.]+) s", turn).group(1))
        return {"start_s": age + (_at(turn) - first).total_seconds() - wait, "wait_s": wait}
    placed = next((line for line in lines if "data set on" in line), None)
    if placed is None:
        return None
    start = age + (_at(placed) - first).total_seconds()
    plan = next((line for line in lines if "run plan:" in line), None)
    live = next((line for line in lines if "MLflow run " in line), None)
    if plan and live and _at(live) > _at(placed):
        start += (_at(live) - _at(plan)).total_seconds()  # the live run now comes before the turn
    return {"start_s": start, "wait_s": None}


def logs_of(source: Path) -> dict[str, str]:
    if source.is_dir():
        return {str(p): p.read_text() for p in source.rglob("*.log")}
    with tarfile.open(source) as tar:
        return {m.name: tar.extractfile(m).read().decode() for m in tar.getmembers()
                if m.isfile() and m.name.endswith(".log") and m.name.startswith("logs/")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source", type=Path, help="table1_run.tar.gz of a GPU session, or a logs/ folder")
    args = ap.parse_args()
    by_stage: dict[str, list[dict]] = defaultdict(list)
    for name, text in sorted(logs_of(args.source).items()):
        stage = Path(name).stem
        if stage in GPU_STAGES and (found := before_device(text)) is not None:
            by_stage[stage].append(found)
    print("| stage | jobs | start before the device, s (sum) | per job | waited for the turn, s (sum) |")
    print("|---|---|---|---|---|")
    total = waited = 0.0
    for stage in GPU_STAGES:
        jobs = by_stage.get(stage, [])
        if not jobs:
            continue
        start = sum(job["start_s"] for job in jobs)
        waits = [job["wait_s"] for job in jobs if job["wait_s"] is not None]
        total += start
        waited += sum(waits)
        print(f"| {stage} | {len(jobs)} | {start:.1f} | {start / len(jobs):.1f} | "
              f"{f'{sum(waits):.1f}' if waits else 'no turns'} |")
    print(f"| all | {sum(map(len, by_stage.values()))} | {total:.1f} | | {waited:.1f} |")


if __name__ == "__main__":
    main()
