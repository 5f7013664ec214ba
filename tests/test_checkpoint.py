"""darel.checkpoint: checksummed files, the last two kept, damaged or foreign ones set aside
under their own names, one line saying what happened."""

import pytest
import torch

from darel import checkpoint


def _save_epochs(path, fingerprint, epochs):
    for epoch in epochs:
        checkpoint.save(path, {"fingerprint": fingerprint, "epoch": epoch, "w": torch.full((3,), float(epoch))})


def _load(path, fingerprint):
    lines = []
    state = checkpoint.load(path, fingerprint, lines.append)
    return state, lines


def test_the_last_two_are_kept_and_the_newest_is_resumed(tmp_path):
    ckpt = tmp_path / "ckpt.pt"
    _save_epochs(ckpt, "a", [1, 2, 3])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt", "ckpt.pt.prev"]
    state, lines = _load(ckpt, "a")
    assert state["epoch"] == 3 and torch.equal(state["w"], torch.full((3,), 3.0))
    assert lines == ["resuming from ckpt.pt"]
    assert checkpoint.loads(ckpt.with_name("ckpt.pt.prev").read_bytes())["epoch"] == 2


@pytest.mark.parametrize("where", ["payload", "trailer"])
def test_one_changed_byte_is_caught(tmp_path, where):
    ckpt = tmp_path / "ckpt.pt"
    _save_epochs(ckpt, "a", [1, 2])
    data = bytearray(ckpt.read_bytes())
    data[len(data) // 2 if where == "payload" else -3] ^= 0x01
    ckpt.write_bytes(bytes(data))
    state, lines = _load(ckpt, "a")
    assert state["epoch"] == 1
    assert len(lines) == 1 and "ckpt.pt is damaged" in lines[0] and "resuming from ckpt.pt.prev" in lines[0]
    assert (tmp_path / "ckpt.pt.bad").exists()


def test_both_damaged_start_clean_and_both_are_kept_aside(tmp_path):
    ckpt = tmp_path / "ckpt.pt"
    _save_epochs(ckpt, "a", [1, 2])
    ckpt.write_bytes(ckpt.read_bytes()[:100])  # truncated
    ckpt.with_name("ckpt.pt.prev").write_bytes(b"")  # empty
    state, lines = _load(ckpt, "a")
    assert state is None
    assert len(lines) == 1 and lines[0].endswith("starting clean")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt.bad", "ckpt.pt.prev.bad"]
    assert (tmp_path / "ckpt.pt.bad").stat().st_size == 100  # the newest is not overwritten by the older one
    checkpoint.discard(ckpt)
    assert list(tmp_path.iterdir()) == []


def test_another_configuration_is_never_resumed_and_the_newest_is_kept_aside(tmp_path):
    ckpt = tmp_path / "ckpt.pt"
    _save_epochs(ckpt, "old", [4, 5])
    state, lines = _load(ckpt, "new")
    assert state is None
    assert len(lines) == 1 and "another configuration" in lines[0] and lines[0].endswith("starting clean")
    assert checkpoint.loads((tmp_path / "ckpt.pt.stale").read_bytes())["epoch"] == 5
    assert checkpoint.loads((tmp_path / "ckpt.pt.prev.stale").read_bytes())["epoch"] == 4
    # The new run's checkpoints live beside the set-aside ones until the outputs are accepted.
    _save_epochs(ckpt, "new", [1])
    state, _ = _load(ckpt, "new")
    assert state["epoch"] == 1
    checkpoint.discard(ckpt)
    assert list(tmp_path.iterdir()) == []


def test_a_kill_between_the_rotation_and_the_write_resumes_from_the_previous(tmp_path):
    ckpt = tmp_path / "ckpt.pt"
    _save_epochs(ckpt, "a", [1, 2])
    ckpt.with_name("ckpt.pt.prev").unlink()
    ckpt.rename(ckpt.with_name("ckpt.pt.prev"))  # save() moved the newest aside, then died
    state, lines = _load(ckpt, "a")
    assert state["epoch"] == 2 and lines == ["resuming from ckpt.pt.prev"]


def test_a_file_without_the_trailer_is_refused():
    with pytest.raises(checkpoint.CheckpointError, match="no seal trailer"):
        checkpoint.loads(b"PK\x03\x04 a torch file of an older version")


class _RunsCode:
    """What an attacker puts into a pickle: unpickling it calls os.system."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os

        return os.system, (f"touch {self.marker}",)


def test_a_crafted_checkpoint_with_a_valid_trailer_runs_no_code(tmp_path):
    """Even a file sealed with the user's own key (a key holder's mistake, a stolen key) runs
    no code: nothing but tensors and plain values is ever unpickled."""
    import io

    marker = tmp_path / "code-ran"
    buffer = io.BytesIO()
    torch.save({"fingerprint": "a", "epoch": 9, "payload": _RunsCode(marker)}, buffer)
    payload = buffer.getvalue()
    ckpt = tmp_path / "ckpt.pt"
    ckpt.write_bytes(checkpoint.sealed(payload))
    with pytest.raises(checkpoint.CheckpointError, match="refused unread"):
        checkpoint.loads(ckpt.read_bytes())
    state, lines = _load(ckpt, "a")
    assert state is None and not marker.exists()
    assert len(lines) == 1 and "ckpt.pt is damaged" in lines[0] and "refused unread" in lines[0]
    assert (tmp_path / "ckpt.pt.bad").exists() and not ckpt.exists()
    # torch.load without weights_only would have run it: the test's payload is live.
    torch.load(io.BytesIO(payload), weights_only=False)
    assert marker.exists()


def test_a_checkpoint_sealed_without_the_key_is_set_aside(tmp_path, monkeypatch):
    """Someone who can write the run folder but holds another key (or none) cannot plant a
    checkpoint that resumes: an unkeyed sha256 trailer or another key's seal are refused."""
    import hashlib

    ckpt = tmp_path / "ckpt.pt"
    payload = checkpoint.torch_bytes({"fingerprint": "a", "epoch": 7})
    unkeyed = payload + checkpoint.MAGIC + hashlib.sha256(payload).hexdigest().encode()
    with pytest.raises(checkpoint.CheckpointError):
        checkpoint.loads(unkeyed)
    monkeypatch.setenv("DAREL_SEAL_KEY", "ab" * 32)  # the forger's key
    forged = checkpoint.dumps({"fingerprint": "a", "epoch": 7})
    monkeypatch.delenv("DAREL_SEAL_KEY", raising=False)
    ckpt.write_bytes(forged)
    state, lines = _load(ckpt, "a")
    assert state is None and len(lines) == 1 and "another key" in lines[0]
    assert (tmp_path / "ckpt.pt.bad").read_bytes() == forged
