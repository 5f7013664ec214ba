"""The workflow on a Slurm cluster (snakemake-executor-plugin-slurm): what the submitting
Snakemake does beyond the plugin.

* ``SIGTERM`` and ``SIGHUP`` (a ``kill``, a closed terminal or SSH session) act like
  Ctrl-C: Snakemake cancels its Slurm jobs (scancel) and frees its lock. Left alone,
  Snakemake would take SIGTERM as "finish the running jobs", which on a cluster can
  mean hours of jobs nobody waits for.
* Every submitted job id is recorded in ``.snakemake/darel-slurm-jobs.tsv`` with the
  submitter's PID and host; a submitter killed with ``kill -9`` cannot cancel anything,
  so the next Snakemake started here cancels the jobs of a submitter that is gone.
* A job cancelled by hand: Slurm 22.05's sacct reports ``CANCELLED by <uid>``, which the
  plugin (2.8.0) does not recognise as a failure, so it would wait forever. The status
  query is wrapped to report ``CANCELLED`` (one line names the job); see
  docs/deviations.md.

Nothing here runs on the local executor or inside a job.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from pathlib import Path
from typing import Any, Callable

from darel.processes import process_alive

JOBS_FILE = Path(".snakemake/darel-slurm-jobs.tsv")
PLUGIN = "snakemake_executor_plugin_slurm"


def normalise_states(states: dict[str, str], say: Callable[[str], None] | None = None) -> dict[str, str]:
    """sacct's states as the plugin expects them: ``CANCELLED by 0`` becomes ``CANCELLED``
    (every other state unchanged); each rewritten job is named in one line."""
    fixed = {}
    for job, state in states.items():
        if state.startswith("CANCELLED") and state != "CANCELLED":
            if say is not None:
                say(f"Slurm job {job} was cancelled ({state}): reported to Snakemake as CANCELLED")
            state = "CANCELLED"
        fixed[job] = state
    return fixed


def wrap_status_query(query: Callable) -> Callable:
    """The plugin's async status query, with its states normalised (idempotent)."""
    if getattr(query, "darel_wrapped", False):
        return query

    async def query_job_status(command: str, logger: Any):
        states, duration = await query(command, logger)
        if states is not None:
            states = normalise_states(states, logger.warning)
        return states, duration

    query_job_status.darel_wrapped = True
    return query_job_status


def install_status_fix() -> bool:
    """Wrap the plugin's status query where the plugin is installed; True when done."""
    try:
        import importlib

        plugin = importlib.import_module(PLUGIN)
    except ImportError:
        return False
    plugin.query_job_status = wrap_status_query(plugin.query_job_status)
    return True


# ---- the submitter's signals -------------------------------------------------------------------

def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def stop_like_ctrl_c() -> None:
    """SIGTERM and SIGHUP raise KeyboardInterrupt in the main thread, as Ctrl-C does: the
    scheduler then cancels its jobs (scancel) and Snakemake frees its lock. Call it after
    Snakemake installed its own SIGTERM handler (from ``onstart``)."""
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _interrupt)


# ---- the jobs of a killed submitter --------------------------------------------------------------

def record_submissions(executor_class: Any, path: Path = JOBS_FILE) -> None:
    """Append every job the executor submits to ``path``: job id, submitter PID, host."""
    original = executor_class.report_job_submission
    if getattr(original, "darel_wrapped", False):
        return
    me = f"{os.getpid()}\t{socket.gethostname()}"

    def report_job_submission(self, job_info):
        jobid = getattr(job_info, "external_jobid", None)
        if jobid:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a", encoding="utf-8") as out:
                out.write(f"{jobid}\t{me}\n")
        return original(self, job_info)

    report_job_submission.darel_wrapped = True
    executor_class.report_job_submission = report_job_submission


def orphaned_jobs(path: Path = JOBS_FILE, host: str | None = None) -> tuple[list[str], list[str]]:
    """(job ids whose submitter on this host is gone, the lines still owned by a live one)."""
    host = host or socket.gethostname()
    orphans, kept = [], []
    if not path.exists():
        return orphans, kept
    for line in path.read_text(encoding="utf-8").splitlines():
        fields = line.split("\t")
        if len(fields) != 3 or not fields[1].isdigit():
            continue
        jobid, pid, where = fields
        if where == host and not process_alive(int(pid)):
            orphans.append(jobid)
        else:
            kept.append(line)
    return orphans, kept


def cancel_orphans(say: Callable[[str], None], path: Path = JOBS_FILE,
                   run: Callable[..., Any] = subprocess.run) -> list[str]:
    """scancel the jobs a killed submitter left (those Slurm still knows; scancel ignores
    finished ones), keep the records of live submitters. Returns the cancelled ids."""
    orphans, kept = orphaned_jobs(path)
    if orphans:
        run(["scancel", *orphans], capture_output=True, text=True, check=False)
        say(f"cancelled {len(orphans)} Slurm job(s) left by a Snakemake that was killed: {', '.join(orphans)}")
    if path.exists():
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(f"{line}\n" for line in kept), encoding="utf-8")
        tmp.replace(path)
    return orphans


def forget_mine(path: Path = JOBS_FILE) -> None:
    """At the end of a run, drop this submitter's records (its jobs are over)."""
    if not path.exists():
        return
    me = f"\t{os.getpid()}\t{socket.gethostname()}"
    kept = [line for line in path.read_text(encoding="utf-8").splitlines() if not line.endswith(me)]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(f"{line}\n" for line in kept), encoding="utf-8")
    tmp.replace(path)


def executor_name(workflow: Any) -> str | None:
    """The name of the executor this Snakemake submits with (None when unknown)."""
    settings = getattr(workflow, "executor_plugin", None)
    return getattr(settings, "name", None)


def prepare(workflow: Any, say: Callable[[str], None]) -> bool:
    """In the submitting Snakemake on the Slurm executor: the status fix, the record of
    submissions, and the jobs of a killed submitter cancelled. True when it applied."""
    if executor_name(workflow) != "slurm":
        return False
    install_status_fix()
    import importlib

    record_submissions(importlib.import_module(PLUGIN).Executor)
    dry = bool(getattr(getattr(workflow, "output_settings", None), "dryrun", False))
    if not dry:
        cancel_orphans(say)
    return True
