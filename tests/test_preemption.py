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
