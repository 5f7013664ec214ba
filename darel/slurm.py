"""The workflow on a Slurm cluster (snakemake-executor-plugin-slurm): what the submitting
Snakemake does beyond the plugin.

* ``SIGTERM`` and ``SIGHUP`` (a ``kill``, a closed terminal or SSH session) act like
  Ctrl-C: Snakemake cancels its Slurm jobs (scancel) and frees its lock. Left alone,
  Snakemake would take SIGTERM as "finish the running jobs", which on a cluster can
  mean hours of jobs nobody waits for.
* Every submitted job id is recorded in ``.snakemake/darel-slurm-jobs.tsv`` with the
  submitter's PID, host and process start (boot id and start tick, so a reused PID is
  told apart). A submitter killed with ``kill -9`` cannot cancel anything: the next
  Snakemake started in the folder, on any host that shares it and whatever is left to
  do (from the Snakefile's top level, dry runs excepted), cancels the jobs of every
  submitter that is gone. Gone: no Snakemake of this folder is alive anywhere (the
  shared live-lock, darel.preflight.clear_stale_locks, is free), or, while one is, a
  submitter of this host whose PID has ended or now names another process. A submitter
  of another host is left alone while any Snakemake of the folder runs.
* A job cancelled by hand: Slurm 22.05's sacct reports ``CANCELLED by <uid>``, which the
  plugin (2.8.0) does not recognise as a failure, so it would wait forever. The status
  query reports it as ``CANCELLED`` (one line names the job); see docs/deviations.md.
* A requeued job (preempted, a training that took a preemption notice, ``scontrol
  requeue``): one line names it when the status query first sees its new run.
* Jobs whose time enters a table must name their node type: a ``constraint`` resource
  (``constraint: ""`` when every node is alike), else the run stops before any job.

Nothing here runs on the local executor or inside a job.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

from darel.io import flock_held
from darel.processes import process_alive

JOBS_FILE = Path(".snakemake/darel-slurm-jobs.tsv")
LIVE_LOCK = Path(".snakemake/darel.live")  # held (shared) by every Snakemake a user started here: darel.preflight
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


PENDING_AGAIN = ("PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED")


class RequeueLog:
    """One line per new run of a job: sacct (with ``--duplicates``) lists a requeued job's
    earlier runs as rows of their own; squeue only shows it pending again."""

    def __init__(self) -> None:
        self.runs: dict[str, int] = {}
        self.states: dict[str, str] = {}
        self.names: dict[str, str] = {}  # job id -> what it runs (from the submissions)

    def update(self, rows: list[tuple[str, str]], say: Callable[[str], None]) -> dict[str, str]:
        """The current state per job (its newest row), saying which jobs were requeued."""
        rows_of: dict[str, int] = {}
        states: dict[str, str] = {}
        for job, state in rows:
            rows_of[job] = rows_of.get(job, 0) + 1
            states[job] = state
        for job, state in states.items():
            known = self.runs.get(job, 1)
            pending_again = self.states.get(job) == "RUNNING" and state in PENDING_AGAIN
            run = max(rows_of[job], known + 1 if pending_again else known)
            if run > known:
                what = f" ({self.names[job]})" if job in self.names else ""
                say(f"Slurm job {job}{what} was requeued (run {run}: preempted, a preemption notice, or scontrol "
                    "requeue); Snakemake waits for it, and its training resumes from its checkpoint")
            self.runs[job], self.states[job] = run, state
        return states


REQUEUES = RequeueLog()


def with_duplicates(command: str) -> str:
    """The plugin's sacct status command with every run of a job (a requeued one has several)."""
    words = shlex.split(command)
    if words and Path(words[0]).name == "sacct" and "--duplicates" not in words and "-D" not in words:
        words.insert(1, "--duplicates")
    return shlex.join(words)


