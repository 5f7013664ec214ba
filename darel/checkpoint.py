"""Checkpoints that are checked before they are trusted.

A checkpoint file is torch's serialisation of the state followed by a trailer: a magic
marker and the keyed seal of the serialised bytes (HMAC-SHA256 under the seal key,
darel.sealkey: a checkpoint planted in a shared folder by someone without the key is
refused like a damaged one). ``save`` keeps the previous checkpoint as
``<name>.prev`` (the last two survive); ``load`` verifies the checksum and the run's
fingerprint and falls back from the newest to the previous one, then to a clean start,
with one line saying which and why:

* only tensors and plain values are ever read back (``torch.load(weights_only=True)``):
  a file that asks for any other object is refused like a damaged one, so a crafted
  checkpoint cannot run code, whatever its trailer says;
* a file whose checksum does not match (garbled, truncated, empty) is moved aside as
  ``<file>.bad`` (``ckpt.pt.bad``, ``ckpt.pt.prev.bad``) and the next candidate is tried;
* a checkpoint of another configuration (its fingerprint differs) is never resumed; it
  is moved aside as ``<file>.stale`` and stays there until the new run has written its
  outputs (``discard`` removes it with the others).

Each candidate keeps its own name when set aside, so the newest of them is never
overwritten by the older one.

The file is written atomically (darel.io), so a kill during a save leaves the previous
files as they were.
"""

from __future__ import annotations

import io
import os
import pickle
import re
from pathlib import Path
from typing import Any, Callable

from darel import sealkey
from darel.io import torch_bytes, write_bytes

MAGIC = b"\nDAREL-CHECKPOINT-SEAL:"
_SEAL_LEN = 2  # the trailer's last two bytes: the seal's length, so the seal itself can vary
SUFFIXES = ("", ".prev", ".bad", ".stale", ".prev.bad", ".prev.stale")


class CheckpointError(ValueError):
    """A checkpoint file that cannot be trusted (checksum, format)."""


def sealed(payload: bytes) -> bytes:
    """``payload`` followed by its trailer: the marker, its keyed seal, the seal's length."""
    seal = sealkey.seal_bytes(payload).encode("ascii")
    return payload + MAGIC + seal + len(seal).to_bytes(_SEAL_LEN, "big")


def dumps(state: Any) -> bytes:
    return sealed(torch_bytes(state))


def loads(data: bytes, map_location: Any = "cpu") -> Any:
    """The state of a checkpoint's bytes; CheckpointError unless the checksum matches."""
    import torch

    seal_len = int.from_bytes(data[-_SEAL_LEN:], "big") if len(data) >= _SEAL_LEN else 0
    trailer = len(MAGIC) + seal_len + _SEAL_LEN
    if len(data) < trailer or not 0 < seal_len <= 200 or data[-trailer:-trailer + len(MAGIC)] != MAGIC:
        raise CheckpointError(f"no seal trailer ({len(data)} bytes: empty, truncated or not a checkpoint)")
    payload = data[:-trailer]
    recorded = data[-trailer + len(MAGIC):-_SEAL_LEN].decode("ascii", errors="replace")
    problem = sealkey.seal_problem(payload, recorded)
    if problem is not None:
        raise CheckpointError(f"checksum mismatch: {problem}")
    # weights_only: only tensors and plain containers are rebuilt; a crafted file that
    # asks for any other object (the way pickles run code) is refused, checksum or not.
    try:
        return torch.load(io.BytesIO(payload), map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        found = re.search(r"GLOBAL (\S+)", str(err))
        raise CheckpointError("holds objects other than tensors and plain values"
                              + (f" ({found.group(1)})" if found else "") + ", refused unread") from None


def path_with(path: Path, suffix: str) -> Path:
    return path.with_name(path.name + suffix)


def save(path: str | os.PathLike, state: Any) -> None:
    """Write ``state`` with its checksum; the checkpoint it replaces becomes ``.prev``."""
    path = Path(path)
    data = dumps(state)
    if path.exists():
        os.replace(path, path_with(path, ".prev"))
    write_bytes(path, data)


def load(path: str | os.PathLike, fingerprint: Any, say: Callable[[str], None],
         map_location: Any = "cpu") -> Any | None:
    """The newest trustworthy checkpoint of this run (``state["fingerprint"] == fingerprint``),
    or None for a clean start; ``say`` gets one line describing what happened. The state
    names the file it came from (``checkpoint_file``)."""
    path = Path(path)
    problems = []
    for candidate in (path, path_with(path, ".prev")):
        if not candidate.exists():
            continue
        try:
            state = loads(candidate.read_bytes(), map_location)
        except (CheckpointError, OSError, RuntimeError, EOFError) as err:
            aside = path_with(candidate, ".bad")
            os.replace(candidate, aside)
            problems.append(f"{candidate.name} is damaged ({err}; kept as {aside.name})")
            continue
        if not isinstance(state, dict) or state.get("fingerprint") != fingerprint:
            aside = path_with(candidate, ".stale")
            os.replace(candidate, aside)
            problems.append(f"{candidate.name} belongs to another configuration or code version (kept as "
                            f"{aside.name} until this run's outputs are written)")
            continue
        say("; ".join(problems + [f"resuming from {candidate.name}"]))
        state["checkpoint_file"] = str(candidate)
        return state
    if problems:
        say("; ".join(problems + ["starting clean"]))
    return None


def discard(path: str | os.PathLike) -> None:
    """Remove the checkpoint and every file kept beside it (after the outputs are accepted)."""
    path = Path(path)
    for suffix in SUFFIXES:
        path_with(path, suffix).unlink(missing_ok=True)
