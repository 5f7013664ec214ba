"""The cluster pieces that need no cluster: the Slurm profile against the workflow's rules,
the plugin's status fix, the submitter's job records, the writers' locks, the stores the
workflow accepts. The real one-node Slurm run is tests/cluster (`make test-cluster`)."""

from __future__ import annotations

import asyncio
import inspect
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from darel import grammar, launch, slurm, tracking
from darel.stagekit import watchdog
from tests.conftest import ROOT

PROFILE = ROOT / "profiles/slurm/config.yaml"


def _rule_names() -> set[str]:
    text = "".join(p.read_text() for p in (ROOT / "workflow/rules").glob("*.smk")) + (ROOT / "Snakefile").read_text()
    return set(re.findall(r"^(?:rule|use rule \w+ as) (\w+)", text, flags=re.M))


LAB = ROOT / "profiles/slurm-lab-example/config.yaml"


def test_slurm_profile_names_only_rules_that_exist_and_leaves_the_cluster_to_the_lab():
    profile = yaml.safe_load(PROFILE.read_text())
    rules = _rule_names()
    assert {"pretrain_scorer", "train_online", "nlg_track", "study_train"} <= rules
    unknown = set(profile["groups"]) - rules
    assert not unknown, f"groups names rules the workflow does not have: {unknown}"
    assert profile["executor"] == "slurm"
    # No local limits: on a cluster each job's own cores and GPUs keep a timing apart.
    assert "resources" not in profile and "cores" not in profile
    # The workflow profile overrides a user's profile key by key: the cluster's keys stay out.
    assert not {"default-resources", "set-resources", "slurm-qos", "slurm-reservation"} & set(profile)
    lab = yaml.safe_load(LAB.read_text())["default-resources"]
    assert {"slurm_partition", "slurm_account", "runtime", "mem_mb", "constraint"} <= set(lab)
    assert re.fullmatch(r"--signal=URG@\d+ --open-mode=append", lab["slurm_extra"])
    assert "gpu_model" not in lab


def test_no_job_holds_a_whole_node_and_gpus_come_per_process():
    text = "".join(p.read_text() for p in (ROOT / "workflow/rules").glob("*.smk"))
    profiles = PROFILE.read_text() + LAB.read_text()
    assert "--exclusive" not in profiles.split("#")[0] and "exclusive" not in yaml.safe_dump(yaml.safe_load(
        PROFILE.read_text()))
    # PLANNED_JOB: a planned training's slot, TIMED_JOB's on a cluster (workflow/rules/common.smk)
    timed = set(re.findall(r"^rule (\w+):(?:(?!^rule ).)*?timed=(?:TIMED_JOB|PLANNED_JOB)", text, flags=re.M | re.S))
    assert {"pretrain_scorer", "calibrate", "train_online", "study_train", "nlg_finetune"} <= timed
    for rule in timed:
        body = text.split(f"rule {rule}:\n", 1)[1].split("\nrule ", 1)[0]
        assert re.search(r"gpu=GPU_JOB|\*\*FINETUNE_RESOURCES", body), rule
    # The fine-tuning's GPUs and tasks: one GPU per process (darel/launch.py, tests/test_launch.py),
    # each process a Slurm task of the profile's threads.
    finetune = text.split("rule nlg_finetune:\n", 1)[1].split("\nrule ", 1)[0]
    assert "threads: TIMED_THREADS\n" in finetune and "**FINETUNE_RESOURCES" in finetune


class _Resources(dict):
    def __getattr__(self, name):
        return self[name]


class _Job:
    def __init__(self, threads, name="train_online", **resources):
        self.threads, self.name = threads, name
        self.resources = _Resources(resources)
        self.rule = type("Rule", (), {"name": name})()

    def is_group(self):
        return False


def test_the_plugin_asks_slurm_for_exactly_the_gpus_cpus_and_node_type():
    plugin = pytest.importorskip("snakemake_executor_plugin_slurm")
    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string

    params = {"run_uuid": "u", "slurm_logfile": "l", "comment_str": "c", "account": "-A lab", "partition": "-p gpu",
              "workdir": "/w"}
    lab = {"runtime": 720, "mem_mb": 32000, "constraint": "h100", "slurm_extra": "--signal=URG@600 --open-mode=append"}
    job = _Job(8, gpu=1, timed=1, **lab)  # one training process
    call = get_submit_command(job, params) + set_gres_string(job)
    assert "--gpus=1" in call and "--cpus-per-task=8" in call, call
    assert "-C h100" in call and "--signal=URG@600" in call and "exclusive" not in call, call
    # A data-parallel fine-tuning of two: two srun tasks of 8 CPUs, two GPUs on its node.
    job = _Job(8, timed=1, name="nlg_finetune", **launch.slurm_resources(1, 2, gpu=True), **lab)
    call = get_submit_command(job, params) + set_gres_string(job)
    assert {"--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=8", "--gres=gpu:2", "-C", "h100"} <= set(call.split())
    assert "--gpus" not in call and "exclusive" not in call, call
    cpu_job = _Job(1, name="score_losses", gpu=0, **lab)
    call = get_submit_command(cpu_job, params) + set_gres_string(cpu_job)
    assert "--gpus" not in call and "--cpus-per-task=1" in call and "--ntasks=1" in call, call
    assert plugin is not None


