"""Checks the Snakefile runs before any job, so that problems are named in one line
instead of surfacing as a failed job, a traceback or a silent gap in a table.

* ``check_data``: the active profile's data set is whole (meta.json and both array
  files): a damaged file is re-created identical to its record, with an old mtime so
  nothing re-runs; a dry run only says what it would do.
* ``hold_run_lock``: one Snakemake that can write works in a folder at a time: it holds
  an exclusive kernel lock on ``.snakemake/darel.run`` for its lifetime, and a second one
  stops in one line naming the first, before it builds its DAG (so before Snakemake's own
  clean-up could remove the first one's locks). Dry runs and the other reading modes
  (``--summary``, ``--list-*``, ``--dag``, ``--lint``) only read and are let through.
* ``check_snakemake_folder`` (first of all): ``.snakemake/`` holds only plain files and
  folders of this user's, links never followed: Snakemake and this workflow write their
  locks, logs, metadata, incomplete markers, device turns and Slurm job records through
  the names found there, so a link, a FIFO, a device, a file with other hard links or a
  file of another user (a lab's shared folder) stops the run in one line naming it. The
  log file Snakemake opened through a link before the Snakefile ran is closed and, when
  it is the empty one it made, removed.
* ``ignore_sealed_incomplete`` (last): an incomplete marker over an output a sealed record
  vouches for (``vouching_record``) is removed in one line, so ``rerun-incomplete`` does
  not throw finished work away; a job really interrupted keeps its marker and re-runs.
* ``check_links``: no link in ``data/`` (but ``data/raw``), ``runs/``, ``results/``,
  ``logs/``, ``mlartifacts/`` or at the store's files leads out of the project; a job
  would write through it (darel.io.inside_project stops each writer too).
* ``clear_stale_locks``: the locks a killed Snakemake left (Snakemake itself would stop
  with a LockException until ``--unlock``) are removed when no other Snakemake works in
  this folder; every Snakemake of this workflow holds a shared lock on
  ``.snakemake/darel.live`` for its lifetime, and the kernel drops it when the process
  dies, even by kill -9. ``.snakemake/locks`` is opened without following a link, and
  only plain files of this user's in it are removed.
* ``rebuild_missing``: an intermediate file missing under an existing table is made
  again with everything that depends on it (Snakemake alone would say "Nothing to be
  done": it only rebuilds a missing intermediate when something downstream must run).
* ``announce_raw_inputs`` / ``check_device``: what a profile needs from outside (an
  archive to download, a CUDA GPU) is said before the job list, and a download that
  fails stops the run in one line.

The per-table file lists (``table1_files`` and the like) are every file a table is made
from; the table rules take them as inputs, and tests compare them with Snakemake's own
``--summary`` of the DAG.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import sys
from pathlib import Path
from typing import Any, Callable, Iterable

from darel import config as dconfig
from darel.layout import Layout

_SAID: set[str] = set()
_REPAIRED_HERE: set[str] = set()  # data files check_data re-creates (or would): not rebuilt by their job


def say(line: str, key: str | None = None) -> None:
    """One line on stderr, once per process (input functions may be evaluated repeatedly)."""
    key = key or line
    if key not in _SAID:
        _SAID.add(key)
        print(line, file=sys.stderr, flush=True)


def is_main_process(workflow: Any) -> bool:
    """True for the Snakemake a user started (not one that runs a single job for an executor)."""
    from snakemake_interface_executor_plugins.settings import ExecMode

    return getattr(workflow, "exec_mode", ExecMode.DEFAULT) == ExecMode.DEFAULT


def is_dry_run(workflow: Any) -> bool:
    settings = getattr(workflow, "output_settings", None)
    return bool(getattr(settings, "dryrun", False))


# ---- the data set ----------------------------------------------------------------------------

def check_data(cfg: dict, layout: Layout, workflow: Any, raw: str = "data/raw") -> None:
    """Repair the active profile's damaged data files before the DAG is built (or, in a dry
    run, say which would be repaired); ConfigError when they cannot be re-created here."""
    from darel.data import DataUnavailable, repair_dataset

    dry = is_dry_run(workflow)
    try:
        repaired = repair_dataset(layout.data, dconfig.dataset_params(cfg), raw, dry_run=dry)
    except DataUnavailable as err:
        raise dconfig.ConfigError(str(err)) from None
    for name in repaired:
        _REPAIRED_HERE.add(layout.data_file(name))
        verb = "would be re-created (not in a dry run)" if dry else "re-created"
        say(f"{layout.data_file(name)} was damaged or missing: {verb} identical to what the data stage wrote, "
            "so nothing that depends on it re-runs")


# ---- one writing Snakemake per folder ------------------------------------------------------------

# Snakemake options that only read (the DAG, summaries, lists): never refused.
READING_OPTIONS = ("-n", "--dry-run", "--dryrun", "--summary", "-S", "--detailed-summary", "-D", "--list", "-l",
                   "--list-rules", "--list-target-rules", "--lt", "--dag", "--rulegraph", "--filegraph", "--d3dag",
                   "--lint", "--list-changes", "--lc", "--list-input-changes", "--li", "--list-params-changes", "--lp",
                   "--list-code-changes", "--list-untracked", "--lu", "--print-compilation", "--compile")


class Refusal(RuntimeError):
    """The workflow refuses to start; the message is one line saying why and what to do."""


def reads_only(workflow: Any, argv: list[str] | None = None) -> bool:
    """A dry run or a Snakemake mode that only reads (summary, lists, graphs, lint)."""
    if is_dry_run(workflow):
        return True
    args = sys.argv[1:] if argv is None else argv
    for arg in args:
        if arg in READING_OPTIONS or (arg.startswith("-") and not arg.startswith("--") and len(arg) > 2
                                      and "n" in arg[1:] and arg[1:].isalpha()):  # -pn, -np
            return True
    return False


def hold_run_lock(workflow: Any, folder: str | os.PathLike = ".snakemake") -> bool:
    """Take the folder's writer lock for the life of this Snakemake (True), or raise
    Refusal naming the Snakemake that holds it. Dry runs and reading modes take none
    (False); neither do the Snakemakes an executor starts for single jobs."""
    from darel.io import OutputError, open_lock
    from darel.stagekit.watchdog import describe_holder, stop_advice, take_lock

    if not is_main_process(workflow) or reads_only(workflow) or _RUN:
        return False
    try:
        handle = open_lock(Path(folder) / "darel.run")
    except OutputError as err:
        raise Refusal(str(err)) from None
    holder = take_lock(handle)
    if holder is not None:
        raise Refusal(f"another Snakemake ({describe_holder(holder)}) is working in this folder: wait for it to end, "
                      f"or stop it ({stop_advice(holder)}); a dry run (snakemake -n) may run beside it "
                      "(nothing was run)")
    _RUN.append(handle)
    return True


_RUN: list = []  # the writer lock, held for the life of this Snakemake


# ---- links out of the project ----------------------------------------------------------------------

WRITTEN_FOLDERS = ("data", "runs", "results", "logs", "mlartifacts")
READ_ONLY_INPUTS = ("data/raw",)  # the user's archives: may be links to wherever they keep them


def check_links(store_files: Iterable[str | os.PathLike] = (), root: str | os.PathLike = ".") -> None:
    """Refuse (Refusal, one line naming the first link and counting the others) a link in
    a folder the workflow writes, or at the store's files, that leads out of the project."""
    from darel.io import OutputError, inside_project

    root = Path(root)
    skip = {os.path.normpath(root / name) for name in READ_ONLY_INPUTS}
    found: list[str] = []

    def judge(path: Path) -> None:
        try:
            inside_project(path, root)
        except OutputError as err:
            found.append(str(err))

    judge(root / ".snakemake")  # Snakemake's own records (its shadow folders may hold links inside)
    for name in WRITTEN_FOLDERS:
        top = root / name
        judge(top)
        if top.is_symlink() or not top.is_dir():
            continue
        for folder, dirs, files in os.walk(top):
            dirs[:] = [d for d in dirs if os.path.normpath(os.path.join(folder, d)) not in skip]
            for entry in dirs + files:
                path = Path(folder) / entry
                if path.is_symlink():
                    judge(path)
    for path in store_files:
        judge(Path(path))
    if found:
        more = f" (and {len(found) - 1} more link(s) leading out)" if len(found) > 1 else ""
        raise Refusal(found[0] + more)


