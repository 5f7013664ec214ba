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

import pytest
import yaml

from darel import grammar, slurm, tracking
from darel.stagekit import watchdog
from tests.conftest import ROOT

PROFILE = ROOT / "profiles/slurm/config.yaml"


def _rule_names() -> set[str]:
    text = "".join(p.read_text() for p in (ROOT / "workflow/rules").glob("*.smk")) + (ROOT / "Snakefile").read_text()
    return set(re.findall(r"^(?:rule|use rule \w+ as) (\w+)", text, flags=re.M))


def test_slurm_profile_names_only_rules_that_exist():
    profile = yaml.safe_load(PROFILE.read_text())
    rules = _rule_names()
    assert {"pretrain_scorer", "train_online", "nlg_track", "study_evaluate"} <= rules
    for key in ("set-resources", "groups"):
        unknown = set(profile[key]) - rules
        assert not unknown, f"{key} names rules the workflow does not have: {unknown}"
    assert profile["executor"] == "slurm"
    assert {"slurm_partition", "slurm_account", "runtime", "mem_mb"} <= set(profile["default-resources"])
    # No local limits: on a cluster the node, not a global resource, keeps a timing alone.
    assert "resources" not in profile and "cores" not in profile


def test_every_timed_rule_and_its_group_is_exclusive():
    profile = yaml.safe_load(PROFILE.read_text())
    text = "".join(p.read_text() for p in (ROOT / "workflow/rules").glob("*.smk"))
    timed = set(re.findall(r"^rule (\w+):(?:(?!^rule ).)*?timed=1", text, flags=re.M | re.S))
    assert {"pretrain_scorer", "calibrate", "train_online", "study_train", "nlg_finetune"} <= timed
    exclusive = {rule for rule, res in profile["set-resources"].items() if "--exclusive" in res.get("slurm_extra", "")}
    grouped_with_timed = {rule for rule, group in profile["groups"].items()
                          if group in {profile["groups"].get(t) for t in timed}}
    assert timed | grouped_with_timed <= exclusive
    # A group's jobs must agree on string resources (Snakemake refuses a group otherwise).
    for group in set(profile["groups"].values()):
        extras = {str(profile["set-resources"].get(r, {}).get("slurm_extra")) for r, g in profile["groups"].items()
                  if g == group}
        assert len(extras) == 1, (group, extras)


def test_threads_come_from_the_profile_on_a_cluster_and_stay_as_they_were_here():
    common = (ROOT / "workflow/rules/common.smk").read_text()
    assert 'PROFILE_THREADS if workflow.non_local_exec else workflow.cores' in common
    assert 'PROFILE_THREADS if workflow.non_local_exec else 1' in common
    text = "".join(p.read_text() for p in (ROOT / "workflow/rules").glob("*.smk"))
    for rule in ("score_losses", "ids_subset", "evaluate", "nlg_pretrain", "nlg_score", "nlg_evaluate"):
        body = text.split(f"rule {rule}:\n", 1)[1].split("\nrule ", 1)[0]
        assert "threads: JOB_THREADS" in body, rule


def test_no_training_takes_the_tracking_store_as_a_param():
    # A param change re-runs a job: the store reaches trainings through the shell text only
    # (the tracking jobs' slices and the tables hold it, and they are meant to re-run).
    text = "".join(p.read_text() for p in (ROOT / "workflow/rules").glob("*.smk"))
    for rule in ("pretrain_scorer", "train_online", "study_train", "nlg_finetune"):
        body = text.split(f"rule {rule}:\n", 1)[1].split("\nrule ", 1)[0]
        assert "TRACKING_URI" not in body.split("shell:")[0] and "{TRACKING_URI:q}" in body, rule
    from darel.config import slices

    assert "tracking_uri" not in slices.report_params({"profile": "quick", "seed": 0, "tracking": {"uri": "x"},
                                                       "carbon": {"pue": 1.0}})


# ---- the plugin's status query ------------------------------------------------------------------

def test_cancelled_by_a_user_is_reported_as_cancelled():
    said = []
    states = slurm.normalise_states({"11": "CANCELLED by 0", "12": "RUNNING", "13": "CANCELLED"}, said.append)
    assert states == {"11": "CANCELLED", "12": "RUNNING", "13": "CANCELLED"}
    assert said == ["Slurm job 11 was cancelled (CANCELLED by 0): reported to Snakemake as CANCELLED"]


def test_the_wrapped_query_normalises_and_passes_failures_through():
    class Log:
        def __init__(self):
            self.lines = []

        def warning(self, line):
            self.lines.append(line)

    async def query(command, logger):
        return ({"7": "CANCELLED by 1000"}, 0.1) if command == "ok" else (None, None)

    wrapped = slurm.wrap_status_query(query)
    assert slurm.wrap_status_query(wrapped) is wrapped
    log = Log()
    assert asyncio.run(wrapped("ok", log)) == ({"7": "CANCELLED"}, 0.1)
    assert asyncio.run(wrapped("down", log)) == (None, None)
    assert len(log.lines) == 1 and "7" in log.lines[0]


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

def test_jobs_of_a_killed_submitter_are_cancelled_and_live_ones_kept(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = socket.gethostname()
    jobs = tmp_path / "jobs.tsv"
    jobs.write_text(f"101\t{dead.pid}\t{host}\n102\t{os.getpid()}\t{host}\n103\t{dead.pid}\tother-node\n")
    calls, said = [], []
    cancelled = slurm.cancel_orphans(said.append, jobs, run=lambda cmd, **kw: calls.append(cmd))
    assert cancelled == ["101"] and calls == [["scancel", "101"]]
    assert said and "101" in said[0]
    assert jobs.read_text().splitlines() == [f"102\t{os.getpid()}\t{host}", f"103\t{dead.pid}\tother-node"]
    slurm.forget_mine(jobs)
    assert jobs.read_text().splitlines() == [f"103\t{dead.pid}\tother-node"]


def test_submissions_are_recorded(tmp_path):
    class Executor:
        def report_job_submission(self, job_info):
            return "reported"

    class Info:
        external_jobid = "4242"

    jobs = tmp_path / "sub" / "jobs.tsv"
    slurm.record_submissions(Executor, jobs)
    slurm.record_submissions(Executor, jobs)  # idempotent
    assert Executor().report_job_submission(Info()) == "reported"
    assert jobs.read_text() == f"4242\t{os.getpid()}\t{socket.gethostname()}\n"


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
    "sqlite:///mlflow.db", "postgresql://mlflow@127.0.0.1:5432/mlflow", "postgresql+psycopg2://u:pw@db/mlflow",
    "postgresql+psycopg://u@db/mlflow", "mysql://u@db/mlflow", "mysql+pymysql://u:pw@db:3306/mlflow",
    "http://127.0.0.1:5000", "https://mlflow.example.org",
])
def test_every_kind_of_store_is_accepted(uri):
    assert grammar.check_tracking_uri(uri) == uri


@pytest.mark.parametrize("uri", ["postgresql://u@db/mlflow;rm -rf ~", "mysql://u@db/ml flow", "mssql://u@db/x",
                                 "postgresql:///nohost", "http://h/$(id)"])
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
