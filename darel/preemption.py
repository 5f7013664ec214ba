"""A preemption notice ends a training at its next epoch boundary, with a checkpoint, and
puts its Slurm job back in the queue, where it resumes from that checkpoint.

The notice is ``SIGURG``, sent by Slurm ``--signal=URG@<grace seconds>`` before a job's
time limit (and, where the cluster sets ``SlurmctldParameters=preempt_send_user_signal``,
when the job is preempted), or by hand with ``scancel --signal=URG <job>``. SIGURG because
every process between Slurm and the training ignores it by default: the two Snakemakes of
a cluster job, the shell of the rule, torchrun. A SIGUSR1 would kill the job's Snakemake
before the training saw it.

On the notice the current epoch is finished, its evaluation included, the checkpoint is
written (darel.epochs), the job is requeued (``scontrol requeue``) and the process ends
with ``EXIT_CODE`` at once, its logs flushed (as on SIGTERM: the energy meter's timer
threads would otherwise keep it alive). The training resumes bit for bit: every epoch is seeded by (seed,
epoch). The grace time must cover the rest of an epoch: the log gives the longest epoch
(checkpoint included) and how long after the notice the checkpoint was written. When the
grace is shorter, Slurm's SIGTERM comes first, the stage stops at once (darel.stagekit.
watchdog), and the training later resumes from its last periodic checkpoint instead.

Torch-free: the in-job Snakemake may import it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from typing import Callable, NoReturn

SIGNAL = signal.SIGURG
EXIT_CODE = 75  # EX_TEMPFAIL: stopped for now, to be resumed

_notice: list[float] = []  # monotonic time of the first notice
_exit: Callable[[int], NoReturn] = os._exit  # tests replace it


def _note(signum: int, frame: object) -> None:
    if not _notice:
        _notice.append(time.monotonic())


def watch() -> bool:
    """Take notices from now on (main thread only; elsewhere the signal keeps its default,
    ignore). True when installed."""
    try:
        signal.signal(SIGNAL, _note)
    except ValueError:
        return False
    return True


def noticed() -> bool:
    return bool(_notice)


def seconds_since_notice() -> float:
    return time.monotonic() - _notice[0] if _notice else 0.0


def agreed(gather: Callable[[object], list] | None = None) -> bool:
    """Whether to stop at this epoch boundary: on every process of a data-parallel run alike
    (``gather``: an all-gather of a Python object; any process's notice counts)."""
    if gather is None:
        return noticed()
    return any(gather(noticed()))


def requeue(job: str | None = None, run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> str:
    """Put this Slurm job back in the queue; returns what happened, in words."""
    job = job if job is not None else os.environ.get("SLURM_JOB_ID")
    if not job:
        return "not in a Slurm job: the next workflow run resumes from it"
    try:
        done = run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"scontrol requeue {job} failed ({err}): the next workflow run resumes from it"
    if done.returncode != 0:
        why = (done.stderr or done.stdout).strip().splitlines()
        return (f"scontrol requeue {job} refused ({why[-1] if why else f'exit {done.returncode}'}; is the job "
                "submitted with --requeue?): the next workflow run resumes from it")
    return f"Slurm job {job} requeued: it resumes from it when it starts again"


def leave(epoch: int, longest_epoch_s: float, checkpoint: object,
          run: Callable[..., subprocess.CompletedProcess] = subprocess.run, main: bool = True,
          sync: Callable[[object], object] | None = None) -> NoReturn:
    """After the checkpoint of ``epoch`` epochs is written: requeue the job (process 0 of a
    data-parallel run; ``sync``, an all-gather, keeps the others until it is done, so that
    torchrun does not stop it half-way), flush the logs, end the process with EXIT_CODE.
    The line is a warning: it reaches the stage's log file and stderr, i.e. the Slurm job's
    log, which keeps every run of a requeued job with ``--open-mode=append``."""
    if main:
        outcome = requeue(run=run)
        logging.getLogger("darel.preemption").warning(
            "preemption notice (SIGURG): checkpoint %s written after %d epochs, %.1f s after the notice (the longest "
            "epoch took %.1f s with its evaluation and checkpoint: the grace time must exceed it); %s", checkpoint,
            epoch, seconds_since_notice(), longest_epoch_s, outcome)
    if sync is not None:
        sync(None)
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    _exit(EXIT_CODE)
