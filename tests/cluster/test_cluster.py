"""The tiny Table 1 through the Slurm profile on a one-node Slurm with accounting, tracked on
`mlflow server` over PostgreSQL (tests/cluster/run.sh starts them). In order: the build,
what sacct and the server say about it, a store switch, a training cancelled by hand that
resumes, and the submitter stopped with SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from darel import faultlab
from tests.conftest import tiny_project

BIN = Path(sys.executable).parent
URI = os.environ.get("DAREL_MLFLOW_URI", "")
PG_URI = os.environ.get("DAREL_PG_URI", "")
CELL = "t0.50_m0.55"
EPOCHS = 10
TIMED = {"pretrain_scorer", "calibrate", "train_online"}
# The profile as a user runs it, with this node's small limits and quick status checks; the
# status from sacct (what reports 'CANCELLED by <uid>' for a job cancelled by hand).
SNAKEMAKE = [str(BIN / "snakemake"), "--workflow-profile", "profiles/slurm",
             "--default-resources", "slurm_partition=debug", "slurm_account=darel", "runtime=30", "mem_mb=1000",
             "--slurm-init-seconds-before-status-checks", "3", "--seconds-between-status-checks", "3",
             "--slurm-status-command", "sacct"]


def _params(params: dict) -> dict:
    quick = params["profiles"]["quick"]
    quick["models"]["resnet18"] = {"width": 8, "epochs": EPOCHS, "milestones": [6], "warmup_epochs": 1}
    quick["table1"] = {"resnet18": [[0.5, 0.55]]}
    params.pop("comparisons", None)
    params["tracking"]["uri"] = URI
    return params


def _env() -> dict:
    return {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "MLFLOW_DISABLE_TELEMETRY": "true",
            "PYTHONUNBUFFERED": "1"}


def _run(project: Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([*SNAKEMAKE, *args], cwd=project, env=_env(), capture_output=True, text=True,
                          timeout=timeout)


def _submissions(out: str) -> dict[str, set[str]]:
    """Slurm job id -> the rules it ran, from Snakemake's 'submitted ... (log: ...)' lines."""
    found = {}
    for jobid, kind, name in re.findall(r"submitted with SLURM jobid (\d+) \(log: \S*/logs/slurm/(rule|group)_(\w+?)[/)]",
                                        out):
        if kind == "rule":
            found[jobid] = {name}
        else:  # group_<group>_<rule>_<rule>...: the group's rules, sorted by Snakemake
            found[jobid] = {rule for rule in ("materialise_subset", "train_online", "evaluate", "cell_record",
                                              "track_cell") if rule in name}
    return found


def _sacct(jobids) -> dict[str, dict]:
    out = subprocess.run(["sacct", "-X", "-n", "-P", "-j", ",".join(sorted(jobids)), "-o",
                          "JobIDRaw,State,Start,End,AllocCPUS"], capture_output=True, text=True, check=True).stdout
    rows = {}
    for line in out.splitlines():
        jobid, state, start, end, cpus = line.split("|")
        rows[jobid] = {"state": state, "start": start, "end": end, "cpus": int(cpus)}
    return rows


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    project = tiny_project(tmp_path_factory.mktemp("cluster"), _params)
    started = time.time()
    proc = _run(project, "results/table1.csv")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    out = proc.stdout + proc.stderr
    (project / "build.log").write_text(out)
    print(f"tiny Table 1 on Slurm: {len(_submissions(out))} sbatch submissions, {time.time() - started:.0f} s wall",
          file=sys.stderr)
    return project, out


def test_every_snakemake_job_is_one_completed_slurm_job(built):
    project, out = built
    jobs = _submissions(out)
    assert len(jobs) == out.count("has been submitted with SLURM jobid") >= 5
    rows = _sacct(jobs)
    assert set(rows) == set(jobs)
    assert {row["state"] for row in rows.values()} == {"COMPLETED"}, rows
    # Per cell: its calibration is a job, its training through its MLflow record one group job.
    assert any(rules >= {"train_online", "evaluate", "cell_record", "track_cell"} for rules in jobs.values())
    assert (project / "results/table1.csv").is_file()


def test_timed_jobs_never_overlap_and_hold_the_node(built):
    _, out = built
    jobs = _submissions(out)
    rows = _sacct(jobs)
    timed = [j for j, rules in jobs.items() if rules & TIMED]
    assert len(timed) >= 3
    for t in timed:
        assert rows[t]["cpus"] == os.cpu_count(), (t, rows[t])  # --exclusive: every CPU of the node
        for other in jobs:
            if other != t:
                a, b = rows[t], rows[other]
                assert a["end"] <= b["start"] or b["end"] <= a["start"], (t, a, other, b)


