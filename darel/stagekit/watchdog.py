"""A stage's place among processes: one writer per output folder, and no stage running on
after the Snakemake that started it."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from pathlib import Path

from darel.processes import process_alive


_HELD_LOCKS: list = []  # open lock files, held until the process ends


def take_lock(handle) -> str | None:
    """Take the exclusive lock of ``handle`` (a lock file open_lock opened) without waiting
    and write our holder record into it: None. When another process holds it: the handle
    closed, and that process's holder record (what describe_holder and stop_advice read)."""
    import fcntl

    from darel.io import write_lock_record

    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "pid=unknown"
        handle.close()
        return holder
    write_lock_record(handle, holder_record())  # ours now: a plain file holding a lock record
    return None


def holder_record() -> str:
    """Who holds a lock: this PID, its host and, inside a Slurm job, the job id (on a
    cluster a PID alone names no process: the holder may run on another node)."""
    import socket

    parts = [f"pid={os.getpid()}", f"host={socket.gethostname()}"]
    job = os.environ.get("SLURM_JOB_ID")
    if job:
        parts.append(f"slurm_job={job}")
    return " ".join(parts)


def _parse_holder(text: str) -> dict[str, str]:
    """The fields of a holder record; a bare number (an older lock) is a PID."""
    text = text.strip()
    if text.isdigit():
        return {"pid": text}
    return dict(part.split("=", 1) for part in text.split() if "=" in part)


def describe_holder(text: str) -> str:
    """A holder record in words: 'PID 12 on node1 (Slurm job 345)'."""
    fields = _parse_holder(text)
    words = f"PID {fields.get('pid', 'unknown')}"
    if fields.get("host"):
        words += f" on {fields['host']}"
    if fields.get("slurm_job"):
        words += f" (Slurm job {fields['slurm_job']})"
    return words


def stop_advice(text: str) -> str:
    """How to stop the holder: scancel for a Slurm job, kill on its own host otherwise."""
    fields = _parse_holder(text)
    if fields.get("slurm_job"):
        return f"scancel {fields['slurm_job']}"
    pid = fields.get("pid", "<pid>")
    host = fields.get("host")
    return f"kill {pid}" + (f" on {host}" if host else "")


def claim_folder(folder: str | Path, name: str, logger: logging.Logger) -> None:
    """One writer per output: take ``<folder>/.<name>.lock`` (holding this PID, host and
    Slurm job, see holder_record) for the
    rest of the process, or stop with a message naming the process that holds it. Then
    remove the temporary files a killed earlier run of the stage left in the folder."""
    from darel.io import OutputError, check_no_links_out, inside_project, open_lock, remove_stale_temps
    from darel.stagekit.errors import fail

    folder = Path(folder)
    lock = folder / f".{name}.lock"
    try:
        inside_project(folder)
        folder.mkdir(parents=True, exist_ok=True)
        check_no_links_out(folder)
        handle = open_lock(lock)
    except OutputError as err:
        fail(logger, f"{name}: {err}")
    holder = take_lock(handle)
    if holder is not None:
        fail(logger, f"{name}: {folder} is being written by another {name} process ({describe_holder(holder)}); "
                     f"wait for it to finish, or stop it ({stop_advice(holder)}) and run again")
    _HELD_LOCKS.append(handle)
    removed = remove_stale_temps(folder)
    if removed:
        logger.info("removed %d temporary file(s) a killed run left in %s: %s", len(removed), folder,
                    ", ".join(p.name for p in removed))


def _workflow_ancestor() -> int | None:
    """PID of the nearest ancestor process that is Snakemake (None when run by hand)."""
    pid = os.getppid()
    for _ in range(8):
        if pid <= 1:
            return None
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return None
        # "snakemake ..." (an entry-point script run by its interpreter) or "python -m snakemake ..."
        if any(Path(os.fsdecode(part)).name == "snakemake" for part in cmdline[:3]):
            return pid
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return None


def _stop_now(logger: logging.Logger, why: str) -> None:
    """Log ``why``, flush the logs, end the process at once (like the default SIGTERM)."""
    import signal

    logger.error("%s; stopping (an interrupted training resumes from its last checkpoint)", why)
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    os._exit(128 + signal.SIGTERM)


def stop_with_parent(logger: logging.Logger, interval_s: float = 2.0) -> None:
    """A stage whose parent (or the Snakemake that started it) has died stops itself
    instead of running on as an orphan: the kernel sends SIGTERM when the parent exits
    (PR_SET_PDEATHSIG; Snakemake's shell may exec the stage, so the parent is often
    Snakemake itself), and a watchdog thread checks every ``interval_s`` that the parent
    and the nearest Snakemake ancestor are still alive. Either way the log says why the
    stage stopped. Call from the main thread."""
    import signal
    import threading

    parent = os.getppid()
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1
    watched = _workflow_ancestor()
    with contextlib.suppress(ValueError):  # not the main thread: keep the default action
        signal.signal(signal.SIGTERM, lambda signum, frame: _stop_now(
            logger, f"received SIGTERM (parent {parent} {'gone' if os.getppid() != parent else 'alive'})"))

    def watch() -> None:
        while True:
            time.sleep(interval_s)
            if os.getppid() != parent or (watched is not None and not process_alive(watched)):
                _stop_now(logger, f"the workflow that started this stage has ended (parent {parent}, Snakemake "
                                  f"{watched})")

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()
