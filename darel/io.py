"""Atomic file output: every artifact is written to a temporary file in the destination
folder and renamed into place, so a killed stage never leaves a half-written file that a
later run could mistake for a finished one.

Outputs get the permissions the user's umask gives a new file (0644 with the usual 022;
``mkstemp`` alone would leave them 0600). Identical content gives identical bytes: JSON is
written with sorted keys, and torch files are serialised in memory, so the temporary
file's random name never ends up inside torch's zip archive. A write that fails for lack
of space or permission says which file and why.

No write follows a link out of the project (``inside_project``, called by every writer
here, by the stages' log files and by the lock files): a path given relative to the
project (the workflow's own paths always are) must resolve inside it, or the job stops in
one line naming the link. Lock files are opened without following a link and never
truncated unless they are a plain file holding a lock record (``open_lock``).

Temporary files are named ``.<name>.<writer PID>.<random>.tmp``. One that a killed writer
left behind is removed at the next start (``remove_stale_temps`` on the stage's folder)
and whenever the same file is written again; a temporary file whose writer is still
alive is never touched, so two jobs writing different files of one folder cannot
remove each other's work in progress.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import hashlib
import io as _io
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator

import numpy as np

TEMP_SUFFIX = ".tmp"
_UMASK: int | None = None


def _umask() -> int:
    """The process's current umask. Linux shows it in /proc (read without changing it);
    elsewhere it is read once by setting and restoring it, which is only safe before
    other threads create files, so that value is kept."""
    global _UMASK
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    if _UMASK is None:
        _UMASK = os.umask(0)
        os.umask(_UMASK)
    return _UMASK


class OutputError(OSError):
    """An output could not be written; the message names the file and the cause."""

    def __str__(self) -> str:  # the sentence alone, without OSError's "[Errno N]"
        return self.strerror or super().__str__()


def _explain(err: OSError, target: Path) -> OutputError:
    causes = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "disk quota exceeded",
              errno.EACCES: "permission denied", errno.EPERM: "operation not permitted",
              errno.EROFS: "read-only file system"}
    cause = causes.get(err.errno, err.strerror or type(err).__name__)
    folder = target.parent
    hint = {errno.ENOSPC: f"; free space where {folder} lives (df -h {folder})",
            errno.EDQUOT: "; free space or raise the quota",
            errno.EACCES: f"; check the permissions of {folder}",
            errno.EROFS: "; write the outputs somewhere writable"}.get(err.errno, "")
    return OutputError(err.errno or errno.EIO, f"cannot write {target}: {cause}{hint}")


class LinkError(OutputError):
    """A path inside the project that a link leads out of it (or a lock that is a link)."""


def _first_link(root: Path, relative: Path) -> Path | None:
    """The first component of ``root / relative`` (walking down from ``root``) that is a link."""
    current = root
    for part in relative.parts:
        current = current / part
        if current.is_symlink():
            return current
    return None


def inside_project(path: str | os.PathLike, root: str | os.PathLike | None = None) -> Path:
    """``path`` itself, after checking that it cannot lead a write out of the project.

    The project is ``root`` (default: the working folder, where Snakemake runs every job).
    A path that lies inside it as written (relative, or absolute below it) must also
    resolve inside it once every link is followed; otherwise LinkError names the link
    and where it leads. A path that lies outside the project as written was chosen by
    whoever called (a test, a user's own script) and is left alone."""
    target = Path(path)
    base = Path(os.path.abspath(root if root is not None else os.getcwd()))
    absolute = Path(os.path.abspath(target))
    try:
        relative = absolute.relative_to(base)
    except ValueError:
        return target
    real_base = Path(os.path.realpath(base))
    resolved = Path(os.path.realpath(absolute))
    if resolved == real_base or real_base in resolved.parents:
        return target
    link = _first_link(base, relative) or absolute
    shown = os.path.relpath(link, base)
    raise LinkError(errno.ELOOP, f"{shown} is a link to {os.path.realpath(link)}, outside the project {base}; the "
                                 f"workflow writes only inside the project: replace {shown} by a real "
                                 "folder or file (nothing was written through it)")


def lock_record_like(text: str) -> bool:
    """Whether ``text`` is what a lock file of this project holds: nothing, a PID, or
    ``key=value`` words (darel.stagekit.watchdog.holder_record)."""
    text = text.strip()
    return not text or text.isdigit() or (len(text) < 512 and all("=" in word for word in text.split()))


def open_lock(path: str | os.PathLike) -> Any:
    """A lock file opened for reading and writing, created if absent, never through a link
    and never truncated on opening: LinkError when ``path`` is a link (a dangling one
    included) or leads out of the project, OutputError when it is not a plain file of
    its own (a folder, a device, a file with other hard links) or holds something other
    than a lock record. The caller flocks it."""
    path = Path(path)
    inside_project(path.parent)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666 & ~_umask())
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise LinkError(errno.ELOOP, f"{path} is a link (to {os.path.realpath(path)}); a lock file is never "
                                         f"opened through a link: remove {path} and run again (nothing was "
                                         "written)") from None
        raise _explain(err, path) from err
    handle = os.fdopen(fd, "r+", encoding="utf-8")
    info = os.fstat(fd)
    import stat

    problem = None
    if not stat.S_ISREG(info.st_mode):
        problem = "not a plain file"
    elif info.st_nlink != 1:
        problem = f"a file with {info.st_nlink} hard links"
    else:
        handle.seek(0)
        if not lock_record_like(handle.read(4096)):
            problem = "a file that holds something other than a lock record"
    if problem:
        handle.close()
        raise OutputError(errno.EEXIST, f"{path} is {problem}; a lock file is never overwritten: move it away and "
                                        "run again (nothing was written)")
    return handle


