"""Jobs and seconds of a Table 1 build at two commits, side by side (issue 52 item 3).

    python bench/lean_jobs.py --before 0e2850f --after HEAD --params .test/params.yaml --out lean.json
    python bench/lean_jobs.py --logs .snakemake/log/<build>.snakemake.log     # one build's table only

Each commit is checked out into its own folder (``git worktree``, as bench/same_results.py
does) and builds results/table1.csv from nothing with this virtual environment; then, from
each build's Snakemake log, every rule's job count and the seconds its jobs ran (start to
finish, as Snakemake stamps them: whole seconds), the build's wall-clock time, and how many
trainings started a live MLflow run (their logs' "MLflow run ... stream in" line). The two
builds run one after the other on the same machine: the seconds are as comparable as the
machine's load lets them be (the load average is printed beside each build).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from same_results import BIN, ROOT, _checkout, _run

STAMP = re.compile(r"^\[(\w{3} \w{3} +\d+ [\d:]+ \d{4})\]$")
RULE = re.compile(r"^(?:local)?rule (\w+):$")
JOBID = re.compile(r"^\s+jobid: (\d+)$")
DONE = re.compile(r"^Finished jobid: (\d+)")
LIVE = "per-epoch metrics stream in"


def job_seconds(log_text: str) -> dict[str, list[float]]:
    """rule -> the seconds each of its finished jobs ran, from a Snakemake log."""
    now, rule, started, rule_of = None, None, {}, {}
    seconds: dict[str, list[float]] = defaultdict(list)
    for line in log_text.splitlines():
        if m := STAMP.match(line):
            now = datetime.datetime.strptime(m.group(1), "%a %b %d %H:%M:%S %Y")
        elif m := RULE.match(line):
            rule = m.group(1)
        elif (m := JOBID.match(line)) and rule is not None:
            started[m.group(1)], rule_of[m.group(1)], rule = now, rule, None
        elif (m := DONE.match(line)) and m.group(1) in started:
            seconds[rule_of[m.group(1)]].append((now - started[m.group(1)]).total_seconds())
    return dict(seconds)


def summary(seconds: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    return {rule: {"jobs": len(values), "seconds": sum(values)} for rule, values in sorted(seconds.items())}


def _build(commit: str, folder: Path, params: Path | None, cores: str) -> dict:
    env = _checkout(commit, folder, params)
    load = os.getloadavg()[0]
    began = time.perf_counter()
    _run([str(BIN / "snakemake"), "--cores", cores, "results/table1.csv"], folder, env)
    wall = time.perf_counter() - began
    (log,) = sorted((folder / ".snakemake/log").glob("*.snakemake.log"))
    trainings = [p for name in ("pretrain.log", "train.log") for p in folder.glob(f"logs/*/table1/**/{name}")]
    live = sum(LIVE in p.read_text() for p in trainings)
    return {"commit": commit, "wall_s": round(wall, 1), "load_at_start": round(load, 2),
            "rules": summary(job_seconds(log.read_text())), "trainings": len(trainings), "live_runs": live}


def print_table(builds: list[dict]) -> None:
    rules = sorted({rule for build in builds for rule in build["rules"]})
    head = "".join(f" | {b['commit'][:10]:>10} jobs | seconds" for b in builds)
    print(f"{'rule':<20}{head}")
    for rule in rules:
        cells = "".join(f" | {b['rules'].get(rule, {}).get('jobs', 0):>15} | {b['rules'].get(rule, {}).get('seconds', 0):>7.0f}"
                        for b in builds)
        print(f"{rule:<20}{cells}")
    totals = "".join(f" | {sum(r['jobs'] for r in b['rules'].values()):>15} | "
                     f"{sum(r['seconds'] for r in b['rules'].values()):>7.0f}" for b in builds)
    print(f"{'all jobs':<20}{totals}")
    for b in builds:
        if "wall_s" in b:
            print(f"{b['commit']}: {b['wall_s']} s wall, load {b['load_at_start']} at its start, "
                  f"{b['live_runs']} of {b['trainings']} trainings with a live MLflow run")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before")
    ap.add_argument("--after", default="HEAD")
    ap.add_argument("--params", type=Path, help="a parameter file to build both commits with")
    ap.add_argument("--cores", default="2")
    ap.add_argument("--logs", nargs="*", type=Path, help="only tabulate these Snakemake logs")
    ap.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = ap.parse_args()
    if args.logs:
        builds = [{"commit": path.name, "rules": summary(job_seconds(path.read_text()))} for path in args.logs]
    else:
        if not args.before:
            ap.error("--before (or --logs) is needed")
        work = Path(tempfile.mkdtemp(prefix="lean-jobs-"))
        builds = []
        try:
            for name, commit in (("before", args.before), ("after", args.after)):
                sha = subprocess.run(["git", "rev-parse", commit], cwd=ROOT, capture_output=True, text=True,
                                     check=True).stdout.strip()
                print(f"building results/table1.csv at {sha[:10]} ...", flush=True)
                builds.append(_build(sha, work / name, args.params, args.cores))
        finally:
            for name in ("before", "after"):
                subprocess.run(["git", "worktree", "remove", "--force", str(work / name)], cwd=ROOT,
                               capture_output=True)
            shutil.rmtree(work, ignore_errors=True)
    print_table(builds)
    if args.out:
        args.out.write_text(json.dumps(builds, indent=2) + "\n")


if __name__ == "__main__":
    main()