# ---- Snakemake's own folder ---------------------------------------------------------------------------

SNAKEMAKE_FOLDER = ".snakemake"


def _odd_entry(path: Path, info: os.stat_result, uid: int) -> str | None:
    """Why an entry of .snakemake is not a plain file or folder of this user's (None when it is)."""
    mode = info.st_mode
    if stat.S_ISLNK(mode):
        try:
            return f"{path} is a link (to {os.readlink(path)})"
        except OSError:
            return f"{path} is a link"
    kinds = ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a device"),
             (stat.S_ISBLK, "a device"))
    for test, kind in kinds:
        if test(mode):
            return f"{path} is {kind}"
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        return f"{path} is neither a plain file nor a folder"
    if info.st_uid != uid:
        return f"{path} belongs to another user (uid {info.st_uid})"
    if stat.S_ISREG(mode) and info.st_nlink != 1:
        return f"{path} is a file with {info.st_nlink} hard links"  # one may be a file of the user's elsewhere
    return None


def snakemake_folder_problems(folder: str | os.PathLike = SNAKEMAKE_FOLDER) -> list[str]:
    """Every entry of ``folder`` (itself included; links never followed) that is a link, a
    FIFO, a socket, a device, a file with other hard links, or a file or folder of another
    user: Snakemake and this workflow write its records there through plain ``open``."""
    folder = Path(folder)
    uid = os.geteuid()
    try:
        top = os.lstat(folder)
    except FileNotFoundError:
        return []
    problem = _odd_entry(folder, top, uid)
    if problem or not stat.S_ISDIR(top.st_mode):
        return [problem or f"{folder} is not a folder"]
    found: list[str] = []
    pending = [folder]
    while pending:
        current = pending.pop()
        try:
            entries = sorted(os.scandir(current), key=lambda e: e.name)
        except OSError as err:
            found.append(f"{current} cannot be read ({err.strerror})")
            continue
        for entry in entries:
            path = Path(entry.path)
            try:
                info = entry.stat(follow_symlinks=False)
            except FileNotFoundError:  # gone meanwhile (a dry run beside a live Snakemake)
                continue
            problem = _odd_entry(path, info, uid)
            if problem:
                found.append(problem)
            elif stat.S_ISDIR(info.st_mode):
                pending.append(path)
    return found