async def _rows(command: str, timeout_s: float = 60) -> list[tuple[str, str]] | None:
    """``<job id>|<state>`` rows of a status command, in its order (None when it failed)."""
    try:
        process = await asyncio.create_subprocess_exec(*shlex.split(command), stdout=asyncio.subprocess.PIPE,
                                                       stderr=asyncio.subprocess.PIPE)
        out, _ = await asyncio.wait_for(process.communicate(), timeout=timeout_s)
    except (OSError, asyncio.TimeoutError):
        return None
    if process.returncode != 0:
        return None
    rows = []
    for line in out.decode(errors="replace").splitlines():
        fields = line.split("|")
        if len(fields) >= 2 and fields[0].strip():
            rows.append((fields[0].strip(), fields[1].strip()))
    return rows


def wrap_status_query(query: Callable, log: RequeueLog | None = None) -> Callable:
    """The plugin's async status query with its states normalised and requeues said
    (idempotent). sacct is asked for every run of each job (``--duplicates``)."""
    if getattr(query, "darel_wrapped", False):
        return query
    log = log or REQUEUES

    async def query_job_status(command: str, logger: Any):
        started = time.time()
        rows = await _rows(with_duplicates(command))
        if rows is None:  # the plugin's own query: its messages, its retries
            states, duration = await query(command, logger)
            if states is None:
                return states, duration
            rows = list(states.items())
        else:
            duration = time.time() - started
        states = log.update(rows, logger.warning)
        return normalise_states(states, logger.warning), duration

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

