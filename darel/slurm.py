"""The workflow on a Slurm cluster (snakemake-executor-plugin-slurm): what the submitting
Snakemake does beyond the plugin.

* ``SIGTERM`` and ``SIGHUP`` (a ``kill``, a closed terminal or SSH session) act like
  Ctrl-C: Snakemake cancels its Slurm jobs (scancel) and frees its lock. Left alone,
  Snakemake would take SIGTERM as "finish the running jobs", which on a cluster can
  mean hours of jobs nobody waits for.
* Every submitted job id is recorded in ``.snakemake/darel-slurm-jobs.tsv`` with the
  submitter's PID, host, process start (boot id and start tick, so a reused PID is
  told apart), user id and run (the uuid the plugin names the job by). A submitter
  killed with ``kill -9`` cannot cancel anything: the next Snakemake started in the
  folder, on any host that shares it and whatever is left to do (from the Snakefile's
  top level; only one that holds the folder's writer lock, darel.preflight.hold_run_lock,
  so no other submitter lives), cancels the jobs of this user's submitters that are
  gone. Gone: a submitter of this host whose PID has ended or now names another
  process; one of another host when no Snakemake of this folder is alive anywhere (the
  shared live-lock, darel.preflight.clear_stale_locks, is free). The folder is a shared
  one, so a record proves nothing by itself: a job id must be digits (scancel gets
  ``--`` before the ids), a record of another user is never acted on, and Slurm must
  confirm each job (squeue) as this user's, run in this project folder under the name
  of the run that recorded it. The file is read and written without following a link
  (a new file under an unpredictable name, renamed into place).
* A job cancelled by hand: Slurm 22.05's sacct reports ``CANCELLED by <uid>``, which the
  plugin (2.8.0) does not recognise as a failure, so it would wait forever. The status
  query reports it as ``CANCELLED`` (one line names the job); see docs/cluster.md.
* A requeued job (preempted, a training that took a preemption notice, ``scontrol
  requeue``): one line names it when the status query first sees its new run.
* Jobs whose time enters a table must name their node type: a ``constraint`` resource
  (``constraint: ""`` when every node is alike), else the run stops before any job.

Nothing here runs on the local executor or inside a job.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import re
import shlex
import signal
import socket
import stat
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

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
    """This submitter as its records name it: PID, host, process start and user id."""
    return f"{os.getpid()}\t{socket.gethostname()}\t{process_start(os.getpid()) or '-'}\t{os.geteuid()}"


def _stderr(line: str) -> None:
    import sys

    print(line, file=sys.stderr, flush=True)


class JobsFileError(RuntimeError):
    """The jobs file is not a plain file of this user's (a link, a FIFO, another's file)."""


# A Slurm job id as sbatch --parsable gives it to the plugin (the plugin submits no arrays
# and no heterogeneous jobs): digits only, so no record can pass an option to scancel.
JOB_ID = re.compile(r"[0-9]{1,18}")
_RECORD_MAX_BYTES = 16 << 20  # far beyond any run's submissions; a larger file is refused


def _read_own(path: Path) -> str | None:
    """The text of the jobs file (None when there is none), read without following a link
    and only when it is a plain file of this user's with no other hard link."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as err:
        what = "a link" if err.errno == errno.ELOOP else f"unreadable ({err.strerror})"
        raise JobsFileError(f"{path} is {what}; its records are left unread and no Slurm job is cancelled: move it "
                            "away and run again") from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        problem = _not_own_plain(info)
        if not problem and info.st_size > _RECORD_MAX_BYTES:
            problem = f"larger than {_RECORD_MAX_BYTES >> 20} MiB"
        if problem:
            raise JobsFileError(f"{path} is {problem}; its records are left unread and no Slurm job is cancelled: "
                                "move it away and run again")
        return handle.read(_RECORD_MAX_BYTES).decode("utf-8", errors="replace")


def _not_own_plain(info: os.stat_result) -> str | None:
    if not stat.S_ISREG(info.st_mode):
        return "not a plain file"
    if info.st_uid != os.geteuid():
        return f"a file of another user (uid {info.st_uid})"
    if info.st_nlink != 1:
        return f"a file with {info.st_nlink} hard links"
    return None


