"""The key behind every seal: records, arrays, markers and checkpoints are sealed with an
HMAC-SHA256 under a secret that lives outside the project folder, so someone who can write
the project's files (a lab's shared folder) but does not hold the key cannot recompute a
seal after editing a figure.

Where the key comes from, first match wins:

* ``DAREL_SEAL_KEY``: the key itself, as hex (at least 32 hex digits);
* ``DAREL_SEAL_KEY_FILE``: a file holding it (how a lab shares one key on purpose);
* ``$XDG_CONFIG_HOME/darel/seal.key`` (else ``~/.config/darel/seal.key``): made on first
  use with 32 random bytes, mode 0600.

A key file must be a regular file outside the project folder, not writable by group or
others and not readable by others; anything else is refused in one line before a seal is
made or checked.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import stat
import tempfile
from functools import lru_cache
from pathlib import Path

KEY_ENV = "DAREL_SEAL_KEY"
KEY_FILE_ENV = "DAREL_SEAL_KEY_FILE"
SCHEME = "hmac-sha256"
_HEX = re.compile(r"[0-9a-fA-F]{32,256}")
_KEY_FILE_MAX_BYTES = 1024
# group write, and any access by others: who holds the key can forge every result
_UNSAFE_MODE = stat.S_IWGRP | stat.S_IRWXO


class SealKeyError(RuntimeError):
    """No usable seal key (a bad variable, an unsafe or unreadable key file)."""


def default_key_path() -> Path:
    config = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(config) / "darel" / "seal.key"


def _source() -> tuple[str, str]:
    """(kind, value) naming where the key comes from: ("env", hex) or ("file", path)."""
    if os.environ.get(KEY_ENV):
        return "env", os.environ[KEY_ENV]
    if os.environ.get(KEY_FILE_ENV):
        return "file", os.environ[KEY_FILE_ENV]
    return "default", str(default_key_path())


def _parse(text: str, where: str) -> bytes:
    text = text.strip()
    if not _HEX.fullmatch(text) or len(text) % 2:
        raise SealKeyError(f"{where}: a seal key must be an even number (32 to 256) of hex digits, e.g. made by "
                           "`python -c 'import secrets; print(secrets.token_hex(32))'`")
    return bytes.fromhex(text)


def _inside_project(path: Path) -> bool:
    """Whether ``path`` lies in the project being run (the working folder, when it holds
    the workflow: a tool run from one's home is not a project)."""
    project = Path(os.getcwd()).resolve()
    if not (project / "Snakefile").is_file():
        return False
    resolved = path.resolve()
    return resolved == project or project in resolved.parents


def _read_key_file(path: Path, *, explicit: bool) -> bytes:
    """The key in ``path``, after checking it is a regular, private file outside the project."""
    name = f"{KEY_FILE_ENV}={path}" if explicit else str(path)
    if _inside_project(path):
        raise SealKeyError(f"{name}: the seal key lies inside the project folder, where whoever can write results "
                           "could read it; keep it outside (e.g. ~/.config/darel/seal.key)")
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if not explicit:  # the default file is made by us: never a link
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise SealKeyError(f"{name}: no such key file") from None
    except OSError as err:
        raise SealKeyError(f"{name}: cannot open the seal key ({err.strerror}; a link?)") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SealKeyError(f"{name}: the seal key is not a regular file")
        if info.st_uid not in (os.getuid(), 0):
            raise SealKeyError(f"{name}: the seal key belongs to user id {info.st_uid}, not to you or root")
        if info.st_mode & _UNSAFE_MODE:
            raise SealKeyError(f"{name}: the seal key's mode {stat.S_IMODE(info.st_mode):o} lets others read or "
                               f"change it; run `chmod 600 {path}` (or 640 for a lab's group)")
        data = os.read(fd, _KEY_FILE_MAX_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > _KEY_FILE_MAX_BYTES:
        raise SealKeyError(f"{name}: over {_KEY_FILE_MAX_BYTES} bytes, not a seal key")
    return _parse(data.decode("ascii", errors="replace"), name)


def _make_default_key(path: Path) -> None:
    """Create ``path`` with a fresh key, atomically: a private temporary linked into place,
    so two jobs starting together agree on one key and nobody reads half a file."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=".seal.key.", dir=path.parent)  # mode 0600, O_EXCL
    try:
        os.write(fd, (secrets.token_hex(32) + "\n").encode("ascii"))
        os.fsync(fd)
        os.close(fd)
        try:
            os.link(temp, path)
        except FileExistsError:
            pass  # another process made it first: its key is the one
    finally:
        os.unlink(temp)


@lru_cache(maxsize=8)
def _key_for(kind: str, value: str) -> bytes:
    if kind == "env":
        return _parse(value, KEY_ENV)
    path = Path(value)
    if kind == "default" and not os.path.lexists(path):
        _make_default_key(path)
    return _read_key_file(path, explicit=kind == "file")


def seal_key() -> bytes:
    """The key seals are made and checked with (SealKeyError when none is usable)."""
    return _key_for(*_source())


def export_for_jobs() -> None:
    """Point the jobs this process starts at the key it uses: with the default key, set
    ``DAREL_SEAL_KEY_FILE`` to its absolute path, so a job on a node whose home differs
    finds that file or stops naming it, instead of making a key of its own."""
    kind, value = _source()
    if kind == "default":
        os.environ[KEY_FILE_ENV] = str(Path(value).absolute())


def key_id(key: bytes | None = None) -> str:
    """A short public name of a key, so an error can say "sealed with another key"; it
    reveals nothing that helps to forge."""
    key = seal_key() if key is None else key
    return hashlib.sha256(b"darel seal key id\0" + key).hexdigest()[:12]


def describe() -> str:
    """Where the key comes from, for messages and `python -m darel.tools.sealkey`."""
    kind, value = _source()
    return {"env": f"${KEY_ENV}", "file": f"${KEY_FILE_ENV} ({value})", "default": value}[kind]


def seal_bytes(data: bytes, key: bytes | None = None) -> str:
    """The seal of ``data``: ``hmac-sha256:<key id>:<hex>``."""
    key = seal_key() if key is None else key
    return f"{SCHEME}:{key_id(key)}:{hmac.new(key, data, hashlib.sha256).hexdigest()}"


def seal_problem(data: bytes, recorded: object, key: bytes | None = None) -> str | None:
    """None when ``recorded`` is the seal of ``data`` under this key; else why not, in words."""
    if not isinstance(recorded, str) or not recorded.startswith(SCHEME + ":"):
        return "carries an unkeyed or malformed seal (written by an older version, or recomputed by hand)"
    key = seal_key() if key is None else key
    parts = recorded.split(":")
    if len(parts) != 3:
        return "carries a malformed seal"
    if parts[1] != key_id(key):
        return (f"was sealed with another key (key id {parts[1][:12]}, yours is {key_id(key)} from {describe()}): "
                "written by someone else, or before a key change")
    if not hmac.compare_digest(recorded, seal_bytes(data, key)):
        return "its content differs from its seal (edited or damaged after it was written)"
    return None
