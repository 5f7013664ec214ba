"""What Slurm adds to a Table 1: sbatch submissions and wall time through the Slurm
profiles, against the same DAG run locally one job at a time (the stages' own time).
Overhead = Slurm wall - local wall. All variants run in one invocation, one after the
other, on the same code and machine:

* ``before``: the Slurm profile of the previous release (every timed job and its group
  with ``--exclusive``, the plugin's status polling: first check 40 s after a submission);
* ``after``: profiles/slurm with a lab profile made from profiles/slurm-lab-example (no
  ``--exclusive``, first status check after 10 s).

Besides the wall, from sacct: the mean time from a job's start to its step's start (the
job's own Snakemake starting, before it runs the step's Snakemake, which starts again),
and the time from the last job's end to the submitter's exit.

Needs a running Slurm whose partition and account match (or give them), e.g. the one
`make test-cluster` starts (tests/cluster/daemons.sh start STATE PY):

    python bench/cluster_overhead.py --table tiny --partition debug --account darel --constraint darel
    python bench/cluster_overhead.py --table smoke ...   # .test/params.yaml's Table 1
    python bench/cluster_overhead.py --table quick ...   # the quick profile's Table 1 (35 submissions)
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.conftest import one_budget_table1, tiny_project  # noqa: E402

BIN = Path(sys.executable).parent
# The timed rules and the rules grouped with them: the previous release's --exclusive list.
BEFORE_EXCLUSIVE = ("pretrain_scorer", "calibrate", "materialise_subset", "train_online", "evaluate", "carbon_report",
                    "track_cell", "study_train", "study_evaluate", "study_report", "study_track", "nlg_finetune",
                    "nlg_evaluate", "nlg_report", "nlg_track")


def _tiny(params: dict) -> dict:
    return one_budget_table1(params, epochs=3)


TABLES = {  # name -> (edit of params.yaml, extra snakemake arguments)
    "tiny": (_tiny, []),
    "smoke": (lambda params: params, ["--config", "params_file=.test/params.yaml"]),
    "quick": (lambda params: params, []),
}


def _run(project: Path, cmd: list[str]) -> tuple[float, str, float]:
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "MLFLOW_DISABLE_TELEMETRY": "true"}
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return wall, proc.stdout + proc.stderr, time.time()


def _sacct_times(jobids: list[str]) -> dict[str, dict[str, datetime]]:
    """Per job: its start and end, and its first step's start (step 0: the step's Snakemake)."""
    out = subprocess.run(["sacct", "-n", "-P", "-j", ",".join(jobids), "-o", "JobID,Start,End"], capture_output=True,
                         text=True, check=True).stdout
    found: dict[str, dict[str, datetime]] = {}
    for line in out.splitlines():
        jobid, start, end = line.split("|")
        if "Unknown" in (start, end):
            continue
        main, _, step = jobid.partition(".")
        entry = found.setdefault(main, {})
        if not step:
            entry["start"], entry["end"] = datetime.fromisoformat(start), datetime.fromisoformat(end)
        elif step == "0":
            entry["step"] = datetime.fromisoformat(start)
    return found


def _profiles(project: Path, variant: str, lab: dict) -> list[str]:
    """The profile arguments of a variant, written into the project."""
    if variant == "after":
        folder = project / "profiles/bench-lab"
        folder.mkdir(parents=True)
        example = yaml.safe_load((project / "profiles/slurm-lab-example/config.yaml").read_text())
        example["default-resources"].update(lab)
        (folder / "config.yaml").write_text(yaml.safe_dump(example))
        return ["--profile", "profiles/bench-lab", "--workflow-profile", "profiles/slurm"]
    folder = project / "profiles/bench-before"
    folder.mkdir(parents=True)
    config = yaml.safe_load((project / "profiles/slurm/config.yaml").read_text())
    config.pop("slurm-init-seconds-before-status-checks", None)  # the plugin's 40 s
    config["default-resources"] = {k: v for k, v in lab.items() if k != "slurm_extra"}
    config["set-resources"] = {rule: {"slurm_extra": "--exclusive"} for rule in BEFORE_EXCLUSIVE}
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    return ["--workflow-profile", "profiles/bench-before"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--table", choices=sorted(TABLES), default="tiny")
    ap.add_argument("--variants", default="before,after", help="comma-separated: before, after")
    ap.add_argument("--partition", default="debug")
    ap.add_argument("--account", default="darel")
    ap.add_argument("--constraint", default="", help="node feature of the timed jobs ('' = any node)")
    args = ap.parse_args()
    edit, extra = TABLES[args.table]
    lab = {"slurm_partition": args.partition, "slurm_account": args.account, "runtime": 60, "mem_mb": 1000,
           "constraint": args.constraint, "slurm_extra": "--signal=URG@60 --open-mode=append"}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        local = tiny_project(Path(tmp) / "local", edit)
        wall, out, _ = _run(local, [str(BIN / "snakemake"), "--cores", "1", "results/table1.csv", *extra])
        jobs = int(re.search(r"^total\s+(\d+)", out, flags=re.M).group(1))
        rows.append(("local, one job at a time", jobs, 0, wall, None, None))
        for variant in args.variants.split(","):
            project = tiny_project(Path(tmp) / variant, edit)
            # The target first: --config takes every word after it.
            wall, out, ended = _run(project, [str(BIN / "snakemake"), "results/table1.csv",
                                              *_profiles(project, variant, lab), *extra])
            ids = re.findall(r"submitted with SLURM jobid (\d+)", out)
            times = _sacct_times(ids)
            starts = [(t["step"] - t["start"]).total_seconds() for t in times.values() if "step" in t]
            last_end = max(t["end"] for t in times.values()).timestamp()
            rows.append((f"Slurm, {variant}", jobs, len(ids), wall, sum(starts) / len(starts), ended - last_end))
            shutil.rmtree(project / ".snakemake", ignore_errors=True)
    local_wall = rows[0][3]
    print(f"table: {args.table}")
    print(f"{'run':26s} {'jobs':>5s} {'sbatch':>7s} {'wall s':>8s} {'overhead s':>11s} {'job->step s':>12s} "
          f"{'last job->exit s':>17s}")
    for name, jobs, submissions, wall, step, tail in rows:
        overhead = f"{wall - local_wall:11.0f}" if submissions else " " * 11
        step = f"{step:12.1f}" if step is not None else " " * 12
        tail = f"{tail:17.1f}" if tail is not None else ""
        print(f"{name:26s} {jobs:5d} {submissions:7d} {wall:8.0f} {overhead} {step} {tail}")


if __name__ == "__main__":
    main()
