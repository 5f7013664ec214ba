"""The tiny Table 1 through the Slurm profile on a one-node Slurm with accounting, tracked on
`mlflow server` over PostgreSQL (tests/cluster/run.sh starts them), with a lab's cluster
profile beside the workflow profile as the README says. In order: the build, what sacct
and the server say about it, a store switch (and a killed submitter's job, recorded as
from another host, cancelled by a run with nothing to do), a training cancelled by hand
that resumes, a preemption notice mid-epoch that requeues and resumes to the same weights,
the submitter stopped with SIGTERM, GPU jobs on the node's two GPUs, and the store check
through socket files."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from darel import faultlab, tracking
from tests.conftest import ROOT, tiny_project

BIN = Path(sys.executable).parent
URI = os.environ.get("DAREL_MLFLOW_URI", "")
PG_URI = os.environ.get("DAREL_PG_URI", "")
STATE = Path(os.environ.get("DAREL_CLUSTER_STATE", "/nonexistent"))
CELL = "t0.50_m0.55"
EPOCHS = 8
TIMED = {"pretrain_scorer", "calibrate", "train_online"}
# The lab's profile: the README's example with this node's partition, account, small limits,
# its node feature and a short preemption grace.
LAB = {"slurm_partition": "debug", "slurm_account": "darel", "runtime": 30, "mem_mb": 1000, "constraint": "darel",
       "slurm_extra": "--signal=URG@60 --open-mode=append"}


def _lab_profile() -> Path:
    folder = STATE / "lab-profile"
    if not folder.is_dir():
        folder.mkdir(parents=True)
        example = yaml.safe_load((ROOT / "profiles/slurm-lab-example/config.yaml").read_text())
        assert set(example["default-resources"]) == set(LAB)  # the example names what a lab sets
        example["default-resources"] = LAB
        (folder / "config.yaml").write_text(yaml.safe_dump(example))
    return folder


def _snakemake() -> list[str]:
    """The profiles as a user runs them, with quick status checks; the status from sacct (what
    reports 'CANCELLED by <uid>' for a job cancelled by hand)."""
    return [str(BIN / "snakemake"), "--profile", str(_lab_profile()), "--workflow-profile", "profiles/slurm",
            "--slurm-init-seconds-before-status-checks", "3", "--seconds-between-status-checks", "3",
            "--slurm-status-command", "sacct"]


def _params(params: dict) -> dict:
    quick = params["profiles"]["quick"]
    quick["models"]["resnet18"] = {"width": 8, "epochs": EPOCHS, "milestones": [5], "warmup_epochs": 1}
    quick["table1"] = {"resnet18": [[0.5, 0.55]]}
    # Epochs long enough (about a second) that a notice sent after a checkpoint lands inside
    # a later epoch, not after the run: the tiny workflow data train an epoch in 0.1 s.
    params["datasets"]["synth"]["sizes"][quick["dataset_size"]] = {
        "num_classes": 10, "n_train": 4000, "n_test": 200, "image_size": 16, "classes_per_group": 2}
    params.pop("comparisons", None)
    params["tracking"]["uri"] = URI
    return params


def _env() -> dict:
    return {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "MLFLOW_DISABLE_TELEMETRY": "true",
            "PYTHONUNBUFFERED": "1"}


def _run(project: Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([*_snakemake(), *args], cwd=project, env=_env(), capture_output=True, text=True,
                          timeout=timeout)


def _submissions(out: str) -> dict[str, set[str]]:
    """Slurm job id -> the rules it ran, from Snakemake's 'submitted ... (log: ...)' lines."""
    found = {}
    for jobid, kind, name in re.findall(r"submitted with SLURM jobid (\d+) \(log: \S*/logs/slurm/(rule|group)_(\w+?)[/)]",
                                        out):
        if kind == "rule":
            found[jobid] = {name}
        else:  # group_<group>_<rule>_<rule>...: the group's rules, sorted by Snakemake
            found[jobid] = {rule for rule in ("materialise_subset", "train_online", "cell_record",
                                              "track_cell") if rule in name}
    return found


