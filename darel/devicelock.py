"""Turns on one GPU: a job holds the device from the moment it first puts something on it
until it exits, while the next job starts up beside it.

On the GPU profile most of a job's wall time is its start (the interpreter, torch,
MLflow's store, the energy tracker: bench/README.md "On a GPU"). When Snakemake may start
two GPU jobs at once (the resource ``gpu_queue``, workflow/rules/common.smk), the
second one does all of that while the first trains, and waits here for the device. The
lock is what keeps every timed interval, memory peak and energy reading one job's alone:
a waiting job has made no CUDA context and put nothing on the device.

The lock is an exclusive ``flock`` on a file in the folder named by ``LOCK_DIR_ENV``
(set by the workflow only for profiles with ``device_turns``). Its name holds the host,
the Slurm job (when there is one) and ``CUDA_VISIBLE_DEVICES``, so jobs share a lock
exactly when they see the same GPUs from the same allocation: a cluster job, whose GPUs
are its own, never waits for another. The operating system releases it when the process
ends, however it ends. No torch here: the workflow reads this module."""

from __future__ import annotations

import fcntl
import os
import re
import socket
import time
from pathlib import Path
from typing import IO, Mapping

from darel.io import flock_held as is_held  # noqa: F401  (whether a turn is held now)

LOCK_DIR_ENV = "DAREL_DEVICE_LOCK_DIR"
# How a stage log says it (bench/gpu_turns.py reads it back).
WAIT_MESSAGE = "the GPU is this job's after a wait of %.2f s for its turn"

# The open lock file of this process: kept open (so locked) until the process exits.
_held: IO[str] | None = None


def lock_path(folder: str | os.PathLike, environ: Mapping[str, str] = os.environ) -> Path:
    """The lock of the GPUs this process sees, in ``folder``."""
    parts = (socket.gethostname(), environ.get("SLURM_JOB_ID") or "local",
             environ.get("CUDA_VISIBLE_DEVICES") or "all")
    name = "-".join(re.sub(r"[^A-Za-z0-9_.,]+", "_", part) for part in parts)
    return Path(folder) / f"device-{name}.lock"


def turns_on(device_type: str, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether this process must take a turn: a CUDA device, the workflow asked for turns,
    and it is not a second process of a torchrun job (those use GPUs 1.. of the job's own;
    process 0 takes the turn for GPU 0)."""
    if device_type != "cuda" or not environ.get(LOCK_DIR_ENV):
        return False
    return int(environ.get("LOCAL_RANK") or 0) == 0


def take_turn(device_type: str, environ: Mapping[str, str] = os.environ) -> float | None:
    """Wait until this process holds the GPU, and keep it until the process exits. Returns
    the seconds waited, or None when no turn applies (turns_on). A second call returns 0."""
    global _held
    if not turns_on(device_type, environ):
        return None
    if _held is not None:
        return 0.0
    path = lock_path(environ[LOCK_DIR_ENV], environ)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = open(path, "a+")
    began = time.perf_counter()
    fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
    waited = time.perf_counter() - began
    # Who holds it, for a person looking at a stuck run (the lock itself is the flock).
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    _held = handle
    return waited