def _remove_stale_temps(path: Path) -> None:
    """The temporary files of ``path`` a killed writer left (``.<name>.<pid>.<random>.tmp``,
    darel.io's form, whose writer PID is gone); plain files only, a link is left alone."""
    from darel.io import is_stale_temp

    prefix = f".{path.name}."
    try:
        names = [name for name in os.listdir(path.parent) if name.startswith(prefix) and name.endswith(".tmp")]
    except OSError:
        return
    for name in names:
        candidate = path.parent / name
        with contextlib.suppress(OSError):
            if stat.S_ISREG(os.lstat(candidate).st_mode) and is_stale_temp(candidate):
                os.unlink(candidate)


def _rewrite(path: Path, lines: list[str]) -> None:
    """Replace the jobs file by ``lines``: a new file under an unpredictable name, created
    exclusively and never through a link (mkstemp), renamed over the old one (a link there
    is replaced, not followed)."""
    import tempfile

    from darel.io import inside_project

    inside_project(path.parent)
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write("".join(f"{line}\n" for line in lines))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def record_submissions(executor_class: Any, path: Path = JOBS_FILE, log: RequeueLog | None = None,
                       say: Callable[[str], None] | None = None) -> None:
    """Record every job the executor submits in ``path``: job id, submitter PID, host,
    process start, user id and the run's uuid (the job name the plugin gives Slurm). The
    requeue log learns what each job runs."""
    original = executor_class.report_job_submission
    if getattr(original, "darel_wrapped", False):
        return
    me = _me()
    log = log or REQUEUES

    def report_job_submission(self, job_info):
        jobid = str(getattr(job_info, "external_jobid", None) or "")
        if JOB_ID.fullmatch(jobid):
            run = str(getattr(self, "run_uuid", "") or "-")
            try:
                _rewrite(path, (_read_own(path) or "").splitlines() + [f"{jobid}\t{me}\t{run}"])
            except (JobsFileError, OSError) as err:  # the job runs; only a kill -9 would leave it uncancelled
                (say or _stderr)(f"Slurm job {jobid} not recorded: {err}")
            job = getattr(job_info, "job", None)
            if job is not None:
                log.names[jobid] = f"{'group' if job.is_group() else 'rule'} {job.name}"
        return original(self, job_info)

    report_job_submission.darel_wrapped = True
    executor_class.report_job_submission = report_job_submission