def write_lock_record(handle: Any, text: str) -> None:
    """Replace the content of a lock file opened by ``open_lock`` (and flocked) by ``text``."""
    handle.seek(0)
    handle.truncate()
    handle.write(f"{text}\n")
    handle.flush()


def fresh_file(path: str | os.PathLike) -> Any:
    """A new, empty text file at ``path`` for writing (a stage's log): whatever was there
    is unlinked first (a link is removed, never followed), and the file is created
    exclusively, so nothing that was found is truncated or written through."""
    target = inside_project(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            target.unlink()
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666 & ~_umask())
    except OSError as err:
        raise _explain(err, target) from err
    return os.fdopen(fd, "w", encoding="utf-8")


def _writer_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def temp_writer(name: str) -> int | None:
    """The PID recorded in a temporary file's name (None: not a temporary file of this
    module, or one written before names carried the PID)."""
    if not (name.startswith(".") and name.endswith(TEMP_SUFFIX)):
        return None
    parts = name[: -len(TEMP_SUFFIX)].rsplit(".", 2)
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None


def is_stale_temp(path: Path) -> bool:
    """A temporary file (``.<name>.<pid>.<random>.tmp``) whose writer is gone; an older
    temporary file without a PID counts as stale too."""
    name = path.name
    if not (name.startswith(".") and name.endswith(TEMP_SUFFIX)):
        return False
    pid = temp_writer(name)
    return pid is None or not _writer_alive(pid)


def _remove_stale_temps_of(target: Path) -> None:
    """Before ``target`` is written again: the temporary files killed writers of it left."""
    try:
        candidates = list(target.parent.glob(f".{glob.escape(target.name)}.*{TEMP_SUFFIX}"))
    except OSError:
        return
    for candidate in candidates:
        if is_stale_temp(candidate):
            candidate.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` on success."""
    target = inside_project(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_temps_of(target)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.{os.getpid()}.", suffix=TEMP_SUFFIX)
        os.close(fd)
    except OSError as err:
        raise _explain(err, target) from err
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.chmod(tmp_path, 0o666 & ~_umask())
        os.replace(tmp_path, target)
    except OSError as err:
        tmp_path.unlink(missing_ok=True)
        if isinstance(err, OutputError):
            raise
        raise _explain(err, target) from err
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise


def remove_stale_temps(folder: str | os.PathLike) -> list[Path]:
    """Delete the temporary files killed writers left in ``folder`` (not recursive). A
    temporary file whose writer is alive (another job writing another file of the same
    folder) stays."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    stale = [p for p in folder.iterdir() if p.is_file() and is_stale_temp(p)]
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_text(path: str | os.PathLike, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def json_text(data: Any) -> str:
    """The one JSON form of the project: sorted keys, two-space indent, final newline."""
    return json.dumps(data, indent=2, sort_keys=True, default=_json_default) + "\n"


def write_json(path: str | os.PathLike, data: Any) -> None:
    write_text(path, json_text(data))


def read_json(path: str | os.PathLike) -> Any:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def npz_bytes(**arrays: np.ndarray) -> bytes:
    """An .npz archive (uncompressed, what np.load reads) with fixed timestamps: the same
    arrays always give the same bytes (np.savez stamps the current time into the zip)."""
    import zipfile

    buffer = _io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, value in arrays.items():
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            with archive.open(info, "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(value), allow_pickle=False)
    return buffer.getvalue()


def write_npz(path: str | os.PathLike, **arrays: np.ndarray) -> None:
    write_bytes(path, npz_bytes(**arrays))


def read_npz(path: str | os.PathLike) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as data:
        return {key: data[key] for key in data.files}


def torch_bytes(obj: Any) -> bytes:
    """``torch.save`` of ``obj`` in memory: the same object always gives the same bytes."""
    import torch

    buffer = _io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def torch_save(path: str | os.PathLike, obj: Any) -> None:
    write_bytes(path, torch_bytes(obj))


def file_sha256(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def flock_held(path: str | os.PathLike) -> bool:
    """Whether some process holds an exclusive ``flock`` on the file at ``path`` now (a
    probe: takes the lock without waiting and drops it at once)."""
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
        return False
