"""A preemption notice (SIGURG, Slurm's --signal) mid-epoch: the epoch ends, its checkpoint
is written, the job is requeued, and the resumed training equals an uninterrupted one. The
same on a real one-node Slurm: tests/cluster/test_cluster.py."""

from __future__ import annotations

import signal
import subprocess

import pytest
import torch

from darel import checkpoint, preemption
from tests.test_engine import _plan, _problem, _run


class Left(Exception):
    pass


@pytest.fixture
def no_exit(monkeypatch):
    """preemption.leave raises Left(code) instead of ending pytest; no notice is pending."""
    def leave_here(code):
        raise Left(code)

    monkeypatch.setattr(preemption, "_exit", leave_here)
    monkeypatch.setattr(preemption, "_notice", [])
    monkeypatch.setattr(preemption, "_log_file", [])
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    before = signal.getsignal(preemption.SIGNAL)
    yield
    signal.signal(preemption.SIGNAL, before)


def test_a_notice_mid_epoch_checkpoints_that_epoch_and_the_resumed_weights_are_identical(tmp_path, no_exit):
    images, labels = _problem()
    plan = _plan(checkpoint_every=100)  # no periodic checkpoint: only the notice writes one
    reference, ref_summary = _run(plan, images, labels)

    from darel.augment import DeviceAugment

    aug = DeviceAugment(pad=1, hflip=True, max_rotation_deg=10, mean=[0.3], std=[0.2])
    seen = {"epoch": 0, "batches": 0}

    def count(epoch, record):
        seen["epoch"] = epoch + 1

    def notice_in_epoch_2(x, gen):
        if seen["epoch"] == 1:
            seen["batches"] += 1
            if seen["batches"] == 2:  # the second batch of the second epoch
                signal.raise_signal(preemption.SIGNAL)
        return aug(x, gen)

    ckpt = tmp_path / "ckpt.pt"
    with pytest.raises(Left) as left:
        _run(plan, images, labels, ckpt=ckpt, augment=notice_in_epoch_2, on_epoch_end=count)
    assert left.value.args == (preemption.EXIT_CODE,)
    assert seen["batches"] > 2  # the epoch ran to its end after the notice
    assert checkpoint.loads(ckpt.read_bytes())["loop"]["epoch"] == 2

    preemption._notice.clear()
    resumed, summary = _run(plan, images, labels, ckpt=ckpt)
    assert summary["resumed_from_epoch"] == 2 and summary["epochs_completed"] == 4
    for (name, a), (_, b) in zip(reference.state_dict().items(), resumed.state_dict().items()):
        assert torch.equal(a, b), name
    assert summary["curves"]["train_loss"] == ref_summary["curves"]["train_loss"]


def test_a_notice_during_the_last_epoch_lets_the_run_finish(tmp_path, no_exit):
    images, labels = _problem()
    plan = _plan(epochs=2, checkpoint_every=100)

    def notice_after_the_first_epoch(epoch, record):
        if epoch == 0:
            signal.raise_signal(preemption.SIGNAL)  # seen at the end of the last epoch: the outputs come next

    _, summary = _run(plan, images, labels, ckpt=tmp_path / "ckpt.pt", on_epoch_end=notice_after_the_first_epoch)
    assert summary["epochs_completed"] == 2 and preemption.noticed()


def test_requeue_asks_slurm_for_this_job_and_says_what_happened():
    calls = []

    def ok(cmd, **kw):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    assert "requeued" in preemption.requeue("42", run=ok) and calls == [["scontrol", "requeue", "42"]]

    def refused(cmd, **kw):
        return subprocess.CompletedProcess(cmd, 1, "", "scontrol: error: Requested operation is presently disabled\n")

    said = preemption.requeue("42", run=refused)
    assert "presently disabled" in said and "next workflow run resumes" in said
    assert "not in a Slurm job" in preemption.requeue("")


def test_every_process_of_a_data_parallel_run_stops_at_the_same_epoch(monkeypatch):
    monkeypatch.setattr(preemption, "_notice", [])
    assert preemption.agreed(lambda mine: [mine, False]) is False
    assert preemption.agreed(lambda mine: [mine, True]) is True  # another rank got the notice


def test_a_notice_during_start_up_leaves_before_the_first_epoch(tmp_path, no_exit):
    images, labels = _problem()
    plan = _plan(checkpoint_every=100)
    epochs_seen = []
    preemption.watch()  # as a stage does in its first line
    signal.raise_signal(preemption.SIGNAL)  # the notice comes before the training starts
    with pytest.raises(Left) as left:
        _run(plan, images, labels, ckpt=tmp_path / "ckpt.pt", on_epoch_end=lambda e, r: epochs_seen.append(e))
    assert left.value.args == (preemption.EXIT_CODE,)
    assert epochs_seen == [] and not (tmp_path / "ckpt.pt").exists()


# A stage's process start as the stage CLIs have it: stagekit.parser first (the handler),
# then the heavy imports and a training with a checkpoint. The notice is sent by the process
# itself, before torch is imported; a fake scontrol on PATH records what was asked of Slurm.
STAGE = """
import os, signal, sys
from darel import stagekit
args = stagekit.parser("test").parse_args(["--log", sys.argv[1]])
os.kill(os.getpid(), signal.SIGURG)  # the notice during start-up
params, log = stagekit.start(args, "train_test")
from tests.test_engine import _plan, _problem, _run
images, labels = _problem()
_run(_plan(), images, labels, ckpt=sys.argv[2], on_epoch_end=lambda e, r: print("epoch", e, flush=True))
print("finished", flush=True)
"""