def _detach_outside_logs(workflow: Any) -> str:
    """Snakemake opens its log in .snakemake/log before any workflow code runs: where that
    leads out of the project, stop writing it, and remove the file if it is the empty one
    this process just created there (never a file it did not make). Returns a note for
    the refusal line ("" when nothing led out)."""
    from darel.io import OutputError, inside_project

    manager = getattr(workflow, "logger_manager", None)
    handlers = getattr(manager, "logfile_handlers", None)
    if not isinstance(handlers, dict):
        return ""
    notes = []
    for handler, logfile in list(handlers.items()):
        try:
            inside_project(logfile)
            continue
        except OutputError:
            pass
        stream = getattr(handler, "stream", None)
        try:
            opened = os.fstat(stream.fileno()) if stream is not None else None
        except (OSError, ValueError):
            opened = None
        for owner in (getattr(manager, "logger", None), getattr(getattr(manager, "queue_listener", None), "handlers",
                                                                None)):
            if hasattr(owner, "removeHandler"):
                owner.removeHandler(handler)
        handler.close()
        del handlers[handler]
        try:
            found = os.lstat(logfile)
        except OSError:
            continue
        ours = (opened is not None and (found.st_dev, found.st_ino) == (opened.st_dev, opened.st_ino)
                and stat.S_ISREG(found.st_mode) and found.st_uid == os.geteuid() and found.st_size == 0)
        if ours:
            with contextlib.suppress(OSError):
                os.unlink(logfile)
                notes.append("the empty log file Snakemake opened through it was removed")
        else:
            notes.append(f"Snakemake's log {logfile} was closed unwritten")
    return f" ({'; '.join(notes)})" if notes else ""


def check_snakemake_folder(workflow: Any, folder: str | os.PathLike = SNAKEMAKE_FOLDER) -> None:
    """Refuse (Refusal, one line naming the first odd entry and counting the others) to
    run with anything in .snakemake/ but plain files and folders of this user's: Snakemake
    writes its locks, logs, metadata and incomplete markers there, and this workflow its
    locks, device turns and Slurm job records, all through the names found there. Called
    first of all, before anything writes in .snakemake/ (only Snakemake's own log file is
    opened before the Snakefile runs)."""
    if not is_main_process(workflow):
        return
    found = snakemake_folder_problems(folder)
    if not found:
        return
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    note = _detach_outside_logs(workflow)
    raise Refusal(f"{found[0]}{more}; {folder}/ may hold only plain files and folders of your own (Snakemake "
                  f"writes through them): move it away and run again{note} (nothing was run)")