def process_start(pid: int) -> str | None:
    """Which process ``pid`` is: ``<boot id>:<start tick>`` (None when it has ended). A PID
    reused by another process, or after a reboot, gives another value."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        tick = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None
    return f"{boot}:{tick}"


def _me() -> str:
    return f"{os.getpid()}\t{socket.gethostname()}\t{process_start(os.getpid()) or '-'}"


def record_submissions(executor_class: Any, path: Path = JOBS_FILE, log: RequeueLog | None = None) -> None:
    """Append every job the executor submits to ``path``: job id, submitter PID, host and
    process start. The requeue log learns what each job runs."""
    original = executor_class.report_job_submission
    if getattr(original, "darel_wrapped", False):
        return
    me = _me()
    log = log or REQUEUES

    def report_job_submission(self, job_info):
        jobid = getattr(job_info, "external_jobid", None)
        if jobid:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a", encoding="utf-8") as out:
                out.write(f"{jobid}\t{me}\n")
            job = getattr(job_info, "job", None)
            if job is not None:
                log.names[str(jobid)] = f"{'group' if job.is_group() else 'rule'} {job.name}"
        return original(self, job_info)

    report_job_submission.darel_wrapped = True
    executor_class.report_job_submission = report_job_submission


def alone_here(path: Path = LIVE_LOCK) -> bool:
    """True when no Snakemake started in this folder is alive, on any host that shares it:
    nobody holds the live-lock (call it before this process takes its own share)."""
    return not path.exists() or not flock_held(path)


def submitter_gone(pid: int, host: str, started: str | None, alone: bool, here: str | None = None) -> bool | None:
    """Whether a recorded submitter has ended: True, False, or None (cannot tell: another
    host's, while some Snakemake of the folder is alive)."""
    if alone:
        return True
    if host != (here or socket.gethostname()):
        return None
    if not process_alive(pid):
        return True
    return started not in (None, "-") and process_start(pid) != started


def orphaned_jobs(path: Path = JOBS_FILE, alone: bool = False,
                  host: str | None = None) -> tuple[list[str], list[str]]:
    """(job ids whose submitter is gone, the record lines kept). Records of an earlier
    release (no process start) are judged by PID and host alone."""
    orphans, kept = [], []
    if not path.exists():
        return orphans, kept
    for line in path.read_text(encoding="utf-8").splitlines():
        fields = line.split("\t")
        if len(fields) not in (3, 4) or not fields[0].strip() or not fields[1].isdigit():
            continue
        jobid, pid, where = fields[:3]
        started = fields[3] if len(fields) == 4 else None
        if submitter_gone(int(pid), where, started, alone, host):
            orphans.append(jobid)
        else:
            kept.append(line)
    return orphans, kept


def _rewrite(path: Path, lines: list[str]) -> None:
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    tmp.replace(path)


def cancel_orphans(say: Callable[[str], None], path: Path = JOBS_FILE, alone: bool = False,
                   run: Callable[..., Any] | None = None) -> list[str]:
    """scancel the jobs a killed submitter left (those Slurm still knows; scancel ignores
    finished ones), keep the records of live submitters. Returns the cancelled ids."""
    run = run or subprocess.run
    orphans, kept = orphaned_jobs(path, alone)
    if orphans:
        try:
            done = run(["scancel", *orphans], capture_output=True, text=True, check=False)
        except OSError as err:  # no Slurm client here: keep them for a start where there is one
            say(f"{len(orphans)} Slurm job(s) left by a Snakemake that was killed ({', '.join(orphans)}) could not be "
                f"cancelled here ({err}); run Snakemake on a host with the Slurm client, or scancel them")
            return []
        problem = (getattr(done, "stderr", "") or "").strip().splitlines()
        say(f"cancelled {len(orphans)} Slurm job(s) left by a Snakemake that was killed: {', '.join(orphans)}"
            + (f" (scancel: {problem[-1]})" if problem else ""))
    if path.exists():
        _rewrite(path, kept)
    return orphans


def cancel_orphans_at_start(workflow: Any, say: Callable[[str], None], path: Path = JOBS_FILE) -> list[str]:
    """From the Snakefile's top level (it runs whatever is left to do, onstart does not),
    in the Snakemake a user started, before it takes its share of the live-lock."""
    from darel import preflight

    if not preflight.is_main_process(workflow) or not path.exists():
        return []
    alone = alone_here()
    if preflight.is_dry_run(workflow):
        orphans, _ = orphaned_jobs(path, alone)
        if orphans:
            say(f"{len(orphans)} Slurm job(s) left by a Snakemake that was killed ({', '.join(orphans)}): the next run "
                "(not a dry run) cancels them")
        return []
    return cancel_orphans(say, path, alone)


def forget_mine(path: Path = JOBS_FILE) -> None:
    """At the end of a run, drop this submitter's records (its jobs are over)."""
    if not path.exists():
        return
    me = _me().split("\t")
    kept = [line for line in path.read_text(encoding="utf-8").splitlines() if line.split("\t")[1:3] != me[:2]]
    _rewrite(path, kept)


# ---- what timed jobs ask for -------------------------------------------------------------------------

def unpinned_timed_jobs(jobs: Any) -> list[str]:
    """The rules of timed jobs (resource ``timed``) with no ``constraint`` resource."""
    missing = set()
    for job in jobs:
        resources = job.resources
        if resources.get("timed") and resources.get("constraint") is None:
            missing.add(job.rule.name)
    return sorted(missing)


def timed_jobs_problem(workflow: Any) -> str | None:
    """One line when jobs whose time enters a table do not name their node type."""
    if executor_name(workflow) != "slurm":
        return None
    missing = unpinned_timed_jobs(workflow.dag.needrun_jobs())
    if not missing:
        return None
    return (f"jobs whose time enters a table ({', '.join(missing)}) name no node type: set `constraint` under "
            "default-resources in your cluster profile (a node feature; `sinfo -o \"%P %f\"` lists them), or "
            "`constraint: \"\"` if every node of the partition is of one type (README \"A GPU cluster\"; nothing "
            "was submitted)")


def executor_name(workflow: Any) -> str | None:
    """The name of the executor this Snakemake submits with (None when unknown)."""
    settings = getattr(workflow, "executor_plugin", None)
    return getattr(settings, "name", None)


def prepare(workflow: Any, say: Callable[[str], None]) -> bool:
    """In the submitting Snakemake on the Slurm executor: the status fix and requeue log,
    and the record of submissions. True when it applied."""
    if executor_name(workflow) != "slurm":
        return False
    install_status_fix()
    import importlib

    record_submissions(importlib.import_module(PLUGIN).Executor)
    return True