def _sacct(jobids) -> dict[str, dict]:
    out = subprocess.run(["sacct", "-X", "-n", "-P", "-j", ",".join(sorted(jobids)), "-o",
                          "JobIDRaw,State,Start,End,AllocCPUS,AllocTRES,Constraints"], capture_output=True, text=True,
                         check=True).stdout
    rows = {}
    for line in out.splitlines():
        jobid, state, start, end, cpus, tres, constraint = line.split("|")
        gpus = re.search(r"gres/gpu=(\d+)", tres)
        rows[jobid] = {"state": state, "start": start, "end": end, "cpus": int(cpus),
                       "gpus": int(gpus.group(1)) if gpus else 0, "constraint": constraint}
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
    # Per cell: its calibration is a job, its subset and its training (which evaluates its model)
    # one group job; the records only read and write files: they run on the submitting node
    # (local rules), and the MLflow record, on a server store here, is a CPU job of its own once the GPU is given back.
    assert any(rules >= {"materialise_subset", "train_online"} for rules in jobs.values())
    assert not any(rules & {"download", "cell_record", "table1"} for rules in jobs.values()), jobs
    assert {"track_cell"} in jobs.values() and not any(len(rules) > 1 and "track_cell" in rules
                                                       for rules in jobs.values())
    assert (project / "results/table1.csv").is_file()


def test_timed_jobs_ask_for_their_threads_and_their_node_type_never_a_whole_node(built):
    project, out = built
    jobs = _submissions(out)
    rows = _sacct(jobs)
    timed = [j for j, rules in jobs.items() if rules & TIMED]
    assert len(timed) >= 3
    threads = yaml.safe_load((project / "params.yaml").read_text())["profiles"]["quick"]["threads"]
    for t in timed:
        assert rows[t]["cpus"] == threads < 4 and rows[t]["constraint"] == "darel", (t, rows[t])