def test_every_cell_is_a_finished_server_run_with_its_epochs_and_no_local_store(built):
    from mlflow.tracking import MlflowClient

    project, _ = built
    client = MlflowClient(tracking_uri=URI)
    experiment = client.get_experiment_by_name("table1")
    runs = client.search_runs([experiment.experiment_id], "tags.scope = 'table'")
    by_key = {run.data.tags.get("cell_key"): run for run in runs}
    for cell in ("baseline", CELL):
        run = by_key[f"quick/resnet18/s0/{cell}"]
        assert run.info.status == "FINISHED"
        history = client.get_metric_history(run.info.run_id, "train_loss")
        assert len({m.step for m in history}) >= 2, cell
    assert not (project / "mlflow.db").exists() and not (project / "mlflow.db.lock").exists()


def test_switching_the_store_plans_no_training(built):
    project, _ = built
    params = project / "params.yaml"
    original = params.read_text()
    try:
        for uri in (PG_URI, "sqlite:///mlflow.db"):
            params.write_text(original.replace(f"uri: {URI}", f"uri: {uri}"))
            proc = _run(project, "-n", "results/table1.csv", timeout=300)
            assert proc.returncode == 0, proc.stderr[-3000:]
            planned = set(re.findall(r"^(?:local)?rule (\w+):", proc.stdout + proc.stderr, flags=re.M))
            assert planned and planned <= {"track_cell", "table1"}, (uri, planned)
    finally:
        params.write_text(original)
    assert "Nothing to be done" in (_run(project, "-n", "results/table1.csv", timeout=300).stdout)


def _start(project: Path, *args: str) -> subprocess.Popen:
    log = open(project / "resume.log", "w")
    return subprocess.Popen([*SNAKEMAKE, *args], cwd=project, env=_env(), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def _running_jobs() -> list[str]:
    out = subprocess.run(["squeue", "-h", "-t", "RUNNING", "-o", "%i"], capture_output=True, text=True).stdout
    return out.split()


def test_a_training_cancelled_with_scancel_ends_the_run_and_resumes_from_its_checkpoint(built):
    project, _ = built
    run_dir = project / f"runs/quick/table1/resnet18/s0/{CELL}"
    calibration = (run_dir / "calibration.json").read_bytes()
    proc = _start(project, "results/table1.csv", "--forcerun", "train_online")
    try:
        deadline = time.time() + 600
        while (faultlab.checkpoint_epoch(run_dir / "ckpt.pt") or 0) < 1:
            assert proc.poll() is None, (project / "resume.log").read_text()[-3000:]
            assert time.time() < deadline, "no checkpoint within 600 s"
            time.sleep(0.1)
        jobs = _running_jobs()
        assert len(jobs) == 1
        subprocess.run(["scancel", jobs[0]], check=True)
        proc.wait(timeout=180)  # the plugin alone would wait forever on 'CANCELLED by 0'
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(timeout=120)
    log = (project / "resume.log").read_text()
    assert proc.returncode != 0 and "CANCELLED" in log, log[-3000:]
    assert _sacct(jobs)[jobs[0]]["state"].startswith("CANCELLED")
    # The calibration was its own job: it survives, and the rerun resumes the training.
    assert (run_dir / "calibration.json").read_bytes() == calibration
    again = _run(project, "results/table1.csv")
    assert again.returncode == 0, again.stderr[-3000:]
    assert (faultlab.resumed_from(run_dir / "train.json") or 0) >= 1


def test_sigterm_to_the_submitter_cancels_its_jobs_and_frees_the_folder(built):
    project, _ = built
    proc = _start(project, "results/table1.csv", "--forcerun", "train_online")
    try:
        deadline = time.time() + 300
        while not _running_jobs():
            assert proc.poll() is None, (project / "resume.log").read_text()[-3000:]
            assert time.time() < deadline
            time.sleep(0.5)
        jobs = _running_jobs()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    time.sleep(3)
    assert not _running_jobs()
    assert all(row["state"].startswith("CANCELLED") for row in _sacct(jobs).values()), _sacct(jobs)
    assert not list((project / ".snakemake/locks").glob("*.lock")) if (project / ".snakemake/locks").is_dir() else True
    # The records of its jobs are gone with it: nothing for the next start to cancel.
    records = project / ".snakemake/darel-slurm-jobs.tsv"
    assert not records.exists() or not records.read_text().strip()
