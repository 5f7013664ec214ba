"""A build that records how long it took: `make quick`, `make tables`, `make studies` and
`make test` run their command through

    python -m darel.tools.build_record --target quick --make-started T --load-before L -- CMD ...

which runs CMD as it would run alone (its output, its exit status; one line of its own
after) and, when it succeeds, writes one JSON record under bench/results/durations/ (or
$DAREL_DURATIONS_DIR): ``<UTC start>_<target>_<host id>.json``, written atomically. bench/durations_table.py turns
the records into docs/durations.md; nobody types a figure.

A record holds the command, its start and end (UTC), the wall seconds of the build and,
measured apart, of the environment's install when this make ran it, the commit, the machine
(CPU model, cores, memory, GPUs), the load before and after and the verdict idle or busy
(``busy_rule`` below), and every Snakemake job of the build with its rule and seconds.

Where the job times come from: Snakemake's own metadata (.snakemake/metadata/, one JSON per
output file). Its start is the time Snakemake marked the job's outputs incomplete (when it
launched the job) and its end the output's modification time, both to the microsecond, and
it names the rule: the same record `snakemake --report` draws its runtimes from. A stage's
log under logs/ is the stage's own: its first line comes after the interpreter's start-up
and imports (seconds of a short job), and a stage that fails may write no last line;
Snakemake's text log under .snakemake/log/ gives whole seconds to be parsed back out of
prose; no rule of this workflow has a `benchmark:` file. A job belongs to this build when
Snakemake started it inside the build's window.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import platform
import re
import resource
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from darel import io

FORMAT = 1
RECORD_DIR = Path("bench/results/durations")
DIR_VARIABLE = "DAREL_DURATIONS_DIR"

# The verdict idle/busy. The 1-minute load average is read when make starts, before this
# build's own install or jobs add to it; the other processes' share of the CPU is measured
# over the build itself (from /proc/stat, less this build's own CPU time), so a job that
# starts beside the build half-way is seen too.
BUSY_LOAD_PER_CORE = 0.5
BUSY_OTHERS_SHARE = 0.25
BUSY_RULE = (f"busy when the 1-minute load average before make started exceeds {BUSY_LOAD_PER_CORE} per core, "
             f"or when other processes used more than {BUSY_OTHERS_SHARE:.0%} of the machine's CPU time during "
             "the build; idle otherwise")

REQUIRED = ("format", "target", "command", "started_utc", "ended_utc", "build_s", "install_s", "wall_s",
            "commit", "machine", "load", "jobs")


# ---- the machine ---------------------------------------------------------------------------

def cpu_model(cpuinfo: str) -> str | None:
    """The processor's name in /proc/cpuinfo's text (x86's `model name`, else an ARM board's
    `Hardware` or `Processor` line); None when the text names none."""
    for key in ("model name", "Hardware", "Processor"):
        found = re.search(rf"^{key}\s*:\s*(.+?)\s*$", cpuinfo, flags=re.MULTILINE)
        if found:
            return found.group(1)
    return None


def memory_bytes(meminfo: str) -> int | None:
    """MemTotal of /proc/meminfo's text, in bytes; None when absent."""
    found = re.search(r"^MemTotal:\s*(\d+)\s*kB", meminfo, flags=re.MULTILINE)
    return int(found.group(1)) * 1024 if found else None


def _read(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def gpus() -> list[str]:
    """The NVIDIA GPUs NVML sees, each as `name, N GiB`; [] without nvidia-ml-py, driver or GPU."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no library, no driver, no device: all mean no GPU to name
        return []
    try:
        found = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            name = name.decode() if isinstance(name, bytes) else name
            gib = pynvml.nvmlDeviceGetMemoryInfo(handle).total / 2**30
            found.append(f"{name}, {gib:.0f} GiB")
        return found
    finally:
        pynvml.nvmlShutdown()


def describe_machine() -> dict:
    """This machine: CPU model, logical cores (all, and those this process may use), memory,
    GPUs, operating system."""
    memory = memory_bytes(_read("/proc/meminfo"))
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "cpu": cpu_model(_read("/proc/cpuinfo")) or platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "usable_cores": usable,
        "memory_gib": round(memory / 2**30, 1) if memory else None,
        "gpus": gpus(),
        "os": f"{platform.system()} {platform.release()}",
        "host_id": host_id(),
    }


def host_id() -> str:
    """Eight hex digits standing for this machine (a hash of /etc/machine-id, else of the host
    name): records of one machine group together without publishing its name."""
    seed = _read("/etc/machine-id").strip() or socket.gethostname()
    return hashlib.sha256(seed.encode()).hexdigest()[:8]


# ---- the load ------------------------------------------------------------------------------

def cpu_seconds(stat: str) -> tuple[float, float] | None:
    """(busy, total) CPU seconds of all cores from /proc/stat's `cpu` line (busy: everything
    but idle and iowait); None without that line."""
    found = re.search(r"^cpu\s+(.+)$", stat, flags=re.MULTILINE)
    if not found:
        return None
    ticks = [int(value) for value in found.group(1).split()[:8]]  # guest time is inside user time
    per_second = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
    return (sum(ticks) - idle) / per_second, sum(ticks) / per_second


def others_share(before: tuple[float, float] | None, after: tuple[float, float] | None,
                 own_cpu_s: float) -> float | None:
    """The share of the machine's CPU time that processes other than this build used between
    two /proc/stat readings, given the build's own CPU seconds; None without the readings."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    others = max(0.0, (after[0] - before[0]) - own_cpu_s)
    return round(min(1.0, others / (after[1] - before[1])), 3)


