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
ends, however it ends. The folder is a shared one: the lock is opened without following a
link (its own name or its folder's), and only as a plain file of this user's that holds
nothing but a lock record (open_turn_lock). No torch here: the workflow reads this module."""

from __future__ import annotations

import errno
import fcntl
import os
import re
import socket
import stat
import time
from pathlib import Path
from typing import IO, Mapping

from darel.io import LinkError, OutputError, inside_project, lock_record_like, write_lock_record
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
    handle = open_turn_lock(lock_path(environ[LOCK_DIR_ENV], environ))
    began = time.perf_counter()
    fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
    waited = time.perf_counter() - began
    # Who holds it, for a person looking at a stuck run (the lock itself is the flock).
    write_lock_record(handle, str(os.getpid()))
    _held = handle
    return waited


def open_turn_lock(path: Path) -> IO[str]:
    """The turn's lock file, opened for writing only as a plain file of this user's in a
    real folder of this user's: never through a link (the file or its folder), never a
    FIFO or device, never a file of another user or one with other hard links, and never
    truncated unless it holds a lock record (darel.io.lock_record_like). OutputError
    (LinkError for a link) in one line naming it otherwise."""
    folder = path.parent
    inside_project(folder)  # a folder in the project that a link leads out of: LinkError before anything is made
    try:
        folder.mkdir(parents=True, exist_ok=True)
        info = os.lstat(folder)
    except OSError as err:
        raise OutputError(err.errno or errno.EIO, f"cannot make {folder} for the GPU turns: {err.strerror}") from None
    if stat.S_ISLNK(info.st_mode):
        raise LinkError(errno.ELOOP, f"{folder} is a link (to {os.readlink(folder)}); a GPU turn's lock is never "
                                     "opened through a link: remove it and run again (nothing was written)")
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        raise OutputError(errno.EPERM, f"{folder} is not a folder of your own; a GPU turn's lock is never opened "
                                       "there: move it away and run again (nothing was written)")
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # a FIFO opens, and is refused
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise LinkError(errno.ELOOP, f"{path} is a link (to {os.readlink(path)}); a GPU turn's lock is never "
                                         "opened through a link: remove it and run again (nothing was "
                                         "written)") from None
        raise OutputError(err.errno or errno.EIO, f"cannot open {path}: {err.strerror}") from None
    info = os.fstat(fd)
    problem = None
    if not stat.S_ISREG(info.st_mode):
        problem = "is not a plain file"
    elif info.st_nlink != 1:
        problem = f"is a file with {info.st_nlink} hard links"
    elif info.st_uid != os.geteuid():
        problem = f"belongs to another user (uid {info.st_uid})"
    if problem is None:
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        handle = os.fdopen(fd, "r+", encoding="utf-8")
        if lock_record_like(handle.read(4096)):
            return handle
        handle.close()
        problem = "holds something other than a lock record"
    else:
        os.close(fd)
    raise OutputError(errno.EEXIST, f"{path} {problem}; a GPU turn's lock is never written there: move it away and "
                                    "run again (nothing was written)")