def holds_run_lock() -> bool:
    """Whether this Snakemake holds the folder's writer lock (hold_run_lock): then no other
    Snakemake that writes is alive in this folder, on any host that shares it."""
    return bool(_RUN)


# ---- incomplete markers over finished outputs ---------------------------------------------------------

INCOMPLETE_FOLDER = Path(SNAKEMAKE_FOLDER) / "incomplete"
_RECORD_READ_LIMIT = 64 << 20  # a sibling record larger than this vouches for nothing (never read)


def _marker_output(relative: Path) -> str | None:
    """The output a marker of Snakemake's file persistence stands for (the urlsafe base64 of
    its path, split into folders whose names start with '@' when longer than a file name);
    None for anything else."""
    import base64
    import binascii

    *folders, name = relative.parts
    if not all(part.startswith("@") for part in folders) or name.startswith("@"):
        return None
    try:
        return base64.urlsafe_b64decode("".join(part[1:] for part in folders) + name).decode("utf-8")
    except (binascii.Error, ValueError):
        return None


def _regular(path: Path, limit: int | None = None) -> bool:
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(info.st_mode) and (limit is None or info.st_size <= limit)


def _sealed_records(folder: Path) -> Iterable[tuple[Path, dict]]:
    from darel import provenance

    try:
        names = sorted(entry.name for entry in os.scandir(folder) if entry.name.endswith(".json"))
    except OSError:
        return
    for name in names:
        path = folder / name
        if not _regular(path, _RECORD_READ_LIMIT):
            continue
        try:
            yield path, provenance.read_record(path)
        except Exception:  # noqa: BLE001 - unreadable, unsealed or misplaced: it vouches for nothing
            continue


def vouching_record(output: str | os.PathLike) -> str | None:
    """The sealed record that says ``output`` is finished, or None. A sealed JSON record or
    .npz archive vouches for itself; a folder for its sealed record of every file it holds
    (provenance.check_folder); any other file (model weights, generated text) for a sealed
    record beside it that holds its sha256 (train.json's ``model_sha256``). Links and
    anything but plain files and folders vouch for nothing."""
    from darel import provenance
    from darel.io import OutputError, file_sha256, inside_project

    path = Path(output)
    try:
        inside_project(path)
        info = os.lstat(path)
    except (OSError, OutputError):
        return None
    try:
        if stat.S_ISDIR(info.st_mode):
            for record, _ in _sealed_records(path):
                try:
                    provenance.check_folder(path, record.name)
                    return str(record)
                except Exception:  # noqa: BLE001
                    continue
            return None
        if not stat.S_ISREG(info.st_mode):
            return None
        if path.suffix == ".json":
            provenance.read_record(path)
            return str(path)
        if path.suffix == ".npz":
            provenance.read_sealed_npz(path)
            return str(path)
        digest = file_sha256(path)
        for record, content in _sealed_records(path.parent):
            if record != path and any(key.endswith("sha256") and value == digest for key, value in content.items()):
                return str(record)
    except Exception:  # noqa: BLE001 - damaged, unsealed, unreadable: not finished, the job re-runs
        return None
    return None