def _stage(tmp_path, restarts: int, max_requeues: str | None = None, restarts_in_env: bool = True):
    """The stage with SLURM_RESTART_COUNT=restarts, or without the variable (as the Slurm
    plugin's job step starts a rule) and scontrol answering Restarts=restarts."""
    import os
    import sys

    from tests.conftest import ROOT

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "scontrol.calls"}\n'
                        f'[ "$1" = show ] && echo "JobId=4242 JobName=cell Requeue=1 Restarts={restarts} BatchFlag=1"\n'
                        'exit 0\n')
    scontrol.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT),
           "SLURM_JOB_ID": "4242", "SLURM_RESTART_COUNT": str(restarts)}
    if not restarts_in_env:
        env.pop("SLURM_RESTART_COUNT")
    env.pop("DAREL_MAX_REQUEUES", None)
    if max_requeues is not None:
        env["DAREL_MAX_REQUEUES"] = max_requeues
    log = tmp_path / "logs" / "train.log"
    return subprocess.run([sys.executable, "-c", STAGE, str(log), str(tmp_path / "ckpt.pt")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=900), log


def test_a_stage_noticed_while_starting_requeues_itself_before_any_epoch_and_keeps_its_log(tmp_path):
    proc, log = _stage(tmp_path, restarts=0)
    assert proc.returncode == preemption.EXIT_CODE, proc.stderr
    assert "epoch" not in proc.stdout
    assert (tmp_path / "scontrol.calls").read_text() == "requeue 4242\n"
    assert "during start-up" in proc.stderr and "Slurm job 4242 requeued" in proc.stderr
    kept = log.with_name("train.attempt1.log")
    assert kept.read_text() == log.read_text() and "during start-up" in kept.read_text()

    # The requeued run (Slurm sets SLURM_RESTART_COUNT=1): its log names the attempt and the kept one.
    proc, log = _stage(tmp_path, restarts=1)
    assert proc.returncode == preemption.EXIT_CODE, proc.stderr
    first_line = log.read_text().splitlines()[0]
    assert first_line == ("===== attempt 2 of Slurm job 4242 (requeued 1 time); the earlier attempts' logs: "
                          "train.attempt1.log =====")
    assert "during start-up" in log.with_name("train.attempt2.log").read_text()
    assert "===== attempt 2" not in kept.read_text()  # the first attempt's copy is untouched


def test_a_job_requeued_as_often_as_allowed_fails_on_the_next_notice_in_one_line(tmp_path):
    proc, _ = _stage(tmp_path, restarts=2, max_requeues="2")
    assert proc.returncode == preemption.CAPPED_EXIT_CODE, proc.stderr
    assert not (tmp_path / "scontrol.calls").exists()  # not requeued
    lines = [line for line in proc.stderr.splitlines() if "DAREL_MAX_REQUEUES" in line]
    assert len(lines) == 1 and "after 2 requeues, the most DAREL_MAX_REQUEUES=2 allows: not requeued" in lines[0]


def test_the_count_comes_from_slurm_where_the_job_step_dropped_the_variable(tmp_path):
    proc, log = _stage(tmp_path, restarts=2, max_requeues="2", restarts_in_env=False)
    assert proc.returncode == preemption.CAPPED_EXIT_CODE, proc.stderr
    assert (tmp_path / "scontrol.calls").read_text() == "show job -o 4242\n"  # asked once, not requeued
    assert log.read_text().splitlines()[0] == ("===== attempt 3 of Slurm job 4242 (requeued 2 times); the earlier "
                                               "attempts' logs: none kept =====")
    assert "after 2 requeues, the most DAREL_MAX_REQUEUES=2 allows: not requeued" in proc.stderr


def test_a_run_beyond_the_cap_stops_before_any_work(tmp_path):
    proc, log = _stage(tmp_path, restarts=4)  # the default cap: 3
    assert proc.returncode == preemption.CAPPED_EXIT_CODE, proc.stderr
    assert "epoch" not in proc.stdout and not (tmp_path / "ckpt.pt").exists()
    assert "Slurm job 4242 was requeued 4 times, more than DAREL_MAX_REQUEUES=3: stopped before any work" in proc.stderr
    assert "more than DAREL_MAX_REQUEUES=3" in log.read_text()


def test_the_requeue_cap_is_a_whole_number_named_when_wrong():
    assert preemption.max_requeues({}) == 3 and preemption.max_requeues({"DAREL_MAX_REQUEUES": "0"}) == 0
    with pytest.raises(SystemExit, match=r"DAREL_MAX_REQUEUES='three': must be a whole number >= 0"):
        preemption.max_requeues({"DAREL_MAX_REQUEUES": "three"})
    assert preemption.requeues_so_far({"SLURM_RESTART_COUNT": "2"}) == 2 and preemption.requeues_so_far({}) == 0
    preemption.check_requeue_cap({"SLURM_RESTART_COUNT": "3"})  # at the cap: this run may still work
    with pytest.raises(preemption.RequeueLimit):
        preemption.check_requeue_cap({"SLURM_RESTART_COUNT": "4"})