def test_the_settings_check_asks_for_the_finetunings_nodes_and_tasks():
    job = _Job(4, name="nlg_finetune", **launch.slurm_resources(2, 2, gpu=True), slurm_account="lab")
    options = {setting: words for setting, _, words in slurm.sbatch_options(job)}
    assert options["nodes"] == ["--nodes=2"] and options["tasks per node"] == ["--ntasks-per-node=2"]
    assert options["GRES"] == ["--gres=gpu:2"] and "GPUs" not in options and options["CPUs"] == ["--cpus-per-task=4"]


def test_timed_jobs_without_a_node_type_are_named():
    jobs = [_Job(1, name="train_online", timed=1), _Job(1, name="calibrate", timed=1, constraint=""),
            _Job(1, name="pretrain_scorer", timed=1, constraint="h100"), _Job(1, name="download")]
    assert slurm.unpinned_timed_jobs(jobs) == ["train_online"]


def test_threads_come_from_the_profile_on_a_cluster_and_stay_as_they_were_here():
    common = (ROOT / "workflow/rules/common.smk").read_text()
    assert 'PROFILE_THREADS if workflow.non_local_exec or ON_CUDA else workflow.cores' in common
    assert 'PROFILE_THREADS if workflow.non_local_exec else 1' in common
    text = "".join(p.read_text() for p in (ROOT / "workflow/rules").glob("*.smk"))
    for rule in ("score_losses", "ids_subset", "nlg_pretrain", "nlg_score", "nlg_evaluate"):
        body = text.split(f"rule {rule}:\n", 1)[1].split("\nrule ", 1)[0]
        assert "threads: JOB_THREADS" in body, rule


def test_no_training_takes_the_tracking_store_as_a_param():
    # A param change re-runs a job: the store reaches trainings through the shell text only
    # (the tracking jobs' slices and the tables hold it, and they are meant to re-run).
    text = "".join(p.read_text() for p in (ROOT / "workflow/rules").glob("*.smk"))
    for rule in ("pretrain_scorer", "train_online", "study_train", "nlg_finetune"):
        body = text.split(f"rule {rule}:\n", 1)[1].split("\nrule ", 1)[0]
        assert "TRACKING_URI" not in body.split("shell:")[0] and "{TRACKING_URI:q}" in body, rule
        # The profile's live_tracking reaches the stage the same way (--no-live-run or nothing).
        assert "{LIVE_RUN}" in body.split("shell:")[1], rule
    from darel.config import slices

    assert "tracking_uri" not in slices.report_params({"profile": "quick", "seed": 0, "tracking": {"uri": "x"},
                                                       "carbon": {"pue": 1.0}})


# ---- the plugin's status query ------------------------------------------------------------------

def test_cancelled_by_a_user_is_reported_as_cancelled():
    said = []
    states = slurm.normalise_states({"11": "CANCELLED by 0", "12": "RUNNING", "13": "CANCELLED"}, said.append)
    assert states == {"11": "CANCELLED", "12": "RUNNING", "13": "CANCELLED"}
    assert said == ["Slurm job 11 was cancelled (CANCELLED by 0): reported to Snakemake as CANCELLED"]


class _Log:
    def __init__(self):
        self.lines = []

    def warning(self, line):
        self.lines.append(line)


def test_the_wrapped_query_normalises_and_passes_failures_through():
    async def query(command, logger):  # commands no shell knows: the wrapper falls back to the plugin's query
        return ({"7": "CANCELLED by 1000"}, 0.1) if command == "darel-no-such-ok" else (None, None)

    wrapped = slurm.wrap_status_query(query, slurm.RequeueLog())
    assert slurm.wrap_status_query(wrapped) is wrapped
    log = _Log()
    assert asyncio.run(wrapped("darel-no-such-ok", log)) == ({"7": "CANCELLED"}, 0.1)
    assert asyncio.run(wrapped("darel-no-such-down", log)) == (None, None)
    assert len(log.lines) == 1 and "7" in log.lines[0]