def ignore_sealed_incomplete(workflow: Any, folder: str | os.PathLike = INCOMPLETE_FOLDER) -> list[str]:
    """Remove the incomplete markers (``rerun-incomplete`` re-runs every job behind one) that
    lie over outputs a sealed record vouches for (vouching_record): a job really
    interrupted leaves its outputs missing (Snakemake deletes them before a job starts) or
    unsealed, and keeps its marker. Only in the Snakemake that holds the writer lock; a
    dry run says what the run would ignore. Returns the outputs whose markers went."""
    if not is_main_process(workflow):
        return []
    folder = Path(folder)
    try:
        if not stat.S_ISDIR(os.lstat(folder).st_mode):
            return []
    except OSError:
        return []
    sealed: list[tuple[Path, str, str]] = []
    for current, _, files in os.walk(folder):
        for name in sorted(files):
            marker = Path(current) / name
            output = _marker_output(marker.relative_to(folder))
            if not output or Path(output).is_absolute() or ".." in Path(output).parts or not _regular(marker):
                continue
            record = vouching_record(output)
            if record:
                sealed.append((marker, output, record))
    if not sealed:
        return []
    act = holds_run_lock()
    removed = []
    for marker, output, _ in sealed:
        if act:
            with contextlib.suppress(FileNotFoundError):
                marker.unlink()
        removed.append(output)
    _, first, record = sealed[0]
    more = f" (and {len(sealed) - 1} more)" if len(sealed) > 1 else ""
    verb = "ignored: marker removed" if act else "the next run (not a dry run) ignores it"
    say(f"{first}{more}: marked incomplete in {folder}/ while {record} vouches that it is finished; {verb} (a job "
        "really interrupted leaves its outputs missing or unsealed, and re-runs)", key="incomplete")
    return removed if act else []


def store_files(cfg: dict) -> list[str]:
    """The files of the MLflow store the jobs write: an SQLite database and its lock."""
    from darel.tracking import lock_path_for

    lock = lock_path_for(cfg["tracking"]["uri"])
    return [] if lock is None else [str(lock.with_name(lock.name[: -len(".lock")])), str(lock)]


# ---- stale Snakemake locks ---------------------------------------------------------------------

_LIVE: list = []  # the open lock file, held for the life of this Snakemake


def _open_own_folder(path: Path) -> int | None:
    """A file descriptor of the folder ``path``, opened without following a link (None when
    it does not exist); Refusal when it is a link or not a folder of this user's."""
    import errno
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENOTDIR):
            what = f"a link (to {os.readlink(path)})" if os.path.islink(path) else "not a folder"
            raise Refusal(f"{path} is {what}; nothing in it is removed: move it away and run again (nothing was "
                          "run)") from None
        raise Refusal(f"{path} cannot be opened ({err.strerror}); nothing was run") from None
    info = os.fstat(fd)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        os.close(fd)
        raise Refusal(f"{path} belongs to another user (uid {info.st_uid}); nothing in it is removed: move it away "
                      "and run again (nothing was run)")
    return fd


def _plain_files(directory: int, suffix: str) -> list[str]:
    """The names of the plain files of this user's ending in ``suffix`` in the open folder."""
    names = []
    for name in sorted(os.listdir(directory)):
        if not name.endswith(suffix):
            continue
        try:
            info = os.stat(name, dir_fd=directory, follow_symlinks=False)
        except FileNotFoundError:
            continue
        if stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid():
            names.append(name)
    return names


def clear_stale_locks(workflow: Any, folder: str | os.PathLike = ".snakemake") -> list[str]:
    """Remove Snakemake's locks when no other Snakemake of this workflow is alive here;
    then hold the shared live-lock until this process ends. Returns the removed files."""
    if not is_main_process(workflow) or _LIVE:
        return []
    from darel.io import OutputError, open_lock

    folder = Path(folder)
    try:
        handle = open_lock(folder / "darel.live")
    except OutputError as err:
        raise Refusal(str(err)) from None
    removed: list[str] = []
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pass  # another Snakemake runs here: its locks are live, Snakemake's own check applies
    else:
        locks = folder / "locks"
        try:
            directory = _open_own_folder(locks)
        except Refusal:
            handle.close()
            raise
        try:
            stale = _plain_files(directory, ".lock") if directory is not None else []
            if stale and is_dry_run(workflow):
                say(f"{len(stale)} lock file(s) in {locks} were left by a Snakemake that was killed; the next run (not "
                    "a dry run) removes them")
            elif stale:
                for name in stale:  # relative to the folder opened without following a link
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(name, dir_fd=directory)
                removed = [str(locks / name) for name in stale]
                say(f"removed {len(stale)} lock file(s) in {locks} left by a Snakemake that was killed (no other "
                    "Snakemake is running in this folder)")
        finally:
            if directory is not None:
                os.close(directory)
    fcntl.flock(handle.fileno(), fcntl.LOCK_SH)  # converts the exclusive lock, or waits for none
    _LIVE.append(handle)
    return removed


# ---- missing intermediates -----------------------------------------------------------------------

