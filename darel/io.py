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

Every read of a file another user of a shared folder could have written is bounded
(``read_regular_bytes``, ``read_json``, ``read_npz``, ``file_sha256``): only a plain file
is read (a FIFO, a device or a folder is refused without blocking, checked by ``stat``
before it is opened and again on the open file), its size is checked against a limit
for its kind before a byte is read, JSON text is checked for nesting depth and digit
runs before it is parsed (``safe_json_loads``), and an .npz archive's members are
checked (compression, sizes, and each array header's shape and dtype against the bytes
that member holds) before numpy allocates anything (``check_npz_headers``). A refusal
is ``InputRefused``: one line naming the file and what was wrong with it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import hashlib
import io as _io
import json
import math
import os
import re
import stat
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

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


def check_no_links_out(folder: Path) -> None:
    """A stage's output folder holds no link that leads out of the project (code that
    writes a folder, such as save_pretrained, would write through it)."""
    for entry in sorted(folder.rglob("*")):
        if entry.is_symlink():
            inside_project(entry)


def save_folder(folder: str | Path) -> Path:
    """A folder that code outside this project writes into (save_pretrained): inside the
    project, reached through no link out of it, holding none (inside_project)."""
    folder = inside_project(folder)
    folder.mkdir(parents=True, exist_ok=True)
    check_no_links_out(folder)
    return folder


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
        # O_NONBLOCK: a FIFO planted at the name must not hold the run (it is refused below)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o666 & ~_umask())
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise LinkError(errno.ELOOP, f"{path} is a link (to {os.path.realpath(path)}); a lock file is never "
                                         f"opened through a link: remove {path} and run again (nothing was "
                                         "written)") from None
        raise _explain(err, path) from err
    import stat

    info = os.fstat(fd)  # before any buffered handle: a FIFO or device cannot be one
    problem, handle = None, None
    if not stat.S_ISREG(info.st_mode):
        problem = "not a plain file"
    elif info.st_nlink != 1:
        problem = f"a file with {info.st_nlink} hard links"
    else:
        handle = os.fdopen(fd, "r+", encoding="utf-8")
        handle.seek(0)
        if not lock_record_like(handle.read(4096)):
            problem = "a file that holds something other than a lock record"
    if problem:
        if handle is None:
            os.close(fd)
        else:
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




def torch_bytes(obj: Any) -> bytes:
    """``torch.save`` of ``obj`` in memory: the same object always gives the same bytes."""
    import torch

    buffer = _io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def torch_save(path: str | os.PathLike, obj: Any) -> None:
    write_bytes(path, torch_bytes(obj))




def flock_held(path: str | os.PathLike) -> bool:
    """Whether some process holds an exclusive ``flock`` on the file at ``path`` now (a
    probe: takes the lock without waiting and drops it at once). Never creates the file and
    never opens it through a link (False then: nothing of ours holds it)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


# ---- bounded reads -------------------------------------------------------------------------------
# A file in a shared folder (data/, runs/, results/, logs/, mlartifacts/, data/raw/) may
# have been put there by someone else: a FIFO that never delivers a byte, a device that
# never ends, a sparse file of terabytes, JSON built to exhaust the parser, an array
# header that asks numpy for terabytes. Each kind has its limit here, in one place, far
# above what the project writes and far below what would hang or exhaust a run.

MiB = 1 << 20
GiB = 1 << 30

# A sealed JSON record (train.json with its curves, a cell or table record, meta.json).
# Measured on a smoke build (.test/params.yaml): the largest JSON file is 24 KB (a
# tokenizer), the largest sealed record 6 KB (train.json, 3 epochs of curves); the
# paper's 200 epochs make train.json some hundreds of KB.
RECORD_LIMIT = 16 * MiB
# JSON nesting and digit runs: the smoke build's JSON nests at most 7 levels, and its
# longest number has 31 characters.
JSON_MAX_DEPTH = 64
JSON_MAX_DIGITS = 100
# A downloaded archive whose size is not published (E2E, WebNLG; CIFAR-100's is exact).
ARCHIVE_LIMIT = 1 * GiB
# A member of such an archive (an E2E CSV, a WebNLG XML file; the largest are ~10 MB and
# ~2 MB), and how much larger than its compressed bytes a member may be (text: ~10x).
ARCHIVE_MEMBER_LIMIT = 64 * MiB
ZIP_RATIO_LIMIT = 100
# A language data set's split as JSON Lines (data/nlg_*/<dataset>/train.jsonl; E2E's
# official train split: about 10 MB).
NLG_SPLIT_LIMIT = 64 * MiB
# The WebNLG 2017 challenge folder inside its repository's archive (the release: 13.4 MB).
WEBNLG_FOLDER_LIMIT = 256 * MiB
# CIFAR-100's archive inflates to ~180 MB (train batch ~155 MB, test ~31 MB).
CIFAR_MEMBER_LIMIT = 256 * MiB
CIFAR_INFLATED_LIMIT = 512 * MiB


@dataclass(frozen=True)
class NpzLimits:
    """What an .npz archive of one kind may be: its size on disk, the bytes of any one
    array (what numpy allocates for it), the number of arrays, the uncompressed size of
    all members together (default: ``file_bytes``) and a compressed member's inflation."""

    kind: str
    file_bytes: int
    array_bytes: int
    members: int = 32
    total_bytes: int | None = None
    ratio: int = ZIP_RATIO_LIMIT