def test_each_requeue_is_one_line():
    requeues, said = slurm.RequeueLog(), []
    requeues.names["5"] = "group cell"
    assert requeues.update([("5", "RUNNING"), ("6", "RUNNING")], said.append) == {"5": "RUNNING", "6": "RUNNING"}
    # sacct --duplicates: the earlier run of 5 is a row of its own, the newest row is the state.
    assert requeues.update([("5", "REQUEUED"), ("5", "PENDING"), ("6", "RUNNING")], said.append)["5"] == "PENDING"
    requeues.update([("5", "REQUEUED"), ("5", "RUNNING"), ("6", "RUNNING")], said.append)
    assert len(said) == 1 and said[0].startswith("Slurm job 5 (group cell) was requeued (run 2")
    # squeue shows no earlier runs: a running job that is pending again was requeued.
    requeues.update([("6", "PENDING")], said.append)
    assert len(said) == 2 and "job 6 " in said[1] and "run 2" in said[1]
    assert slurm.with_duplicates("sacct -X --parsable2 --name u") == "sacct --duplicates -X --parsable2 --name u"
    assert slurm.with_duplicates("squeue --name u") == "squeue --name u"


def test_the_plugin_still_needs_the_status_fix():
    """Fails once the plugin recognises 'CANCELLED by <uid>' itself: then drop the wrapper
    (darel/slurm.py) and its entry in docs/deviations.md."""
    plugin = pytest.importorskip("snakemake_executor_plugin_slurm")
    source = inspect.getsource(plugin.Executor.check_active_jobs)
    assert "status in fail_stati" in source
    assert "startswith" not in source and "CANCELLED by" not in source
    assert slurm.install_status_fix()
    assert getattr(plugin.query_job_status, "darel_wrapped", False)


# ---- the submitter's jobs ----------------------------------------------------------------------------

class _Slurm:
    """squeue and scancel as subprocess.run would call them: squeue lists ``jobs`` (id ->
    (name, working folder)), every call is kept."""

    def __init__(self, jobs):
        self.jobs, self.calls = jobs, []

    def __call__(self, cmd, **kwargs):
        self.calls.append(cmd)
        out = "".join(f"{job}|{name}|{folder}\n" for job, (name, folder) in self.jobs.items()) \
            if cmd[0] == "squeue" else ""
        return subprocess.CompletedProcess(cmd, 0, out, "")

    def cancelled(self):
        return [cmd for cmd in self.calls if cmd[0] == "scancel"]


