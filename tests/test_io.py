import numpy as np
import pytest

from darel import io


def test_npz_round_trip_leaves_no_stray_files(tmp_path):
    io.write_npz(tmp_path / "a.npz", x=np.arange(5), y=np.array([1.5]))
    back = io.read_npz(tmp_path / "a.npz")
    assert back["x"].tolist() == [0, 1, 2, 3, 4] and back["y"].tolist() == [1.5]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.npz"]


def test_failed_write_keeps_the_old_file(tmp_path):
    target = tmp_path / "r.json"
    io.write_json(target, {"v": 1})
    with pytest.raises(TypeError):
        io.write_json(target, {"v": object()})
    assert io.read_json(target) == {"v": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


# -- faults: temporary files, identical bytes, modes, clear errors ---------------------------


def _dead_pid() -> int:
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=120)
    return proc.pid  # reaped: no live process has it (unless the PID is reused at once)


def test_temporary_files_of_dead_writers_go_and_live_ones_stay(tmp_path):
    import os
    import subprocess
    import sys

    dead = tmp_path / f".model.pt.{_dead_pid()}.abc123.tmp"
    legacy = tmp_path / ".train.json.k2j4_x.tmp"  # written before names carried the PID
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        live = tmp_path / f".losses.npz.{sleeper.pid}.q9z.tmp"  # another job, still writing
        own = tmp_path / f".eval.json.{os.getpid()}.w1.tmp"
        for path in (dead, legacy, live, own):
            path.write_bytes(b"partial")
        keep = tmp_path / ".pretrain.lock"
        keep.write_text("1\n")
        removed = io.remove_stale_temps(tmp_path)
        assert sorted(p.name for p in removed) == sorted([dead.name, legacy.name])
        assert live.exists() and own.exists() and keep.exists()
        # Writing a file again also clears its own dead writers' leftovers (any folder).
        again = tmp_path / f".model.pt.{_dead_pid()}.zz.tmp"
        again.write_bytes(b"partial")
        io.write_json(tmp_path / "model.pt", {"v": 1})
        assert not again.exists() and live.exists()
    finally:
        sleeper.kill()
        sleeper.wait(timeout=60)


def test_temporary_file_names_carry_the_writer_pid(tmp_path):
    import os

    seen = []
    with io.atomic_path(tmp_path / "x.json") as tmp:
        seen.append(tmp.name)
        tmp.write_text("{}")
    assert io.temp_writer(seen[0]) == os.getpid()
    assert io.temp_writer("x.json") is None and io.temp_writer(".x.json.abc.tmp") is None


def test_identical_content_gives_identical_bytes_and_umask_modes(tmp_path):
    import os
    import sys

    import torch

    state = {"w": torch.arange(6.0).reshape(2, 3), "meta": {"b": 1, "a": [1, 2]}}
    io.torch_save(tmp_path / "a.pt", state)
    io.torch_save(tmp_path / "b.pt", state)
    assert io.file_sha256(tmp_path / "a.pt") == io.file_sha256(tmp_path / "b.pt")
    io.write_json(tmp_path / "a.json", {"x": 1, "y": [1.5, None]})
    io.write_json(tmp_path / "b.json", {"y": [1.5, None], "x": 1})  # same content, other key order
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    io.write_npz(tmp_path / "a.npz", i=np.arange(4))
    io.write_npz(tmp_path / "b.npz", i=np.arange(4))
    assert (tmp_path / "a.npz").read_bytes() == (tmp_path / "b.npz").read_bytes()
    umask = os.umask(0o027)
    try:
        io.write_json(tmp_path / "c.json", {})
    finally:
        os.umask(umask)
    for name in ("a.pt", "a.json", "a.npz"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o666 & ~umask, name
    if sys.platform == "linux":  # the umask in force at the write (read from /proc, not cached)
        assert (tmp_path / "c.json").stat().st_mode & 0o777 == 0o640


@pytest.mark.parametrize("code, cause", [(28, "no space left on the device"), (13, "permission denied"),
                                         (30, "read-only file system")])
def test_disk_full_and_permission_errors_name_the_file_and_the_cause(tmp_path, monkeypatch, code, cause):
    import errno
    import os
    from pathlib import Path

    import torch

    assert code in (errno.ENOSPC, errno.EACCES, errno.EROFS)
    target = tmp_path / "run" / "model.pt"
    io.write_json(target.with_name("train.json"), {"old": True})

    def refuse(self, data):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(Path, "write_bytes", refuse)
    with pytest.raises(io.OutputError) as err:
        io.torch_save(target, {"w": torch.zeros(3)})
    assert str(target) in str(err.value) and cause in str(err.value)
    assert "inline_container" not in str(err.value)
    with pytest.raises(OSError, match=cause):  # OutputError is an OSError: callers that catch OSError still do
        io.write_json(target.with_name("train.json"), {"new": True})
    monkeypatch.undo()
    assert io.read_json(target.with_name("train.json")) == {"old": True}
    assert sorted(p.name for p in target.parent.iterdir()) == ["train.json"]  # no temporary file left
