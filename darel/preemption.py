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

Nothing is missed: every stage takes notices from its first line (``darel.stagekit.parser``,
before torch or MLflow is imported), and a training that finds a notice already taken when
its first epoch would start leaves at once, requeued, its checkpoint as it was.

Nothing loops: Slurm counts a job's runs (``SLURM_RESTART_COUNT``, 1 in its first requeued
run; ``Restarts`` of ``scontrol show job`` where a job step did not pass the variable on). A job that has been requeued ``max_requeues()`` times (``DAREL_MAX_REQUEUES`` in the
job's environment, default 3, as submitit's) is not requeued again: the notice then ends it
as a failure in one line (the checkpoint is kept; the next workflow run resumes from it),
and a run started beyond the cap (a requeue by Slurm itself) stops before any work.

Each run's log is kept: a run that leaves on a notice copies its stage's log to a numbered
file beside it (``train.log`` -> ``train.attempt1.log``; Snakemake removes a job's log
before the requeued run starts), and the requeued run's log opens with a line naming the
attempt and the earlier attempts' logs (``attempt_log``).

Torch-free: the in-job Snakemake may import it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, NoReturn

SIGNAL = signal.SIGURG
EXIT_CODE = 75  # EX_TEMPFAIL: stopped for now, to be resumed
CAPPED_EXIT_CODE = 1  # requeued too often: a failure the workflow reports
MAX_REQUEUES_VARIABLE = "DAREL_MAX_REQUEUES"
DEFAULT_MAX_REQUEUES = 3

_notice: list[float] = []  # monotonic time of the first notice
_log_file: list[Path] = []  # this process's stage log (attempt_log)
_restarts: dict[str, int] = {}  # Slurm job id -> its Restarts, as scontrol gave it
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


class RequeueLimit(SystemExit):
    """The job has been requeued as often as allowed; the message says so in one line."""


def max_requeues(environ: dict[str, str] | None = None) -> int:
    """How often a job may be requeued: ``DAREL_MAX_REQUEUES`` (a whole number >= 0), else 3."""
    text = (os.environ if environ is None else environ).get(MAX_REQUEUES_VARIABLE, "").strip()
    if not text:
        return DEFAULT_MAX_REQUEUES
    if not text.isdigit():
        raise SystemExit(f"{MAX_REQUEUES_VARIABLE}={text!r}: must be a whole number >= 0 (how often a preempted "
                         f"job may be requeued; default {DEFAULT_MAX_REQUEUES})")
    return int(text)


def requeues_so_far(environ: dict[str, str] | None = None,
                    run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> int:
    """How often Slurm has requeued this job (0 outside Slurm or in a job's first run):
    SLURM_RESTART_COUNT, or, where it was not passed on (the Slurm plugin's job step drops
    it from the environment of the rules it starts), the ``Restarts`` that ``scontrol show
    job`` gives for SLURM_JOB_ID (asked once per process)."""
    env = os.environ if environ is None else environ
    text = env.get("SLURM_RESTART_COUNT", "").strip()
    if text.isdigit():
        return int(text)
    job = env.get("SLURM_JOB_ID", "").strip()
    if not job.isdigit():
        return 0
    if job not in _restarts:
        try:
            shown = run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True, timeout=60,
                        check=False).stdout
        except (OSError, subprocess.TimeoutExpired):
            shown = ""
        found = re.search(r"\bRestarts=(\d+)", shown or "")
        _restarts[job] = int(found.group(1)) if found else 0
    return _restarts[job]


def check_requeue_cap(environ: dict[str, str] | None = None) -> None:
    """Stop (RequeueLimit, one line) a run of a job requeued more often than allowed: a
    job that keeps being preempted or restarted by Slurm fails instead of looping."""
    done, cap = requeues_so_far(environ), max_requeues(environ)
    if done > cap:
        job = (os.environ if environ is None else environ).get("SLURM_JOB_ID", "?")
        raise RequeueLimit(f"Slurm job {job} was requeued {done} times, more than {MAX_REQUEUES_VARIABLE}={cap}: "
                           "stopped before any work (the checkpoint is kept; the next workflow run resumes from it)")