def built_cells(table: str, profile: str) -> set[tuple[str, int, str]] | None:
    """(model, seed, cell) of every row the existing ``table`` CSV holds for ``profile`` (a
    row's ``seeds`` when it averages several, else its ``seed``); None when the table cannot
    be read or lacks those columns (then every cell counts as built)."""
    import csv

    try:
        with open(table, newline="", encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle))
    except (OSError, UnicodeDecodeError, csv.Error):
        return None
    if not rows or not {"model", "cell", "profile"} <= set(rows[0]) or not ({"seed", "seeds"} & set(rows[0])):
        return None
    found: set[tuple[str, int, str]] = set()
    try:
        for row in rows:
            if row["profile"] == profile:
                seeds = (row.get("seeds") or row.get("seed") or "").split()
                found.update((row["model"], int(float(seed)), row["cell"]) for seed in seeds)
    except ValueError:
        return None
    return found


def new_cell_files(cells: dict[tuple[str, int, str], list[str]], built: set[tuple[str, int, str]] | None) -> set[str]:
    """The files only cells that the existing table does not hold yet are made from
    (``cells``: (model, seed, cell) -> its files). Missing, they are a new cell's results to
    build, not a damage to repair."""
    if built is None:
        return set()
    old = {str(f) for key, files in cells.items() if key in built for f in files}
    return {str(f) for key, files in cells.items() if key not in built for f in files} - old


def rebuild_missing(workflow: Any, table: str, files: Iterable[str], new_files: Iterable[str] = (),
                    new_cells: Iterable[str] = ()) -> list[str]:
    """Under an existing ``table``, force the jobs that write the missing ``files``
    (called from the table rule's input function, while Snakemake builds its DAG); the
    jobs downstream of them follow, the table last. Files only new cells are made from
    (``new_files``; ``new_cells`` names those cells) are not forced: the table's own list of
    cells changed, so Snakemake plans them as results to build, and that is said instead.
    Returns the missing files that are forced."""
    if not is_main_process(workflow) or not Path(table).exists():
        return []
    new_files = {str(f) for f in new_files}
    new_cells = list(new_cells)
    if new_cells:
        shown = ", ".join(new_cells[:4]) + (f" and {len(new_cells) - 4} more" if len(new_cells) > 4 else "")
        verb = "would be built (dry run)" if is_dry_run(workflow) else "are built"
        say(f"{table}: {len(new_cells)} new cell(s), not in the table yet ({shown}): {verb} like any result not made "
            "yet, then the table; no cell already in it re-runs", key=f"new:{table}")
    missing = sorted({str(f) for f in files if not Path(f).exists() and str(f) not in _REPAIRED_HERE
                      and str(f) not in new_files})
    if not missing:
        return []
    workflow.dag.forcefiles.update(missing)
    shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
    verb = "would re-create (dry run)" if is_dry_run(workflow) else "re-creating"
    say(f"{table}: {len(missing)} of the files it is made from are missing ({shown}); {verb} them and what depends "
        "on them", key=f"missing:{table}")
    return missing


def _data_files(layout: Layout) -> list[str]:
    return [layout.data_file(name) for name in ("train.npz", "test.npz", "meta.json")]


def _table1_cell_files(cfg: dict, layout: Layout, model: str, seed: int, cell: str) -> list[str]:
    run = lambda name, cell=cell, model=model: layout.table1(name, model=model, seed=seed, cell=cell)  # noqa: E731
    files = [run(name) for name in ("model.pt", "train.json", "eval.json", "carbon.json", "mlflow.json")]
    files.append(layout.table1_cell(model=model, seed=seed, cell=cell))
    if cell != dconfig.TABLE1_BASELINE:
        files += [layout.table1_settings(model=model, seed=seed, cell=cell), run("subset.npz"),
                  run("train.json", cell=dconfig.TABLE1_BASELINE)]
        scorer = dconfig.scorer_of(cfg, model)
        if cell != dconfig.IDS_ADONIS:
            files += [run(name, cell=dconfig.TABLE1_BASELINE, model=scorer)
                      for name in ("losses.npz", "model.pt", "train.json")]
        else:
            files += [run(name, cell=dconfig.TABLE1_BASELINE) for name in ("model.pt", "train.json")]
    return files