# A sealed array file of a run (losses.npz, subset.npz): a few arrays of one value per
# training sample (smoke build: 32 KB; CIFAR-100's 50,000 samples: about 1.2 MB).
SEALED_NPZ = NpzLimits("sealed .npz archive", file_bytes=64 * MiB, array_bytes=64 * MiB)
# A data set's train.npz / test.npz (smoke build: 380 KB; CIFAR-100's train split: 154 MB).
DATASET_NPZ = NpzLimits("data set's array file", file_bytes=2 * GiB, array_bytes=2 * GiB, members=8)


class InputRefused(ValueError):
    """A file that was not read (or not used): not a plain file, larger than its kind may
    be, or built to exhaust the reader. The message is one line naming the file."""

    def __init__(self, path: str | os.PathLike, what: str,
                 advice: str = "move it away and run again (nothing was read from it)") -> None:
        super().__init__(f"{path}: {what}; {advice}")
        self.path, self.what = str(path), what  # ``what`` alone, for a caller's own remedy


def human_size(n: int) -> str:
    """``n`` bytes in words (8.0 GiB)."""
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def non_plain_kind(mode: int) -> str | None:
    """The kind of a non-plain file (None for a plain one)."""
    for test, name in ((stat.S_ISREG, None), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a folder"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISLNK, "a link")):
        if test(mode):
            return name
    return "not a plain file"


def _judge(path: Path, info: os.stat_result, limit: int, kind: str) -> None:
    other = non_plain_kind(info.st_mode)
    if other is not None:
        raise InputRefused(path, f"is {other}, not a plain file (a {kind} is only read from a plain file)")
    if info.st_size > limit:
        raise InputRefused(path, f"is {human_size(info.st_size)}, more than a {kind} may be ({human_size(limit)})")


@contextlib.contextmanager
def open_regular(path: str | os.PathLike, limit: int, kind: str, *, follow: bool = True) -> Iterator[Any]:
    """``path`` opened for reading in binary, once it is known to be a plain file of at
    most ``limit`` bytes; InputRefused (naming ``kind``) otherwise. Checked by ``stat``
    before opening, so a FIFO or a device is never opened, and again on the open file
    (non-blocking), so one swapped in meanwhile is refused too. ``follow=False``: a link
    is refused as well. FileNotFoundError when there is nothing."""
    path = Path(path)
    _judge(path, os.stat(path, follow_symlinks=follow), limit, kind)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as err:
        if err.errno == errno.ELOOP and not follow:
            raise InputRefused(path, f"is a link (a {kind} is never read through a link)") from None
        raise
    with os.fdopen(fd, "rb") as handle:
        _judge(path, os.fstat(fd), limit, kind)
        yield handle


def read_regular_bytes(path: str | os.PathLike, limit: int, kind: str, *, follow: bool = True) -> bytes:
    """The bytes of a plain file of at most ``limit`` bytes (``open_regular``); a file that
    grows past the limit while it is read is refused as well."""
    with open_regular(path, limit, kind, follow=follow) as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise InputRefused(path, f"grew past the {human_size(limit)} a {kind} may be while it was read")
    return data


def file_sha256(path: str | os.PathLike, limit: int | None = None, kind: str = "input") -> str:
    """sha256 of a plain file (streamed); InputRefused for a FIFO, a device or a folder,
    and for one larger than ``limit`` (None: any size)."""
    limit = limit if limit is not None else 1 << 62
    digest = hashlib.sha256()
    seen = 0
    with open_regular(path, limit, kind) as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            seen += len(chunk)
            if seen > limit:
                raise InputRefused(path, f"grew past the {human_size(limit)} a {kind} may be while it was read")
            digest.update(chunk)
    return digest.hexdigest()


# A JSON string (escapes included) in one match, without backtracking.
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_OPENERS = np.frombuffer(b"[{", dtype=np.uint8)
_CLOSERS = np.frombuffer(b"]}", dtype=np.uint8)


def json_depth(text: str, stop_above: int | None = None) -> int:
    """The deepest bracket nesting of JSON ``text`` (brackets inside strings do not count),
    by one linear pass; stops early once deeper than ``stop_above``."""
    codes = np.frombuffer(_JSON_STRING.sub("", text).encode("utf-8", "surrogatepass"), dtype=np.uint8)
    depth = deepest = 0
    for start in range(0, len(codes), 1 << 20):
        part = codes[start:start + (1 << 20)]
        steps = np.isin(part, _OPENERS).astype(np.int64) - np.isin(part, _CLOSERS)
        running = np.cumsum(steps) + depth
        deepest = max(deepest, int(running.max()))
        depth = int(running[-1])
        if stop_above is not None and deepest > stop_above:
            break
    return deepest


class _LongNumber(ValueError):
    pass


def _number(convert: Any) -> Any:
    def parse(digits: str) -> Any:
        if len(digits) > JSON_MAX_DIGITS:
            raise _LongNumber(len(digits))
        return convert(digits)

    return parse


def safe_json_loads(text: str, path: str | os.PathLike) -> Any:
    """``json.loads`` of ``text`` (read from ``path``), refusing in one line (InputRefused)
    text nested deeper than JSON_MAX_DEPTH or holding a number longer than JSON_MAX_DIGITS
    characters: they would stop the parser with a traceback (RecursionError, or int's
    digit limit) or keep it busy. Invalid JSON raises json.JSONDecodeError as before."""
    # Fewer brackets than the limit cannot nest deeper than it (most lines of a split).
    few = text.count("[") + text.count("{") <= JSON_MAX_DEPTH
    if not few and json_depth(text, stop_above=JSON_MAX_DEPTH) > JSON_MAX_DEPTH:
        raise InputRefused(path, f"is JSON nested more than {JSON_MAX_DEPTH} levels deep (no record of this project "
                                 "is)")
    try:
        return json.loads(text, parse_int=_number(int), parse_float=_number(float))
    except _LongNumber as err:
        raise InputRefused(path, f"holds a number of {err.args[0]} characters (at most {JSON_MAX_DIGITS} are "
                                 "read)") from None
    except RecursionError:
        raise InputRefused(path, "is JSON nested too deep to parse") from None


def read_json(path: str | os.PathLike, limit: int | None = None, kind: str = "JSON record") -> Any:
    """A JSON file, bounded (``read_regular_bytes`` within ``limit``, default RECORD_LIMIT;
    ``safe_json_loads``); InputRefused naming the file for anything that is not a plain
    file of valid UTF-8 JSON."""
    try:
        text = read_regular_bytes(path, RECORD_LIMIT if limit is None else limit, kind).decode("utf-8")
    except UnicodeDecodeError:
        raise InputRefused(path, "is not UTF-8 text") from None
    try:
        return safe_json_loads(text, path)
    except json.JSONDecodeError as err:
        raise InputRefused(path, f"is not valid JSON ({err.msg} at line {err.lineno}, column {err.colno})") from None


def bounded_zip_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, where: str | os.PathLike,
                       limit: int | None = None, ratio: int | None = None) -> None:
    """Refuse (InputRefused naming ``where`` and the member) a zip member that would cost
    more to read than its kind allows: a compression method that inflates without bound
    (only stored and deflated members are read), an uncompressed size over ``limit``, or
    one more than ``ratio`` times its compressed size. zipfile stops every read at the
    recorded uncompressed size, so these bound what reading the member costs. Defaults:
    ARCHIVE_MEMBER_LIMIT and ZIP_RATIO_LIMIT."""
    limit = ARCHIVE_MEMBER_LIMIT if limit is None else limit
    ratio = ZIP_RATIO_LIMIT if ratio is None else ratio
    member = f"member {info.filename!r}"
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise InputRefused(where, f"{member} uses compression method {info.compress_type} (only stored and "
                                  "deflated members are read)")
    if info.file_size > limit:
        raise InputRefused(where, f"{member} inflates to {human_size(info.file_size)}, more than the "
                                  f"{human_size(limit)} one member may be")
    if info.compress_type == zipfile.ZIP_DEFLATED and info.file_size > ratio * max(info.compress_size, 1):
        raise InputRefused(where, f"{member} inflates {info.file_size // max(info.compress_size, 1)}-fold "
                                  f"({human_size(info.compress_size)} to {human_size(info.file_size)}; at most "
                                  f"{ratio}-fold is read)")