def attempt_log(path: str | os.PathLike) -> object:
    """A stage's log file, new (as every job's log: Snakemake removes it before the job
    runs), remembered so that a run that leaves on a notice keeps a numbered copy of it
    (``kept_log_path``). In a requeued run its first line names the attempt and the earlier
    attempts' logs. Never written through a link."""
    from darel.io import fresh_file

    _log_file[:] = [Path(path)]
    stream = fresh_file(path)
    done = requeues_so_far()
    if done:
        earlier = [kept_log_path(path, attempt).name for attempt in range(1, done + 1)
                   if kept_log_path(path, attempt).is_file()]
        times = f"{done} time{'s' if done != 1 else ''}"
        stream.write(f"===== attempt {done + 1} of Slurm job {os.environ.get('SLURM_JOB_ID', '?')} (requeued {times}); "
                     f"the earlier attempts' logs: {', '.join(earlier) or 'none kept'} =====\n")
        stream.flush()
    return stream


def kept_log_path(path: str | os.PathLike, attempt: int) -> Path:
    """Where the log of attempt ``attempt`` (1: a job's first run) is kept once it left on a
    notice: ``train.log`` -> ``train.attempt1.log``, beside it (the cell's tracking job
    attaches every ``*.log`` of the cell)."""
    path = Path(path)
    return path.with_name(f"{path.stem}.attempt{attempt}{path.suffix}")


def _keep_log() -> str | None:
    """Copy this run's log (attempt_log) to its numbered name; returns that name, or None."""
    from darel.io import fresh_file

    if not _log_file:
        return None
    source, kept = _log_file[0], kept_log_path(_log_file[0], requeues_so_far() + 1)
    try:
        text = source.read_text(encoding="utf-8", errors="replace")
        with fresh_file(kept) as out:
            out.write(text)
    except OSError:
        return None
    return kept.name


def requeue(job: str | None = None, run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> str:
    """Put this Slurm job back in the queue; returns what happened, in words. A job already
    requeued ``max_requeues()`` times is not: RequeueLimit says so."""
    job = job if job is not None else os.environ.get("SLURM_JOB_ID")
    if not job:
        return "not in a Slurm job: the next workflow run resumes from it"
    done, cap = requeues_so_far(), max_requeues()
    if done >= cap:
        raise RequeueLimit(f"Slurm job {job} took a preemption notice after {done} requeues, the most "
                           f"{MAX_REQUEUES_VARIABLE}={cap} allows: not requeued, it fails (the checkpoint is "
                           "kept; the next workflow run resumes from it)")
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
          sync: Callable[[object], object] | None = None, at_start: bool = False) -> NoReturn:
    """After the checkpoint of ``epoch`` epochs is written (``at_start``: the notice came
    before the first epoch of this run, nothing new was written): requeue the job (process
    0 of a data-parallel run; ``sync``, an all-gather, keeps the others until it is done,
    so that torchrun does not stop it half-way), flush the logs, end the process with
    EXIT_CODE, or CAPPED_EXIT_CODE where the job may not be requeued again.
    The line is a warning: it reaches the stage's log file and stderr, i.e. the Slurm job's
    log, which keeps every run of a requeued job with ``--open-mode=append``."""
    code = EXIT_CODE
    if main:
        log = logging.getLogger("darel.preemption")
        try:
            outcome = requeue(run=run)
        except RequeueLimit as limit:
            outcome, code = str(limit), CAPPED_EXIT_CODE
        level = logging.ERROR if code == CAPPED_EXIT_CODE else logging.WARNING
        if at_start:
            log.log(level, "preemption notice (SIGURG) during start-up, %.1f s ago: left before the first epoch, the "
                        "checkpoint %s as it was (%d epochs); %s", seconds_since_notice(), checkpoint, epoch, outcome)
        else:
            log.log(level, "preemption notice (SIGURG): checkpoint %s written after %d epochs, %.1f s after the notice "
                        "(the longest epoch took %.1f s with its evaluation and checkpoint: the grace time must "
                        "exceed it); %s", checkpoint, epoch, seconds_since_notice(), longest_epoch_s, outcome)
    if sync is not None:
        sync(None)
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if main:
        _keep_log()  # Snakemake removes the job's log before the requeued run starts
    _exit(code)