def table1_files(cfg: dict, layout: Layout) -> list[str]:
    """Every file results/table1.csv is made from, in a stable order without repeats."""
    files = _data_files(layout)
    for model, seed, cell in dconfig.table1_cells(cfg):
        files += _table1_cell_files(cfg, layout, model, seed, cell)
    return list(dict.fromkeys(files))


def table1_new_cells(cfg: dict, layout: Layout, table: str = "results/table1.csv") -> tuple[list[str], set[str]]:
    """The Table 1 cells of the active profile that the existing ``table`` does not hold
    yet ("<model>/s<seed>/<cell>"), and the files only they are made from."""
    cells = {(model, seed, cell): _table1_cell_files(cfg, layout, model, seed, cell)
             for model, seed, cell in dconfig.table1_cells(cfg)}
    built = built_cells(table, cfg["profile"]) if Path(table).exists() else None
    if built is None:
        return [], set()
    return [f"{m}/s{s}/{c}" for m, s, c in cells if (m, s, c) not in built], new_cell_files(cells, built)


def study_table1_files(cfg: dict, layout: Layout) -> list[str]:
    """Every file results/study_table1.csv is made from: the baselines' Table 1 cells, each
    method's run with the inputs it takes from Table 1 (DAREL's own Table 1 cells when the
    study's schedule rule is Table 1's), and the scorer's records its reports charge."""
    files = _data_files(layout)
    own_darel = not dconfig.study_trains_darel(cfg)
    for model, seed, cell, method in dconfig.study_table1_cells(cfg):
        files += _table1_cell_files(cfg, layout, model, seed, dconfig.TABLE1_BASELINE)
        if method == "darel" and own_darel:
            files += _table1_cell_files(cfg, layout, model, seed, cell)
            continue
        t1 = lambda name, cell=cell, model=model: layout.table1(name, model=model, seed=seed, cell=cell)  # noqa: E731
        scorer = [t1(name, cell=dconfig.TABLE1_BASELINE, model=dconfig.scorer_of(cfg, model))
                  for name in ("losses.npz", "model.pt", "train.json")]
        files += [*method_inputs(layout, model, seed, cell, method).values(), *scorer]
        study = lambda name: layout.study(name, model=model, seed=seed, cell=cell, method=method)  # noqa: E731
        files += [study(name) for name in ("model.pt", "train.json", "plan.json", "eval.json", "carbon.json",
                                           "mlflow.json")]
        files.append(layout.study_cell(model=model, seed=seed, cell=cell, method=method))
    files += [layout.baseline_fit(model=model, seed=seed) for model, seed in dconfig.study_fit_baselines(cfg)]
    return list(dict.fromkeys(files))


def method_inputs(layout: Layout, model: object, seed: object, cell: object, method: str) -> dict[str, str]:
    """What a study method's training reads besides the data: the cell's calibration and its
    training set (DAREL's offline subset, one the study draws, none for all data)."""
    from darel import methods

    t1 = lambda name: layout.table1(name, model=model, seed=seed, cell=cell)  # noqa: E731
    found = {"calibration": t1("calibration.json")}
    subset = methods.of_run(method).subset
    if subset == methods.SCORER_SUBSET:
        found["subset"] = t1("subset.npz")
    elif subset != methods.FULL_DATA:
        found["subset"] = layout.study_subset(subset, model=model, seed=seed, cell=cell)
    return found


def _nlg_cell_files(cfg: dict, layout: Layout, table: str, model: str, seed: int, cell: str) -> list[str]:
    dataset = cfg[table]["dataset"]
    shared = lambda name: layout.nlg_shared(name, dataset=dataset)  # noqa: E731
    files = [layout.nlg_data(name, dataset=dataset) for name in ("train.jsonl", "dev.jsonl", "test.jsonl",
                                                                  "test_refs.txt", "meta.json")]
    files += [shared("tokenizer"), shared(f"{model}/pretrained")]
    run = lambda name: layout.nlg_run(name, table=table, model=model, seed=seed, cell=cell)  # noqa: E731
    files += [run(name) for name in ("adapter", "hyps.txt", "eval.json", "carbon.json", "mlflow.json")]
    files.append(layout.nlg_cell(table=table, model=model, seed=seed, cell=cell))
    if cell != dconfig.NLG_BASELINE and dconfig.split_nlg_cell(cell)[1] != "random":
        scorer = cfg["nlg"]["scorer"]
        files += [shared("scorer_losses.npz"), shared(f"{scorer}/pretrained")]
        if scorer in cfg[table]["models"]:  # the scorer's batches grow to the memory its fine-tuning measured
            files += _nlg_cell_files(cfg, layout, table, scorer, dconfig.seeds(cfg)[0], dconfig.NLG_BASELINE)
    return files