def test_jobs_of_a_killed_submitter_are_cancelled_and_live_ones_kept(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = socket.gethostname()
    me = f"{os.getpid()}\t{host}\t{slurm.process_start(os.getpid())}"
    jobs = tmp_path / "jobs.tsv"
    jobs.write_text(f"101\t{dead.pid}\t{host}\t-\n102\t{me}\n103\t{dead.pid}\tother-node\t-\n"
                    f"104\t{os.getpid()}\t{host}\tanother-boot:1\n105\t{dead.pid}\t{host}\n")
    fake, said = _Slurm({job: ("wrap", str(tmp_path)) for job in ("101", "102", "103", "104", "105")}), []
    # Another Snakemake of the folder is alive: this host's dead (or reused) PIDs are
    # orphans, another host's submitter cannot be judged and is kept.
    cancelled = slurm.cancel_orphans(said.append, jobs, alone=False, run=fake, project=tmp_path)
    assert cancelled == ["101", "104", "105"] and fake.cancelled() == [["scancel", "--", "101", "104", "105"]]
    assert said and "101, 104, 105" in said[0]
    assert jobs.read_text().splitlines() == [f"102\t{me}", f"103\t{dead.pid}\tother-node\t-"]
    slurm.forget_mine(jobs)
    assert jobs.read_text().splitlines() == [f"103\t{dead.pid}\tother-node\t-"]


class _Workflow:  # the Snakemake a user started, not a dry run
    output_settings = type("Output", (), {"dryrun": False})()

    def __init__(self):
        from snakemake_interface_executor_plugins.settings import ExecMode

        self.exec_mode = ExecMode.DEFAULT


def test_a_submitter_of_another_host_is_cancelled_when_no_snakemake_of_the_folder_lives(tmp_path, monkeypatch):
    import fcntl

    from darel import preflight

    monkeypatch.chdir(tmp_path)
    (tmp_path / ".snakemake").mkdir()
    # The record as written on another login node, whose Snakemake was killed there.
    slurm.JOBS_FILE.write_text(f"201\t{os.getpid()}\tlogin2\t0f0f:123\n")
    held = open(slurm.LIVE_LOCK, "a+")
    fcntl.flock(held.fileno(), fcntl.LOCK_SH)  # a Snakemake of this folder is alive (somewhere)
    try:
        assert slurm.alone_here() is False
        orphans, kept = slurm.orphaned_jobs(alone=False)
        assert orphans == [] and kept == [f"201\t{os.getpid()}\tlogin2\t0f0f:123"]
    finally:
        held.close()
    assert slurm.alone_here() is True

    fake, said = _Slurm({"201": ("a-run-uuid", str(tmp_path))}), []
    monkeypatch.setattr(slurm.subprocess, "run", fake)
    # Only the Snakemake that holds the folder's writer lock cancels anything.
    assert slurm.cancel_orphans_at_start(_Workflow(), said.append) == [] and fake.calls == []
    monkeypatch.setattr(preflight, "_RUN", ["held"])
    assert slurm.cancel_orphans_at_start(_Workflow(), said.append) == ["201"]
    assert fake.cancelled() == [["scancel", "--", "201"]] and slurm.JOBS_FILE.read_text() == ""


# squeue and scancel stand-ins on PATH: each logs its arguments; squeue prints the jobs file.
FAKE_SLURM = """#!{python}
import json, os, sys
name = os.path.basename(sys.argv[0])
with open({log!r}, "a") as out:
    out.write(json.dumps([name, *sys.argv[1:]]) + "\\n")
if name == "squeue":
    sys.stdout.write(open({jobs!r}).read())
"""


@pytest.fixture()
def fake_slurm(tmp_path, monkeypatch):
    """A project folder as the working folder, squeue and scancel stand-ins first on PATH,
    and this Snakemake holding the folder's writer lock. Returns (project, squeue's
    listing to fill, the calls logged)."""
    from darel import preflight

    project, bin_dir = tmp_path / "project", tmp_path / "bin"
    (project / ".snakemake").mkdir(parents=True)
    bin_dir.mkdir()
    log, listing = tmp_path / "calls.jsonl", tmp_path / "squeue.txt"
    listing.write_text("")
    for name in ("squeue", "scancel"):
        script = bin_dir / name
        script.write_text(FAKE_SLURM.format(python=sys.executable, log=str(log), jobs=str(listing)))
        script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.chdir(project)
    monkeypatch.setattr(preflight, "_RUN", ["held"])

    def calls():
        import json

        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    return project, listing, calls


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_record_that_is_an_option_never_reaches_scancel(fake_slurm):
    """The reporter's record: job id ``--user=root`` beside a real one. The option is named
    in one line and dropped; scancel gets ``--`` before the one number Slurm confirms."""
    project, listing, calls = fake_slurm
    dead, host = _dead_pid(), socket.gethostname()
    slurm.JOBS_FILE.write_text(f"--user=root\t{dead}\t{host}\t-\n999999\t{dead}\t{host}\t-\n")
    listing.write_text(f"999999|wrap|{project}\n")
    said = []
    assert slurm.cancel_orphans_at_start(_Workflow(), said.append) == ["999999"]
    scancels = [call for call in calls() if call[0] == "scancel"]
    assert scancels == [["scancel", "--", "999999"]]
    assert not any("--user=root" in arg for call in calls() for arg in call)
    named = [line for line in said if "--user=root" in line]
    assert len(named) == 1 and "line 1 is not a Slurm job record" in named[0] and "\n" not in named[0]
    assert slurm.JOBS_FILE.read_text() == ""


def test_only_jobs_slurm_confirms_as_this_workflows_are_cancelled(fake_slurm):
    """Records of the user's dead submitters whose jobs are not this run's in this folder
    (another folder, another run's name, unknown to Slurm: finished) are dropped uncancelled;
    a record of another user is kept and never acted on."""
    project, listing, calls = fake_slurm
    dead, host, uid = _dead_pid(), socket.gethostname(), os.geteuid()
    mine = f"{dead}\t{host}\t-\t{uid}\trun-a"
    other_user = f"305\t{dead}\t{host}\t-\t{uid + 1}\trun-a"
    slurm.JOBS_FILE.write_text(f"301\t{mine}\n302\t{mine}\n303\t{mine}\n304\t{mine}\n{other_user}\n")
    listing.write_text(f"301|run-a|{project}\n302|run-a|/elsewhere/project\n303|another-run|{project}\n"
                       f"305|run-a|{project}\n")
    said = []
    assert slurm.cancel_orphans_at_start(_Workflow(), said.append) == ["301"]
    assert [call for call in calls() if call[0] == "scancel"] == [["scancel", "--", "301"]]
    assert calls()[0] == ["squeue", "--noheader", f"--user={uid}", "--format=%i|%j|%Z"]
    assert any("302, 303 are not jobs this workflow submitted here" in line for line in said), said
    assert any("1 record(s) of another user" in line for line in said), said
    assert slurm.JOBS_FILE.read_text() == f"{other_user}\n"


def test_without_squeue_nothing_is_cancelled_and_the_records_stay(fake_slurm, monkeypatch):
    project, listing, calls = fake_slurm
    monkeypatch.setenv("PATH", "/nonexistent")  # no Slurm client on this host
    record = f"401\t{_dead_pid()}\t{socket.gethostname()}\t-\n"
    slurm.JOBS_FILE.write_text(record)
    said = []
    assert slurm.cancel_orphans_at_start(_Workflow(), said.append) == []
    assert calls() == [] and "could not be checked with squeue" in said[0]
    assert slurm.JOBS_FILE.read_text() == record


@pytest.mark.parametrize("plant", ["link", "fifo", "hardlink"])
def test_a_jobs_file_that_is_not_a_plain_file_of_ones_own_stops_the_run(fake_slurm, tmp_path, plant):
    project, listing, calls = fake_slurm
    victim = tmp_path / "victim"
    victim.write_text(f"501\t{_dead_pid()}\t{socket.gethostname()}\t-\n")
    before = victim.read_bytes()
    if plant == "link":
        slurm.JOBS_FILE.symlink_to(victim)
    elif plant == "fifo":
        os.mkfifo(slurm.JOBS_FILE)
    else:
        os.link(victim, slurm.JOBS_FILE)
    from darel import preflight

    with pytest.raises(preflight.Refusal) as refused:
        slurm.cancel_orphans_at_start(_Workflow(), print)
    line = str(refused.value)
    assert line.startswith(f"{slurm.JOBS_FILE} is ") and "\n" not in line and "(nothing was run)" in line
    assert victim.read_bytes() == before and calls() == []


def test_the_records_are_rewritten_under_unpredictable_names_never_through_a_link(fake_slurm, tmp_path):
    """The old rewrite wrote `.snakemake/darel-slurm-jobs.<pid>.tmp` through whatever was
    there: links at every name a PID near this one would give change nothing now."""
    project, listing, calls = fake_slurm
    victim = tmp_path / "victim"
    victim.write_text("the victim's content\n")
    for pid in range(os.getpid() - 5, os.getpid() + 50):
        for name in (f"darel-slurm-jobs.{pid}.tmp", f".darel-slurm-jobs.tsv.{pid}.tmp"):
            (project / ".snakemake" / name).symlink_to(victim)
    slurm.JOBS_FILE.write_text(f"601\t{_dead_pid()}\t{socket.gethostname()}\t-\n")
    listing.write_text(f"601|wrap|{project}\n")
    assert slurm.cancel_orphans_at_start(_Workflow(), print) == ["601"]
    slurm.forget_mine()
    assert victim.read_text() == "the victim's content\n"
    assert not slurm.JOBS_FILE.is_symlink() and slurm.JOBS_FILE.read_text() == ""


def test_the_live_lock_is_probed_without_following_or_creating_a_link(fake_slurm, tmp_path):
    project, _, _ = fake_slurm
    slurm.LIVE_LOCK.symlink_to(tmp_path / "created-by-the-probe")
    with pytest.raises(slurm.JobsFileError, match="darel.live cannot be probed"):
        slurm.alone_here()
    assert not (tmp_path / "created-by-the-probe").exists()


def test_a_reused_pid_is_told_apart_by_its_start():
    me = os.getpid()
    assert slurm.submitter_gone(me, socket.gethostname(), slurm.process_start(me), alone=False) is False
    assert slurm.submitter_gone(me, socket.gethostname(), "other-boot:42", alone=False) is True
    assert slurm.submitter_gone(me, "login2", "x:1", alone=False) is None
    assert slurm.submitter_gone(me, "login2", "x:1", alone=True) is True


def test_submissions_are_recorded(tmp_path):
    class Executor:
        run_uuid = "9f1c-run"  # the plugin names every job of its run by it

        def report_job_submission(self, job_info):
            return "reported"

    class Info:
        def __init__(self, jobid):
            self.external_jobid = jobid

    jobs = tmp_path / "sub" / "jobs.tsv"
    slurm.record_submissions(Executor, jobs)
    slurm.record_submissions(Executor, jobs)  # idempotent
    for jobid in ("4242", "--user=root", "4243"):
        assert Executor().report_job_submission(Info(jobid)) == "reported"
    me = f"{os.getpid()}\t{socket.gethostname()}\t{slurm.process_start(os.getpid())}\t{os.geteuid()}"
    assert jobs.read_text() == f"4242\t{me}\t9f1c-run\n4243\t{me}\t9f1c-run\n"
    assert sorted(p.name for p in jobs.parent.iterdir()) == ["jobs.tsv"]  # no temporary file left
    # One a killed writer left goes with the next rewrite; a link there stays where it points.
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (jobs.parent / f".jobs.tsv.{dead.pid}.x1y2z3.tmp").write_text("half")
    (jobs.parent / f".jobs.tsv.{dead.pid}.a1b2c3.tmp").symlink_to(tmp_path / "elsewhere")
    slurm.forget_mine(jobs)
    assert jobs.read_text() == "" and sorted(p.name for p in jobs.parent.iterdir()) == [
        f".jobs.tsv.{dead.pid}.a1b2c3.tmp", "jobs.tsv"]
    assert not (tmp_path / "elsewhere").exists()


def test_sigterm_and_sighup_act_like_ctrl_c():
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        slurm.stop_like_ctrl_c()
        for signum in before:
            with pytest.raises(KeyboardInterrupt):
                signal.raise_signal(signum)
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def test_prepare_does_nothing_on_the_local_executor():
    class Workflow:
        executor_plugin = type("Plugin", (), {"name": "local"})()

    assert slurm.prepare(Workflow(), print) is False


# ---- locks and stores ----------------------------------------------------------------------------------

def test_lock_record_names_pid_host_and_slurm_job(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    record = watchdog.holder_record()
    assert record == f"pid={os.getpid()} host={socket.gethostname()} slurm_job=77"
    assert watchdog.describe_holder(record) == f"PID {os.getpid()} on {socket.gethostname()} (Slurm job 77)"
    assert watchdog.stop_advice(record) == "scancel 77"
    monkeypatch.delenv("SLURM_JOB_ID")
    plain = watchdog.holder_record()
    assert watchdog.stop_advice(plain) == f"kill {os.getpid()} on {socket.gethostname()}"
    assert watchdog.describe_holder("123") == "PID 123"  # a lock written by an older release


def test_only_an_sqlite_store_gets_a_writers_lock_beside_its_file(tmp_path):
    assert tracking.lock_path_for(f"sqlite:///{tmp_path}/m.db") == tmp_path / "m.db.lock"
    for uri in ("postgresql://mlflow@db:5432/mlflow", "mysql+pymysql://u@db/mlflow", "http://127.0.0.1:5000"):
        assert tracking.lock_path_for(uri) is None


@pytest.mark.parametrize("uri", [
    "sqlite:///mlflow.db", "postgresql://mlflow@127.0.0.1:5432/mlflow", "postgresql+psycopg2://u@db/mlflow",
    "postgresql+psycopg://u@db/mlflow", "mysql://u@db/mlflow", "mysql+pymysql://u@db:3306/mlflow",
    "http://127.0.0.1:5000", "https://mlflow.example.org",
    # socket files: libpq's host=<folder>, MySQL's unix_socket=<file>
    "postgresql:///mlflow?host=/var/run/postgresql", "postgresql://mlflow@:5433/mlflow?host=/run/postgresql",
    "mysql+pymysql://mlflow@/mlflow?unix_socket=/run/mysqld/mysqld.sock",
])
def test_every_kind_of_store_is_accepted(uri):
    assert grammar.check_tracking_uri(uri) == uri


@pytest.mark.parametrize("uri", ["postgresql://u@db/mlflow;rm -rf ~", "mysql://u@db/ml flow", "mssql://u@db/x",
                                 "postgresql:///nohost", "http://h/$(id)", "postgresql:///db?host=relative/dir",
                                 "mysql+pymysql:///db?unix_socket=/s.sock&init_command=x"])
def test_stores_stay_strict(uri):
    with pytest.raises(grammar.GrammarError):
        grammar.check_tracking_uri(uri)


def test_a_store_that_does_not_answer_is_one_line_without_its_password():
    port = _closed_port()
    for uri in (f"postgresql://mlflow:s3cret@127.0.0.1:{port}/mlflow", f"http://127.0.0.1:{port}"):
        problem = tracking.store_answers(uri, timeout_s=2)
        assert problem and "\n" not in problem and "s3cret" not in problem and "nothing was run" in problem
    assert tracking.redacted("mysql+pymysql://u:pw@db/x") == "mysql+pymysql://u:***@db/x"
    assert tracking.store_answers("sqlite:///mlflow.db") is None


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the block ends: nothing listens there


# ---- local rules -------------------------------------------------------------------------------------

# The workflow's rules, as Snakemake itself reads them: which are local, and all of them.
_READ_RULES = """
import json
from pathlib import Path

from snakemake.api import SnakemakeApi
from snakemake.settings.types import OutputSettings, ResourceSettings

with SnakemakeApi(OutputSettings()) as api:
    api_workflow = api.workflow(resource_settings=ResourceSettings(), snakefile=Path("Snakefile"), workdir=Path.cwd())
    workflow = api_workflow._workflow
    print(json.dumps({"local": sorted(workflow._localrules), "rules": sorted(r.name for r in workflow.rules)}))
"""

RECORD_RULES = {"all", "download", "data_card", "cell_record", "study_cell_record", "nlg_cell_record", "table1",
                "nlg_table", "study_table1", "study_nlg_table"}
TRACKING_RULES = {"track_cell", "study_track", "nlg_track"}


def _rules_of(project) -> dict:
    import json

    from tests.conftest import run_in

    proc = run_in(project, sys.executable, "-c", _READ_RULES, env={"PYTHONPATH": str(ROOT)})
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_record_jobs_run_on_the_submitting_node_and_no_group_holds_one(tmp_path):
    from tests.conftest import tiny_project

    def server_store(params):
        params["tracking"]["uri"] = "http://127.0.0.1:5999"
        return params

    local_store = _rules_of(tiny_project(tmp_path / "file", lambda params: params))
    assert set(local_store["local"]) == RECORD_RULES | TRACKING_RULES
    # A store on a server may answer the compute nodes only: its tracking jobs stay cluster jobs.
    assert set(_rules_of(tiny_project(tmp_path / "server", server_store))["local"]) == RECORD_RULES
    groups = yaml.safe_load(PROFILE.read_text())["groups"]
    # A group with one local job would run whole on the submitting node, its training included.
    assert not set(groups) & (RECORD_RULES | TRACKING_RULES)
    assert {"train_online", "study_train", "nlg_finetune"} <= set(groups)
    # The trainings evaluate their own models: no evaluation job is left to group with them.
    assert not {"evaluate", "study_evaluate"} & set(groups)
    assert set(local_store["rules"]) >= RECORD_RULES | TRACKING_RULES | set(groups)


def test_localrules_are_declared_once():
    text = "".join(p.read_text() for p in (ROOT / "workflow/rules").glob("*.smk")) + (ROOT / "Snakefile").read_text()
    declared = re.findall(r"^\s*localrules:(.*)$", text, flags=re.M)
    names = [name.strip() for line in declared for name in line.split(",")]
    assert len(names) == len(set(names)) and set(names) == RECORD_RULES | TRACKING_RULES
    assert "localrules" not in "".join(p.read_text() for p in (ROOT / "workflow/rules").glob("*.smk")
                                       if p.name != "execution.smk") + (ROOT / "Snakefile").read_text()


# ---- the lab's settings, asked of Slurm before the first submission ----------------------------------

# A stand-in for sbatch: refuses the account my-lab, the partition nope and more than 1 TB of
# memory with Slurm's own messages (Slurm 22-24), accepts the rest; records every call.
FAKE_SBATCH = r"""#!/bin/sh
echo "$*" >> "$FAKE_SLURM_CALLS"
for a in "$@"; do
  case "$a" in
    --account=my-lab)
      echo "sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified" >&2
      exit 1;;
    --partition=nope)
      echo "sbatch: error: invalid partition specified: nope" >&2
      echo "sbatch: error: Batch job submission failed: Invalid partition name specified" >&2
      exit 1;;
    --mem=*)
      if [ "${a#--mem=}" -gt 1000000 ]; then
        echo "sbatch: error: Memory specification can not be satisfied" >&2
        echo "sbatch: error: Batch job submission failed: Requested node configuration is not available" >&2
        exit 1
      fi;;
  esac
done
case " $* " in
  *" --test-only "*)
    echo "sbatch: Job 7 to start at 2026-11-29T04:10:00 using 1 processors on nodes n1 in partition gpu" >&2;;
  *) echo 1234;;
esac
"""


@pytest.fixture
def fake_sbatch(tmp_path, monkeypatch):
    """The stand-in sbatch (and silent squeue, sacct, scontrol...) first on PATH; returns the
    file of their calls."""
    bin_dir, calls = tmp_path / "fake-slurm", tmp_path / "slurm.calls"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(FAKE_SBATCH)
    for name in ("squeue", "sacct", "scancel", "sinfo", "scontrol", "sacctmgr"):
        (bin_dir / name).write_text(f'#!/bin/sh\necho "{name} $*" >> "$FAKE_SLURM_CALLS"\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    calls.write_text("")
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SLURM_CALLS", str(calls))
    return calls


LAB_JOB = {"slurm_account": "lab", "slurm_partition": "gpu", "constraint": "h100", "mem_mb": 32000, "runtime": 720}


@pytest.mark.parametrize("bad, named, said", [
    ({"slurm_account": "my-lab"}, "account 'my-lab'", "Batch job submission failed: Invalid account or "
                                                           "account/partition combination specified"),
    ({"slurm_partition": "nope"}, "partition 'nope'", "invalid partition specified: nope; Batch job submission "
                                                      "failed: Invalid partition name specified"),
    ({"mem_mb": 4_000_000}, "memory '4000000'", "Memory specification can not be satisfied; Batch job submission "
                                                "failed: Requested node configuration is not available"),
])
def test_a_setting_slurm_refuses_is_named_in_one_line(fake_sbatch, bad, named, said):
    jobs = [_Job(8, name="calibrate", gpu=1, timed=1, **LAB_JOB),
            _Job(8, name="train_online", gpu=1, timed=1, **{**LAB_JOB, **bad})]
    problem = slurm.settings_refused(jobs)
    assert problem.startswith(f"Slurm refuses the train_online jobs' {named}: {said} (sbatch --test-only "), problem
    assert problem.endswith("nothing was submitted") and "\n" not in problem
    calls = fake_sbatch.read_text().splitlines()
    assert calls and all(call.startswith("--test-only ") for call in calls)  # nothing was queued
    assert calls[0] == ("--test-only --job-name=darel-settings-check --account=lab --partition=gpu --constraint=h100 "
                        "--mem=32000 --time=720 --gpus=1 --cpus-per-task=8 --wrap=true")


def test_settings_slurm_accepts_pass_with_one_question_per_kind_of_job(fake_sbatch):
    jobs = [_Job(8, name="train_online", gpu=1, **LAB_JOB), _Job(8, name="train_online", gpu=1, **LAB_JOB),
            _Job(1, name="score_losses", gpu=0, constraint="", slurm_account="lab")]
    assert slurm.settings_refused(jobs) is None
    assert fake_sbatch.read_text().splitlines() == [
        "--test-only --job-name=darel-settings-check --account=lab --partition=gpu --constraint=h100 --mem=32000 "
        "--time=720 --gpus=1 --cpus-per-task=8 --wrap=true",
        "--test-only --job-name=darel-settings-check --account=lab --constraint= --cpus-per-task=1 --wrap=true"]


def test_a_resource_snakemake_knows_only_later_is_not_asked_about(fake_sbatch):
    from snakemake.common.tbdstring import TBDString

    job = _Job(2, name="score_losses", slurm_account="lab", mem_mb=TBDString())  # e.g. memory from input sizes
    assert slurm.settings_refused([job]) is None
    assert fake_sbatch.read_text().splitlines() == [
        "--test-only --job-name=darel-settings-check --account=lab --cpus-per-task=2 --wrap=true"]


def test_without_sbatch_nothing_is_asked(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert slurm.settings_refused([_Job(8, name="train_online", **LAB_JOB)]) is None


def test_the_unedited_example_profile_stops_the_workflow_before_any_submission(fake_sbatch, tmp_path):
    """The issue's hang: the example profile's account my-lab, on the Slurm executor (its plugin: make test-cluster)."""
    pytest.importorskip("snakemake_executor_plugin_slurm")
    from tests.conftest import run_in, tiny_project

    project = tiny_project(tmp_path / "project", lambda params: params)
    lab = tmp_path / "darel-lab"
    lab.mkdir()
    (lab / "config.yaml").write_text(LAB.read_text())
    proc = run_in(project, str(Path(sys.executable).with_name("snakemake")), "--profile", str(lab),
                  "--workflow-profile", "profiles/slurm", "results/table1.csv", check=False, timeout=1800,
                  env={"FAKE_SLURM_CALLS": str(fake_sbatch)})
    assert proc.returncode != 0
    refusal = [line for line in proc.stderr.splitlines() if line.startswith("Slurm refuses")]
    assert len(refusal) == 1 and "jobs' account 'my-lab': Batch job submission failed: Invalid account" in refusal[0]
    sbatch_calls = [c for c in fake_sbatch.read_text().splitlines() if not re.match(r"(squeue|sacct|scancel|sinfo|"
                                                                                    r"scontrol|sacctmgr) ", c)]
    assert sbatch_calls and all(c.startswith("--test-only ") for c in sbatch_calls), sbatch_calls