def alone_here(path: Path = LIVE_LOCK) -> bool:
    """True when no Snakemake started in this folder is alive, on any host that shares it:
    nobody holds the live-lock (call it before this process takes its own share). The
    lock is probed without following a link and never created."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    except OSError as err:
        raise JobsFileError(f"{path} cannot be probed ({err.strerror}); no Slurm job is cancelled") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise JobsFileError(f"{path} is not a plain file; no Slurm job is cancelled")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(fd, fcntl.LOCK_UN)
        return True
    finally:
        os.close(fd)


def submitter_gone(pid: int, host: str, started: str | None, alone: bool, here: str | None = None) -> bool | None:
    """Whether a recorded submitter has ended: True, False, or None (cannot tell: another
    host's, while some Snakemake of the folder is alive). On this host the process itself
    is asked (a live PID that is still the recorded process is never gone); another host's
    submitter is gone only when no Snakemake of the folder is alive anywhere."""
    if host != (here or socket.gethostname()):
        return True if alone else None
    if not process_alive(pid):
        return True
    if started in (None, "-"):
        return alone
    return process_start(pid) != started


class Record:
    """One line of the jobs file."""

    def __init__(self, line: str, jobid: str, pid: int, host: str, started: str | None, uid: int | None,
                 run: str | None):
        self.line, self.jobid, self.pid, self.host = line, jobid, pid, host
        self.started, self.uid, self.run = started, uid, run


def parse_records(text: str, path: Path, say: Callable[[str], None] | None = None) -> list[Record]:
    """The well-formed records of the jobs file; every other line is named (one line in all)
    and dropped. Records of earlier releases (no user id, no run) are read too."""
    records, bad = [], []
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split("\t")
        if len(fields) not in (3, 4, 6) or not JOB_ID.fullmatch(fields[0]) or not fields[1].isdigit() \
                or (len(fields) == 6 and not fields[4].isdigit()):
            if line.strip():
                bad.append((number, fields[0]))
            continue
        started = fields[3] if len(fields) >= 4 else None
        uid = int(fields[4]) if len(fields) == 6 else None
        run = fields[5] if len(fields) == 6 and fields[5] != "-" else None
        records.append(Record(line, fields[0], int(fields[1]), fields[2], started, uid, run))
    if bad and say is not None:
        number, first = bad[0]
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        say(f"{path}: line {number} is not a Slurm job record (job id {first[:40]!r}: only digits are){more}: "
            "ignored and dropped, nothing passed to scancel")
    return records


def orphaned_jobs(path: Path = JOBS_FILE, alone: bool = False, host: str | None = None,
                  say: Callable[[str], None] | None = None) -> tuple[list[Record], list[str]]:
    """(the records of this user's submitters that are gone, the record lines kept). A
    record of another user is never acted on: kept as it is."""
    orphans: list[Record] = []
    kept: list[str] = []
    text = _read_own(path)
    if text is None:
        return orphans, kept
    others = []
    for record in parse_records(text, path, say):
        if record.uid is not None and record.uid != os.geteuid():
            others.append(record)
            kept.append(record.line)
        elif submitter_gone(record.pid, record.host, record.started, alone, host):
            orphans.append(record)
        else:
            kept.append(record.line)
    if others and say is not None:
        say(f"{path}: {len(others)} record(s) of another user (uid {others[0].uid}) left alone; only your own "
            "submitters' jobs are ever cancelled")
    return orphans, kept


def slurm_jobs_of_mine(run: Callable[..., Any]) -> dict[str, tuple[str, str]] | None:
    """This user's jobs Slurm knows now: job id -> (job name, working folder); None when
    squeue cannot be asked (no Slurm client here, or it failed)."""
    command = ["squeue", "--noheader", f"--user={os.geteuid()}", "--format=%i|%j|%Z"]
    try:
        done = run(command, capture_output=True, text=True, check=False, timeout=120)
    except (OSError, subprocess.SubprocessError):
        return None
    if getattr(done, "returncode", 1) != 0:
        return None
    jobs = {}
    for line in (getattr(done, "stdout", "") or "").splitlines():
        fields = line.strip().split("|", 2)
        if len(fields) == 3 and JOB_ID.fullmatch(fields[0]):
            jobs[fields[0]] = (fields[1], fields[2])
    return jobs


def _same_folder(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def cancel_orphans(say: Callable[[str], None], path: Path = JOBS_FILE, alone: bool = False,
                   run: Callable[..., Any] | None = None, project: str | os.PathLike | None = None) -> list[str]:
    """scancel the jobs a killed submitter of this user left, keep the records of live
    submitters and of other users. Slurm itself must confirm each job first: one of this
    user's, still known, run in this project folder, under the name of the run that
    recorded it (the plugin names every job by its run's uuid). Returns the cancelled ids."""
    run = run or subprocess.run
    project = str(project or os.getcwd())
    if _read_own(path) is None:
        return []
    orphans, kept = orphaned_jobs(path, alone, say=say)
    cancel: list[str] = []
    if orphans:
        known = slurm_jobs_of_mine(run)
        if known is None:  # no Slurm client here: keep them for a start where there is one
            ids = ", ".join(r.jobid for r in orphans)
            say(f"{len(orphans)} Slurm job(s) left by a Snakemake that was killed ({ids}) could not be checked "
                "with squeue here; run Snakemake on a host with the Slurm client, or scancel them")
            return []
        foreign = []
        for record in orphans:
            if record.jobid not in known:
                continue  # finished: nothing to cancel
            name, folder = known[record.jobid]
            if _same_folder(folder, project) and (record.run is None or name == record.run):
                cancel.append(record.jobid)
            else:
                foreign.append(record.jobid)
        if foreign:
            say(f"{path}: Slurm job(s) {', '.join(foreign[:5])} are not jobs this workflow submitted here (another "
                "folder or run): not cancelled, records dropped")
        cancel = list(dict.fromkeys(cancel))
    if cancel:
        try:
            done = run(["scancel", "--", *cancel], capture_output=True, text=True, check=False, timeout=120)
        except (OSError, subprocess.SubprocessError) as err:
            say(f"{len(cancel)} Slurm job(s) left by a Snakemake that was killed ({', '.join(cancel)}) could not be "
                f"cancelled here ({err}); run Snakemake on a host with the Slurm client, or scancel them")
            return []
        problem = (getattr(done, "stderr", "") or "").strip().splitlines()
        say(f"cancelled {len(cancel)} Slurm job(s) left by a Snakemake that was killed: {', '.join(cancel)}"
            + (f" (scancel: {problem[-1]})" if problem else ""))
    _rewrite(path, kept)
    return cancel


def cancel_orphans_at_start(workflow: Any, say: Callable[[str], None], path: Path = JOBS_FILE) -> list[str]:
    """From the Snakefile's top level (it runs whatever is left to do, onstart does not),
    in the Snakemake a user started, before it takes its share of the live-lock. Jobs are
    cancelled only by the Snakemake that holds the folder's writer lock (no other one
    that submits can be alive); a dry run says what the run would cancel."""
    from darel import preflight

    if not preflight.is_main_process(workflow):
        return []
    try:
        if _read_own(path) is None:
            return []
        alone = alone_here()
        if not preflight.holds_run_lock():
            orphans, _ = orphaned_jobs(path, alone, say=say)
            if orphans and preflight.is_dry_run(workflow):
                ids = ", ".join(r.jobid for r in orphans)
                say(f"{len(orphans)} Slurm job(s) left by a Snakemake that was killed ({ids}): the next run (not a "
                    "dry run) cancels those Slurm confirms as this workflow's")
            return []
        return cancel_orphans(say, path, alone)
    except (JobsFileError, OSError) as err:
        raise preflight.Refusal(f"{err} (nothing was run)") from None


def forget_mine(path: Path = JOBS_FILE, say: Callable[[str], None] | None = None) -> None:
    """At the end of a run, drop this submitter's records (its jobs are over)."""
    try:
        text = _read_own(path)
        if text is None:
            return
        me = _me().split("\t")
        kept = [r.line for r in parse_records(text, path) if [str(r.pid), r.host] != me[:2]]
        _rewrite(path, kept)
    except (JobsFileError, OSError) as err:
        (say or _stderr)(f"the Slurm job records were left as they are: {err}")


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


# ---- the lab's settings, asked of Slurm before the first submission -----------------------------------

# What a job asks of Slurm, each as the resource that sets it in a profile and the sbatch
# option the plugin makes of it (snakemake-executor-plugin-slurm 2.8's submit string).
SETTINGS = (("account", "slurm_account"), ("partition", "slurm_partition"), ("qos", "qos"),
            ("constraint", "constraint"), ("memory", "mem_mb"), ("memory per CPU", "mem_mb_per_cpu"),
            ("run time", "runtime"), ("GPUs", "gpu"), ("GRES", "gres"), ("CPUs", "threads"),
            ("nodes", "nodes"), ("tasks per node", "tasks_per_node"))  # the last two: srun's ranks


def sbatch_options(job: Any) -> list[tuple[str, str, list[str]]]:
    """(setting, its value, sbatch options) for each setting of ``job`` the plugin passes
    to sbatch."""
    resources = job.resources
    found: list[tuple[str, str, list[str]]] = []

    def given(key: str) -> Any:
        value = resources.get(key)
        if type(value).__name__ == "TBDString":  # known once the job's inputs exist: not asked
            return None
        return value if isinstance(value, (int, str)) and not isinstance(value, bool) else None

    for setting, key in SETTINGS:
        if key == "threads":
            value = getattr(job, "threads", None)
            if isinstance(value, int) and value > 0:
                found.append((setting, str(value), [f"--cpus-per-task={value}"]))
            continue
        value = given(key)
        if value is None or (value == "" and key not in ("constraint", "qos")):
            continue
        if key == "gpu":
            if not value:
                continue
            model = given("gpu_model")
            option = f"--gpus={model}:{value}" if model else f"--gpus={value}"
            found.append((setting, f"{model}:{value}" if model else str(value), [option]))
            continue
        option = {"slurm_account": "--account", "slurm_partition": "--partition", "qos": "--qos",
                  "constraint": "--constraint", "mem_mb": "--mem", "mem_mb_per_cpu": "--mem-per-cpu",
                  "runtime": "--time", "gres": "--gres", "nodes": "--nodes",
                  "tasks_per_node": "--ntasks-per-node"}[key]
        if key == "mem_mb" and given("mem_mb_per_cpu") is not None:
            continue  # the plugin passes --mem-per-cpu alone then
        found.append((setting, str(value), [f"{option}={value}"]))
    return found


def _slurm_said(proc: subprocess.CompletedProcess) -> str:
    """sbatch's refusal in one line: its error lines, without the ``sbatch: error:`` prefixes."""
    text = proc.stderr or proc.stdout or ""
    errors = [re.sub(r"^sbatch:\s*(error:\s*)?", "", line.strip()) for line in text.splitlines() if line.strip()]
    errors = [line for line in errors if line]
    return "; ".join(dict.fromkeys(errors)) or f"sbatch exit {proc.returncode}"


def _test_only(options: list[str], run: Callable[..., subprocess.CompletedProcess]) -> subprocess.CompletedProcess:
    return run(["sbatch", "--test-only", "--job-name=darel-settings-check", *options, "--wrap=true"],
               capture_output=True, text=True, timeout=120, check=False)


def settings_refused(jobs: Any, run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> str | None:
    """Ask Slurm (``sbatch --test-only``, nothing is queued) whether it takes the settings
    of one job of each kind (rule) in ``jobs``; one line naming the first kind refused and
    the setting it refused (found by asking again without each setting in turn), with
    Slurm's words. None when every kind is accepted, or when there is no sbatch to ask."""
    seen: set[str] = set()
    for job in jobs:
        kind = job.rule.name
        if kind in seen:
            continue
        seen.add(kind)
        settings = sbatch_options(job)
        options = [option for _, _, opts in settings for option in opts]
        try:
            proc = _test_only(options, run)
        except FileNotFoundError:
            return None
        except (OSError, subprocess.TimeoutExpired) as err:
            return (f"sbatch --test-only could not be asked about the {kind} jobs' settings ({err}); nothing was "
                    "submitted")
        if proc.returncode == 0:
            continue
        said = _slurm_said(proc)
        culprits = []
        for index, (setting, value, _) in enumerate(settings):
            without = [option for i, (_, _, opts) in enumerate(settings) if i != index for option in opts]
            if _test_only(without, run).returncode == 0:
                culprits.append(f"{setting} {value!r}")
        named = (" or ".join(culprits) if culprits
                 else "settings (" + ", ".join(f"{setting} {value!r}" for setting, value, _ in settings) + ")")
        return (f"Slurm refuses the {kind} jobs' {named}: {said} (sbatch --test-only {' '.join(options)}); "
                "correct it in your cluster profile (README \"A GPU cluster\"); nothing was submitted")
    return None


def settings_problem(workflow: Any, run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> str | None:
    """On the Slurm executor, before the first submission: settings_refused for the jobs
    this run submits (its local jobs run here and ask Slurm nothing)."""
    if executor_name(workflow) != "slurm":
        return None
    jobs = [job for job in workflow.dag.needrun_jobs() if not workflow.is_local(job.rule)]
    return settings_refused(jobs, run)


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

    record_submissions(importlib.import_module(PLUGIN).Executor, say=say)
    return True
