"""Atomic file output: every artifact is written to a temporary file in the destination
folder and renamed into place, so a killed stage never leaves a half-written file that a
later run could mistake for a finished one.

Outputs get the permissions the user's umask gives a new file (0644 with the usual 022;
``mkstemp`` alone would leave them 0600). Identical content gives identical bytes: JSON is
written with sorted keys, and torch files are serialised in memory, so the temporary
file's random name never ends up inside torch's zip archive. A write that fails for lack
of space or permission says which file and why. Temporary files a killed run left behind
(``.<name>.<random>.tmp``) are removed by ``remove_stale_temps`` at the next start.
"""

from __future__ import annotations

import contextlib
import errno
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
    global _UMASK
    if _UMASK is None:
        _UMASK = os.umask(0)
        os.umask(_UMASK)
    return _UMASK


class OutputError(OSError):
    """An output could not be written; the message names the file and the cause."""


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


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` on success."""
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=TEMP_SUFFIX)
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
    """Delete the temporary files a killed writer left in ``folder`` (not recursive); call
    it only while holding the folder's run lock, so no live writer's file is removed."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    stale = [p for p in folder.iterdir() if p.is_file() and p.name.startswith(".") and p.name.endswith(TEMP_SUFFIX)]
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
