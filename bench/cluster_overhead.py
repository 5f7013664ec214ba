"""What a Slurm job costs the tiny Table 1: sbatch submissions and wall time through
profiles/slurm with its per-cell groups and without them, against the same DAG run
locally one job at a time (the stages' own time). Overhead = Slurm wall - local wall.

Needs a running Slurm whose partition and account match the profile's defaults (or give
them), e.g. the one `make test-cluster` starts (tests/cluster/daemons.sh start STATE PY):

    python bench/cluster_overhead.py --partition debug --account darel
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
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.conftest import tiny_project  # noqa: E402

BIN = Path(sys.executable).parent


def _params(params: dict) -> dict:
    quick = params["profiles"]["quick"]
    quick["models"]["resnet18"] = {"width": 4, "epochs": 3, "milestones": [2], "warmup_epochs": 1}
    quick["table1"] = {"resnet18": [[0.5, 0.55]]}
    params.pop("comparisons", None)
    return params


def _run(project: Path, cmd: list[str]) -> tuple[float, str]:
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "MLFLOW_DISABLE_TELEMETRY": "true"}
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return wall, proc.stdout + proc.stderr


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--partition", default="debug")
    ap.add_argument("--account", default="darel")
    args = ap.parse_args()
    resources = ["--default-resources", f"slurm_partition={args.partition}", f"slurm_account={args.account}",
                 "runtime=30", "mem_mb=1000"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        local = tiny_project(Path(tmp) / "local", _params)
        wall, out = _run(local, [str(BIN / "snakemake"), "--cores", "1", "results/table1.csv"])
        jobs = int(re.search(r"^total\s+(\d+)", out, flags=re.M).group(1))
        rows.append(("local, one job at a time", jobs, 0, wall))
        for name, grouped in (("Slurm, one job per rule", False), ("Slurm, per-cell groups", True)):
            project = tiny_project(Path(tmp) / name.split(",")[1].strip().replace(" ", "_"), _params)
            profile = project / "profiles/bench"
            shutil.copytree(project / "profiles/slurm", profile)
            config = yaml.safe_load((profile / "config.yaml").read_text())
            if not grouped:
                config.pop("groups")
            (profile / "config.yaml").write_text(yaml.safe_dump(config))
            # The target first: --default-resources takes every word after it.
            wall, out = _run(project, [str(BIN / "snakemake"), "results/table1.csv", "--workflow-profile",
                                       "profiles/bench", *resources])
            rows.append((name, jobs, out.count("has been submitted with SLURM jobid"), wall))
    local_wall = rows[0][3]
    print(f"{'run':28s} {'jobs':>5s} {'sbatch':>7s} {'wall s':>8s} {'overhead s':>11s}")
    for name, jobs, submissions, wall in rows:
        overhead = "" if not submissions else f"{wall - local_wall:11.0f}"
        print(f"{name:28s} {jobs:5d} {submissions:7d} {wall:8.0f} {overhead}")


if __name__ == "__main__":
    main()