def nlg_table_files(cfg: dict, layout: Layout, table: str) -> list[str]:
    files: list[str] = []
    for model, seed, cell in dconfig.nlg_cells(cfg, table):
        files += _nlg_cell_files(cfg, layout, table, model, seed, cell)
    return list(dict.fromkeys(files))


def study_nlg_files(cfg: dict, layout: Layout, table: str) -> list[str]:
    files: list[str] = []
    for model, seed, cell in dconfig.study_nlg_cells(cfg, table):
        files += _nlg_cell_files(cfg, layout, table, model, seed, cell)
    return list(dict.fromkeys(files))


# ---- what a profile needs from outside ----------------------------------------------------------

def announce_raw_inputs(cfg: dict, layout: Layout, workflow: Any, raw: str = "data/raw",
                        fetch: Callable[[str], Any] | None = None) -> list[str]:
    """Called when the data set must be built: for a data set downloaded from the network
    (CIFAR-100), say which archive is missing and from where it comes; in a real run fetch
    it now, so that a network failure stops the run in one line before any job."""
    from darel import data

    params = dconfig.dataset_params(cfg)
    if params["dataset"] != "cifar100":
        return []
    archive = Path(raw) / data.CIFAR100_ARCHIVE_NAME
    if archive.is_file() and (Path(layout.data) / data.META_FILE).exists():
        return []
    if not os.path.lexists(archive):  # a FIFO or a device there is refused by the fetch, in one line, unread
        say(f"missing input: {archive} (CIFAR-100, {data.CIFAR100_URL}, MD5 {data.CIFAR100_MD5}); "
            + ("the download job fetches it (or put the file in "
               f"{Path(raw).resolve()}/)" if is_dry_run(workflow) else "downloading it now"))
    if is_dry_run(workflow) or not is_main_process(workflow):
        return [str(archive)]
    try:
        (fetch or (lambda folder: data.fetch_cifar100(folder, progress=True)))(raw)
    except data.DataUnavailable as err:
        sys.exit(str(err))
    return [str(archive)]


def announce_nlg_inputs(cfg: dict, dataset: str, workflow: Any, raw: str = "data/raw") -> list[str]:
    """The official E2E / WebNLG release a paper-profile language table downloads, and the
    hub weights it loads: said before the job list when absent here."""
    params = dconfig.nlg_data_params(cfg, dataset)
    if params["synthetic"]:
        return []
    from darel.nlg import readers

    url, name = ((readers.E2E_URL, readers.E2E_ARCHIVE_NAME) if dataset == "e2e"
                 else (readers.WEBNLG2017_URL, readers.WEBNLG2017_ARCHIVE_NAME))
    archive = Path(raw) / dataset / name
    if archive.is_file():
        return []
    say(f"missing input: {archive} ({dataset}, {url}); the nlg_data job downloads it (or put the file in "
        f"{archive.parent.resolve()}/); the GPT-2 weights come from the Hugging Face hub (network or a filled "
        "HF cache)", key=f"nlg:{dataset}")
    return [str(archive)]


def check_device(cfg: dict, workflow: Any) -> None:
    """A profile that asks for a CUDA GPU where torch sees none: said in a dry run; a real
    run with jobs on this machine stops in one line (an executor that sends jobs to other
    machines, e.g. Slurm, is left to them)."""
    profile = cfg["profile"]
    if cfg["profiles"][profile]["device"] != "cuda" or not is_main_process(workflow):
        return
    import torch

    if torch.cuda.is_available():
        return
    line = (f"profile {profile} needs a CUDA GPU (profiles.{profile}.device = cuda) and torch sees none on this "
            "machine")
    if is_dry_run(workflow) or not getattr(workflow, "local_exec", True):
        say(f"{line}: its training jobs must run where there is one", key="device")
        return
    sys.exit(f"{line}; nothing was run (run it on a GPU machine, or choose the quick profile)")