def read_zip_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, where: str | os.PathLike,
                    limit: int | None = None, ratio: int | None = None) -> bytes:
    """The bytes of one zip member, after ``bounded_zip_member``."""
    bounded_zip_member(archive, info, where, limit, ratio)
    with archive.open(info) as member:
        return member.read(info.file_size)


_NPY_HEADERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


def check_npz_headers(source: bytes | Any, path: str | os.PathLike, limits: NpzLimits,
                      expect: Mapping[str, tuple[Any, tuple[int, ...]]] | None = None) -> dict[str, tuple]:
    """Each array of an .npz archive (``source``: its bytes or an open binary file) as
    (dtype, shape), read from the members' .npy headers before numpy allocates anything:
    every member bounded (``bounded_zip_member``), at most ``limits.members`` of them, no
    Python objects, and each header's shape and dtype asking for exactly the bytes its
    member holds and at most ``limits.array_bytes``. ``expect`` (name -> (dtype, shape)):
    every array must be one of these, with that dtype and shape. InputRefused names
    ``path`` and the array otherwise; zipfile.BadZipFile when it is no zip archive."""
    handle = _io.BytesIO(source) if isinstance(source, (bytes, bytearray, memoryview)) else source
    kind = limits.kind
    found: dict[str, tuple] = {}
    with zipfile.ZipFile(handle) as archive:
        infos = archive.infolist()
        if len(infos) > limits.members:
            raise InputRefused(path, f"holds {len(infos)} members, more than a {kind} has ({limits.members})")
        total = 0
        for info in infos:
            key = info.filename[:-4] if info.filename.endswith(".npy") else None
            if key is None:
                raise InputRefused(path, f"holds {info.filename!r}, which is not an .npy array")
            bounded_zip_member(archive, info, path, limits.array_bytes + 65536, limits.ratio)
            total += info.file_size
            if total > (limits.total_bytes or limits.file_bytes):
                raise InputRefused(path, f"inflates to more than the "
                                         f"{human_size(limits.total_bytes or limits.file_bytes)} a {kind} may hold")
            with archive.open(info) as member:
                try:
                    version = np.lib.format.read_magic(member)
                    if version not in _NPY_HEADERS:
                        raise ValueError(f".npy format version {version[0]}.{version[1]}")
                    shape, _, dtype = _NPY_HEADERS[version](member)
                except (ValueError, SyntaxError, RecursionError, TypeError, EOFError) as err:
                    raise InputRefused(path, f"array {key!r} has no readable .npy header ({str(err)[:80]})") from None
                header = member.tell()
            if dtype.hasobject:
                raise InputRefused(path, f"array {key!r} holds Python objects (never unpickled)")
            if any(side < 0 for side in shape):
                raise InputRefused(path, f"array {key!r} has a negative side in its shape {shape}")
            count = math.prod(shape)
            nbytes = count * dtype.itemsize
            if max(count, nbytes) > limits.array_bytes:
                raise InputRefused(path, f"array {key!r}: its header asks for {dtype} {shape} ({human_size(nbytes)}), "
                                         f"more than a {kind} may hold ({human_size(limits.array_bytes)})")
            if header + nbytes != info.file_size:
                raise InputRefused(path, f"array {key!r}: its header asks for {dtype} {shape} ({nbytes} bytes) but the "
                                         f"member holds {info.file_size - header}")
            if expect is not None:
                if key not in expect:
                    raise InputRefused(path, f"holds an array {key!r} that a {kind} does not have")
                want_dtype, want_shape = np.dtype(expect[key][0]), tuple(expect[key][1])
                if dtype != want_dtype or tuple(shape) != want_shape:
                    raise InputRefused(path, f"array {key!r} is {dtype} {tuple(shape)}, expected {want_dtype} "
                                             f"{want_shape}")
            found[key] = (dtype, tuple(shape))
    return found


def load_npz(data: bytes, path: str | os.PathLike, limits: NpzLimits = SEALED_NPZ,
             expect: Mapping[str, tuple[Any, tuple[int, ...]]] | None = None) -> dict[str, np.ndarray]:
    """The arrays of an .npz archive held in memory, its headers checked first
    (``check_npz_headers``); never unpickled."""
    check_npz_headers(data, path, limits, expect)
    with np.load(_io.BytesIO(data), allow_pickle=False) as arrays:
        return {key: arrays[key] for key in arrays.files}


def read_npz(path: str | os.PathLike, limits: NpzLimits = SEALED_NPZ,
             expect: Mapping[str, tuple[Any, tuple[int, ...]]] | None = None) -> dict[str, np.ndarray]:
    """The arrays of an .npz file: a plain file within ``limits.file_bytes``, read once
    into memory (so what is checked is what is loaded), headers checked, never unpickled."""
    return load_npz(read_regular_bytes(path, limits.file_bytes, limits.kind), path, limits, expect)