def load_verdict(load_before: float | None, others: float | None, cores: int) -> str:
    """idle or busy by BUSY_RULE; a figure that was not measured does not count."""
    if load_before is not None and load_before / cores > BUSY_LOAD_PER_CORE:
        return "busy"
    if others is not None and others > BUSY_OTHERS_SHARE:
        return "busy"
    return "idle"


# ---- Snakemake's own job records -------------------------------------------------------------

def _output_name(relative: Path) -> str:
    """The output path a metadata file stands for (its path is the output's urlsafe base64,
    cut into folders whose names start with @)."""
    text = "".join(part.lstrip("@") for part in relative.parts)
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()
    except ValueError:
        return str(relative)


def snakemake_jobs(workdir: Path, since: float, until: float) -> list[dict]:
    """The jobs Snakemake started in ``workdir`` between ``since`` and ``until`` (Unix
    seconds), oldest first: rule, first output, start (seconds after ``since``) and seconds.
    One job with several outputs has one metadata file per output; they share the rule and
    Snakemake's job hash, and the job runs from the earliest start to the latest end."""
    folder = workdir / ".snakemake" / "metadata"
    jobs: dict[tuple, dict] = {}
    for path in sorted(folder.rglob("*")) if folder.is_dir() else []:
        if not path.is_file() or path.stat().st_mtime < since:  # written before the build
            continue
        try:
            meta = json.loads(path.read_text(encoding="utf-8"))
            start, end, rule = float(meta["starttime"]), float(meta["endtime"]), str(meta["rule"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a record Snakemake is writing or another version's: not this build's job
        if meta.get("incomplete") or not since <= start <= until:
            continue
        key = (rule, meta.get("job_hash"), meta.get("shellcmd"))
        job = jobs.setdefault(key, {"rule": rule, "output": _output_name(path.relative_to(folder)),
                                    "start": start, "end": end})
        job["start"], job["end"] = min(job["start"], start), max(job["end"], end)
    ordered = sorted(jobs.values(), key=lambda j: (j["start"], j["rule"]))
    return [{"rule": j["rule"], "output": j["output"], "start_s": round(j["start"] - since, 3),
             "seconds": round(max(0.0, j["end"] - j["start"]), 3)} for j in ordered]


# ---- the record ----------------------------------------------------------------------------

def utc(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def git_commit(workdir: Path) -> dict:
    """The commit checked out in ``workdir`` and whether tracked files differ from it;
    nulls outside a git repository."""
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=workdir, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "--short=7", "HEAD")
    changes = git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"commit": commit, "changed": None if changes is None else bool(changes)}


def install_seconds(stamp: Path, make_started: float | None, folder: Path) -> float | None:
    """Seconds this make spent creating and installing the environment: from make's start to
    the install stamp (the file the install touches when it ends), when the stamp is newer
    than the start; None when the install was done before, or when another record of the
    same make (`make quick tables`) has counted it."""
    if make_started is None or not stamp.exists() or stamp.stat().st_mtime < make_started:
        return None
    for path in folder.glob("*.json") if folder.is_dir() else []:
        try:
            other = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if other.get("make_started") == make_started and other.get("install_s") is not None:
            return None
    return round(stamp.stat().st_mtime - make_started, 1)


def build_record(*, target: str, argv: list[str], make_started: float | None, started: float, ended: float,
                 install_s: float | None, commit: dict, machine: dict, load_before: float | None,
                 load_after: float | None, others: float | None, jobs: list[dict] | None) -> dict:
    """The record of one build (no I/O): every field bench/durations_table.py reads."""
    build_s = round(ended - started, 1)
    cores = machine.get("cores") or 1
    return {
        "format": FORMAT,
        "target": target,
        "command": f"make {target}",
        "argv": argv,
        "make_started": make_started,
        "started_utc": utc(started if install_s is None else make_started),
        "build_started_utc": utc(started),
        "ended_utc": utc(ended),
        "build_s": build_s,
        "install_s": install_s,
        "wall_s": round(build_s + (install_s or 0.0), 1),
        "commit": commit["commit"],
        "changed": commit["changed"],
        "machine": machine,
        "load": {
            "verdict": load_verdict(load_before, others, cores),
            "rule": BUSY_RULE,
            "load1_before": load_before,
            "load1_after": None if load_after is None else round(load_after, 2),
            "others_cpu_share": others,
        },
        "jobs": jobs,
    }


def record_path(folder: Path, record: dict) -> Path:
    stamp = record["started_utc"].replace("-", "").replace(":", "")
    return folder / f"{stamp}_{record['target']}_{record['machine']['host_id']}.json"


def read_records(folder: Path) -> list[dict]:
    """Every record in ``folder``, oldest first, each with its file name under ``file``;
    ValueError naming the file and the fields a record lacks."""
    records = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as err:
            raise ValueError(f"{path}: not a build record ({err})") from None
        if not isinstance(record, dict):
            raise ValueError(f"{path}: not a build record (a JSON {type(record).__name__}, not an object)")
        missing = [name for name in REQUIRED if name not in record]
        if missing:
            raise ValueError(f"{path}: a build record lacks {', '.join(missing)}")
        if record["format"] != FORMAT:
            raise ValueError(f"{path}: format {record['format']!r}, this code reads format {FORMAT}")
        records.append({**record, "file": path.name})
    return sorted(records, key=lambda r: r["started_utc"])


# ---- running one build ---------------------------------------------------------------------

def run_command(argv: list[str]) -> tuple[int, float]:
    """Run ``argv`` in the foreground and return its exit status (128 + signal when a signal
    ended it, as a shell reports it) and the CPU seconds it and its descendants used. Ctrl-C
    reaches the command from the terminal, so here it only waits; a TERM is passed on."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    child = subprocess.Popen(argv)
    previous = {signal.SIGINT: signal.signal(signal.SIGINT, signal.SIG_IGN),
                signal.SIGTERM: signal.signal(signal.SIGTERM, lambda signum, frame: child.terminate())}
    try:
        status = child.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    own = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return (128 - status if status < 0 else status), own


def _number(text: str) -> float | None:
    """A figure the Makefile passes; empty (the Makefile's Python could not tell) is None."""
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        raise SystemExit(f"build_record: {text!r} is not a number") from None


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m darel.tools.build_record",
                                     description="Run a build command and record how long it took.")
    parser.add_argument("--target", required=True, help="the make target (names the record)")
    parser.add_argument("--make-started", default="", help="Unix seconds when make began (empty: unknown)")
    parser.add_argument("--load-before", default="", help="the 1-minute load average when make began")
    parser.add_argument("--install-stamp", type=Path, default=None,
                        help="the file the install touches when it ends (the Makefile's .venv/.installed)")
    parser.add_argument("--no-jobs", action="store_true", help="the command is not a Snakemake build")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    args = parser.parse_args(argv)
    args.command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not args.command:
        parser.error("no command to run after --")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", args.target):
        parser.error(f"--target {args.target!r}: letters, digits, _ . - only (it names a file)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    make_started, load_before = _number(args.make_started), _number(args.load_before)
    workdir = Path.cwd()
    folder = Path(os.environ.get(DIR_VARIABLE) or RECORD_DIR)
    stat_before, started = cpu_seconds(_read("/proc/stat")), time.time()
    status, own_cpu = run_command(args.command)
    ended, stat_after = time.time(), cpu_seconds(_read("/proc/stat"))
    if status != 0:
        print(f"build_record: make {args.target} failed ({status}); no duration recorded", file=sys.stderr)
        return status
    record = build_record(
        target=args.target, argv=args.command, make_started=make_started, started=started, ended=ended,
        install_s=install_seconds(args.install_stamp, make_started, folder) if args.install_stamp else None, commit=git_commit(workdir),
        machine=describe_machine(), load_before=load_before,
        load_after=os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        others=others_share(stat_before, stat_after, own_cpu),
        jobs=None if args.no_jobs else snakemake_jobs(workdir, started, ended))
    path = record_path(folder, record)
    io.write_json(path, record)
    install = "" if record["install_s"] is None else f", {record['install_s'] / 60:.1f} min of it the install"
    print(f"build_record: make {args.target} took {record['wall_s'] / 60:.1f} min{install} "
          f"({record['load']['verdict']}); recorded in {path} (docs/durations.md: "
          "python bench/durations_table.py > docs/durations.md)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