@pytest.mark.parametrize("setting, value, named, said", [
    ("slurm_account", "my-lab", "account 'my-lab'", "Invalid account or account/partition combination specified"),
    ("slurm_partition", "nope", "partition 'nope'", "invalid partition specified: nope"),
    ("mem_mb", 100_000_000, "memory '100000000'", "Requested node configuration is not available"),
])
def test_a_setting_slurm_refuses_stops_the_run_in_one_line_before_any_submission(tmp_path, setting, value, named,
                                                                                  said):
    profile = tmp_path / "wrong-profile"
    profile.mkdir()
    config = yaml.safe_load((_lab_profile() / "config.yaml").read_text())
    config["default-resources"][setting] = value
    (profile / "config.yaml").write_text(yaml.safe_dump(config))
    project = tiny_project(tmp_path / "project", _params)
    command = _snakemake()
    command[command.index("--profile") + 1] = str(profile)
    proc = subprocess.run([*command, "results/table1.csv"], cwd=project, env=_env(), capture_output=True, text=True,
                          timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "has been submitted with SLURM jobid" not in out, out[-3000:]
    refusal = [line for line in out.splitlines() if line.startswith("Slurm refuses")]
    assert len(refusal) == 1 and f"jobs' {named}: " in refusal[0] and said in refusal[0], out[-3000:]


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


def test_a_killed_submitter_of_another_host_has_its_jobs_cancelled_when_nothing_is_left_to_do(built):
    project, _ = built
    # A job of this folder (-D, as the plugin submits): only those are ever cancelled (darel/slurm.py).
    orphan = subprocess.run(["sbatch", "--parsable", "-A", "darel", "-p", "debug", "--mem=50", "-o", "/dev/null",
                             "-D", str(project), "--wrap", "sleep 600"], capture_output=True, text=True,
                            check=True).stdout.strip()
    records = project / ".snakemake/darel-slurm-jobs.tsv"
    records.write_text(f"{orphan}\t{os.getpid()}\tlogin-node-2\t0b0e1d2c:123\n")  # as a login node elsewhere wrote it
    try:
        proc = _run(project, "results/table1.csv", timeout=300)  # not a dry run, nothing to do: onstart never runs
        assert proc.returncode == 0 and "Nothing to be done" in proc.stdout + proc.stderr, proc.stderr[-2000:]
        assert f"cancelled 1 Slurm job(s) left by a Snakemake that was killed: {orphan}" in proc.stderr
        assert _sacct([orphan])[orphan]["state"].startswith("CANCELLED")
        assert not records.read_text().strip()
    finally:
        subprocess.run(["scancel", orphan], check=False)


def _start(project: Path, *args: str) -> subprocess.Popen:
    log = open(project / "resume.log", "w")
    return subprocess.Popen([*_snakemake(), *args], cwd=project, env=_env(), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def _running_jobs() -> list[str]:
    out = subprocess.run(["squeue", "-h", "-t", "RUNNING", "-o", "%i"], capture_output=True, text=True).stdout
    return out.split()


def _weights(run_dir: Path) -> str:
    return json.loads((run_dir / "train.json").read_text())["model_sha256"]


def _wait_for_checkpoint(proc: subprocess.Popen, project: Path, ckpt: Path, epoch: int) -> None:
    deadline = time.time() + 600
    while (faultlab.checkpoint_epoch(ckpt) or 0) < epoch:
        assert proc.poll() is None, (project / "resume.log").read_text()[-3000:]
        assert time.time() < deadline, f"no checkpoint of epoch {epoch} within 600 s"
        time.sleep(0.1)


def test_a_training_cancelled_with_scancel_ends_the_run(built):
    """The next test resumes this training (one rerun serves both)."""
    project, _ = built
    run_dir = project / f"runs/quick/table1/resnet18/s0/{CELL}"
    calibration = (run_dir / "calibration.json").read_bytes()
    built_weights[CELL] = _weights(run_dir)
    proc = _start(project, "results/table1.csv", "--forcerun", "train_online")
    try:
        _wait_for_checkpoint(proc, project, run_dir / "ckpt.pt", 1)
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
    # The calibration was its own job: it survives; the training's checkpoint too.
    assert (run_dir / "calibration.json").read_bytes() == calibration
    assert (faultlab.checkpoint_epoch(run_dir / "ckpt.pt") or 0) >= 1


built_weights: dict[str, str] = {}


def test_the_rerun_resumes_and_a_preemption_notice_mid_epoch_requeues_it_to_the_same_weights(built):
    """The rerun resumes the cancelled training from its checkpoint; a notice mid-epoch
    (what --signal=URG@<grace> sends) makes it checkpoint, requeue itself and resume again;
    the weights equal the uninterrupted build's."""
    project, _ = built
    run_dir = project / f"runs/quick/table1/resnet18/s0/{CELL}"
    start = faultlab.checkpoint_epoch(run_dir / "ckpt.pt") or 0
    proc = _start(project, "results/table1.csv")
    try:
        _wait_for_checkpoint(proc, project, run_dir / "ckpt.pt", start + 1)
        time.sleep(0.3)  # inside the next epoch
        jobs = _running_jobs()
        assert len(jobs) == 1
        subprocess.run(["scancel", "--signal=URG", jobs[0]], check=True)
        proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(timeout=120)
    log = (project / "resume.log").read_text()
    assert proc.returncode == 0, log[-3000:]
    assert len(re.findall(rf"Slurm job {jobs[0]} \(group cell\S*\) was requeued \(run 2", log)) == 1, log[-3000:]
    # The job's Slurm log keeps both runs (--open-mode=append): the resumption after the
    # cancel, the notice, then the resumption after the requeue.
    slurm_log = next((project / "logs/slurm").glob(f"group_cell_*/**/{jobs[0]}.log")).read_text()
    said = re.findall(r"preemption notice \(SIGURG\): checkpoint \S+ written after (\d+) epochs, [\d.]+ s after the "
                      r"notice \(the longest epoch took [\d.]+ s.*; Slurm job \d+ requeued", slurm_log)
    resumed = faultlab.resumed_from(run_dir / "train.json")
    assert said and start < resumed == int(said[0]) < EPOCHS, (start, said, resumed, slurm_log[-3000:])
    assert _weights(run_dir) == built_weights[CELL]
    assert _sacct(jobs)[jobs[0]]["state"] == "COMPLETED"
    # Each run's training log is kept: the one that took the notice beside the resumed one,
    # whose first line names its attempt.
    log_dir = project / f"logs/quick/table1/resnet18/s0/{CELL}"
    assert "preemption notice (SIGURG): checkpoint" in (log_dir / "train.attempt1.log").read_text()
    assert (log_dir / "train.log").read_text().splitlines()[0] == (
        f"===== attempt 2 of Slurm job {jobs[0]} (requeued 1 time); the earlier attempts' logs: train.attempt1.log =====")


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


def test_a_job_requeued_as_often_as_allowed_fails_on_the_next_notice_in_one_line(built):
    """DAREL_MAX_REQUEUES=0 (in the submitter's environment; sbatch --export=ALL hands it to
    the job): a notice sent once the training's step runs does not requeue the job, which
    fails, the reason in one line of the training's log."""
    project, _ = built
    log_dir = project / f"logs/quick/table1/resnet18/s0/{CELL}"
    (log_dir / "train.log").unlink()  # the last run's: its absence is how the new one is told apart
    out = open(project / "capped.log", "w")
    proc = subprocess.Popen([*_snakemake(), "results/table1.csv", "--forcerun", "train_online"], cwd=project,
                            env={**_env(), "DAREL_MAX_REQUEUES": "0"}, stdout=out, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        deadline = time.time() + 300
        # The training's step runs (srun inside the group job) and its stage has written its
        # new log, after taking notices. (A notice sent while the step's own Snakemake starts,
        # before the stage's process exists, reaches no training: docs/cluster.md.)
        while True:
            steps = subprocess.run(["squeue", "-h", "-s", "-o", "%i"], capture_output=True, text=True).stdout.split()
            if any(re.fullmatch(r"\d+\.\d+", step) for step in steps) and (log_dir / "train.log").exists():
                break
            assert proc.poll() is None, (project / "capped.log").read_text()[-3000:]
            assert time.time() < deadline
            time.sleep(0.2)
        jobs = _running_jobs()
        assert len(jobs) == 1
        subprocess.run(["scancel", "--signal=URG", jobs[0]], check=True)
        proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(timeout=120)
    assert proc.returncode != 0
    said = [line for line in (log_dir / "train.log").read_text().splitlines() if "DAREL_MAX_REQUEUES=0" in line]
    assert len(said) == 1 and f"Slurm job {jobs[0]} took a preemption notice after 0 requeues" in said[0], said
    assert "requeued (run 2" not in (project / "capped.log").read_text()


GPU_SNAKEFILE = '''
from darel import launch

rule all:
    input: expand("out/train_{i}.txt", i=(1, 2, 3)), "out/finetune.txt"

rule train_online:  # a one-GPU timed job, as a GPU profile's training asks
    output: "out/train_{i}.txt"
    threads: 1
    resources: timed=1, gpu=1
    shell: "echo $SLURM_JOB_ID $CUDA_VISIBLE_DEVICES > {output}; sleep 2"

rule nlg_finetune:  # the data-parallel fine-tuning: two srun tasks, a GPU and `threads` CPUs each (darel/launch.py)
    input: expand("out/train_{i}.txt", i=(1, 2, 3))  # submitted last: Slurm starts jobs in their order
    output: "out/finetune.txt"
    threads: 1
    resources: timed=1, **launch.slurm_resources(1, 2, gpu=True)
    params: launcher=launch.launch_command("bash", 1, 2, 1, slurm=True)
    shell: "(echo $SLURM_JOB_ID; {params.launcher} -c 'echo $SLURM_PROCID $CUDA_VISIBLE_DEVICES') > {output}"
'''


def test_gpu_jobs_get_gpus_of_their_own_side_by_side_and_the_finetuning_gets_two(tmp_path):
    """Rules that ask what the workflow's GPU rules ask (tests/test_slurm.py checks the rules),
    through both profiles and the plugin, on the node's two GPUs (generic resources)."""
    (tmp_path / "Snakefile").write_text(GPU_SNAKEFILE)
    (tmp_path / "profiles").symlink_to(ROOT / "profiles")
    proc = subprocess.run(_snakemake(), cwd=tmp_path, env={**_env(), "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ran = {}
    for name in ("train_1", "train_2", "train_3"):
        job, gpus = (tmp_path / f"out/{name}.txt").read_text().split()
        ran[name] = {"job": job, "visible": gpus}
    job, *tasks = (tmp_path / "out/finetune.txt").read_text().splitlines()
    ran["finetune"] = {"job": job, "visible": {tuple(task.split()) for task in tasks}}
    rows = _sacct([r["job"] for r in ran.values()])
    train = sorted((rows[ran[f"train_{i}"]["job"]] | ran[f"train_{i}"] for i in (1, 2, 3)), key=lambda r: r["start"])
    assert [r["gpus"] for r in train] == [1, 1, 1] and all(r["cpus"] == 1 for r in train), train
    first, second, third = train
    assert first["start"] < second["end"] and second["start"] < first["end"], train  # side by side
    assert {first["visible"], second["visible"]} == {"0", "1"}, train  # on different GPUs
    assert third["start"] >= min(first["end"], second["end"]), train  # the third waited for a GPU
    finetune = rows[ran["finetune"]["job"]]
    # Each of its two tasks sees both GPUs of the job and takes cuda:<its local rank>.
    assert finetune["gpus"] == 2 and finetune["cpus"] == 2, finetune
    assert ran["finetune"]["visible"] == {("0", "0,1"), ("1", "0,1")}, ran["finetune"]
    assert {r["constraint"] for r in rows.values()} == {"darel"}


def test_the_store_check_reaches_databases_through_their_socket_files():
    """MariaDB as slurmdbd's store runs without networking (a socket only), PostgreSQL
    listens on 127.0.0.1 and a socket folder: MLflow's URIs for both answer."""
    sock = STATE / "mysql/mysql.sock"
    subprocess.run(["mariadb", f"--socket={sock}", "-uroot", "-e",
                    "create database if not exists mlflow; create user if not exists 'mlflow'@'localhost'; "
                    "grant all on mlflow.* to 'mlflow'@'localhost'"], check=True)
    assert tracking.store_answers(f"mysql+pymysql://mlflow@/mlflow?unix_socket={sock}", timeout_s=5) is None
    port = PG_URI.rsplit(":", 1)[1].split("/")[0]
    assert tracking.store_answers(f"postgresql://mlflow@:{port}/mlflow?host={STATE / 'pg'}", timeout_s=5) is None
    wrong = tracking.store_answers(f"mysql+pymysql://mlflow:s3cret@/mlflow?unix_socket={STATE}/none.sock", timeout_s=5)
    assert wrong and "\n" not in wrong and "s3cret" not in wrong and f"socket {STATE}/none.sock" in wrong



FINETUNE_SNAKEFILE = '''
from darel import launch

STAGE = {stage!r}

rule nlg_finetune:  # the workflow's launch of a 2-process fine-tuning under Slurm (darel/launch.py)
    output: directory("out/adapter")
    threads: 1
    resources: timed=1, mem_mb=3000, **launch.slurm_resources(1, 2, gpu=False)
    params: launcher=launch.launch_command({python!r}, 1, 2, 1, slurm=True)
    shell: "echo $SLURM_JOB_ID > out/job.txt; {{params.launcher:q}} " + STAGE
'''


def test_a_two_task_finetuning_started_by_srun_trains_torchruns_adapter(tmp_path):
    """The fine-tuning stage with its two ranks started by srun (two tasks of one step on the
    node), through both profiles and the plugin's mpi route: the adapter of the same run under
    torchrun, byte for byte (a second node would need a second machine)."""
    from tests import test_nlg_distributed as ddp

    inputs = ddp.build_inputs(tmp_path / "ddp")
    project = tmp_path / "project"
    (project / "out").mkdir(parents=True)
    # The stage's words for the shell, its braces escaped for Snakemake's formatting.
    stage = shlex.join(ddp._stage(inputs, project / "out" / "adapter")).replace("{", "{{").replace("}", "}}")
    (project / "Snakefile").write_text(FINETUNE_SNAKEFILE.format(python=sys.executable, stage=stage))
    (project / "profiles").symlink_to(ROOT / "profiles")
    env = {**_env(), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(_snakemake(), cwd=project, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    job = (project / "out/job.txt").read_text().split()[0]
    steps = subprocess.run(["sacct", "-n", "-P", "-j", job, "-o", "JobID,NTasks,State"], capture_output=True,
                           text=True, check=True).stdout.split()
    assert any(row.split("|")[1:] == ["2", "COMPLETED"] for row in steps), steps  # srun's step of two tasks
    train = json.loads((project / "out/adapter/train.json").read_text())
    assert train["processes"] == 2 and (project / "out/adapter.log.rank1").is_file()
    reference = ddp._finetune(inputs, tmp_path / "torchrun", 2)
    assert train["steps"] == reference["steps"]
    adapter = "adapter_model.safetensors"
    assert (project / "out/adapter" / adapter).read_bytes() == (tmp_path / "torchrun" / adapter).read_bytes()


def test_the_workflows_finetuning_of_two_processes_runs_as_two_srun_tasks(tmp_path):
    """The workflow's own rule (quick profile, 2 processes): its Slurm job asks for two tasks
    (the plugin's mpi route), srun starts the two ranks, and they train as one group of two."""
    def two_processes(params: dict) -> dict:
        params["profiles"]["quick"]["nlg"].setdefault("finetune", {})["processes"] = 2
        params["tracking"]["uri"] = URI
        return params

    project = tiny_project(tmp_path / "nlg", two_processes)
    target = "runs/quick/table2/gpt2-small/s0/lora/adapter"
    proc = _run(project, target)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    job = re.search(r"SLURM jobid (\d+) \(log: \S*nlg_finetune", out)
    assert job, out[-3000:]
    steps = subprocess.run(["sacct", "-n", "-P", "-j", job.group(1), "-o", "JobID,NTasks,AllocCPUS,State"],
                           capture_output=True, text=True, check=True).stdout.split()
    assert any(row.split("|")[1] == "2" and row.split("|")[3] == "COMPLETED" for row in steps), steps
    train = json.loads((project / target / "train.json").read_text())
    assert train["processes"] == 2
    assert (project / "logs/quick/table2/gpt2-small/s0/lora/finetune.log.rank1").is_file()
