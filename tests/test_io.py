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


# -- bounded reads (darel.io: a plain file within its kind's limit) -----------------------------


def test_a_plain_file_is_read_up_to_its_limit_and_no_further(tmp_path):
    path = tmp_path / "r.json"
    io.write_json(path, {"v": [1, 2.5, "x"]})
    size = path.stat().st_size
    assert io.read_regular_bytes(path, size, "record") == path.read_bytes()
    with pytest.raises(io.InputRefused, match=rf"r\.json: is {size} bytes, more than a record may be \({size - 1} "):
        io.read_regular_bytes(path, size - 1, "record")
    assert io.read_json(path) == {"v": [1, 2.5, "x"]}
    link = tmp_path / "link.json"
    link.symlink_to(path)
    assert io.read_json(link) == {"v": [1, 2.5, "x"]}  # followed by default (links out are refused elsewhere)
    with pytest.raises(io.InputRefused, match=r"link\.json: is a link"):
        io.read_regular_bytes(link, size, "record", follow=False)
    with pytest.raises(io.InputRefused, match="is a folder"):
        io.read_json(tmp_path)
    with pytest.raises(FileNotFoundError):
        io.read_json(tmp_path / "absent.json")


def test_npz_headers_are_checked_against_what_the_reader_expects(tmp_path):
    path = tmp_path / "a.npz"
    io.write_npz(path, x=np.arange(5), s=np.str_("seal"))
    limits = io.NpzLimits("test archive", file_bytes=1 << 20, array_bytes=1 << 10)
    found = io.check_npz_headers(path.read_bytes(), path, limits)
    assert found == {"x": (np.dtype(np.int64), (5,)), "s": (np.dtype("<U4"), ())}
    with pytest.raises(io.InputRefused, match=r"array 'x' is int64 \(5,\), expected int64 \(6,\)"):
        io.read_npz(path, limits, expect={"x": (np.int64, (6,)), "s": ("<U4", ())})
    with pytest.raises(io.InputRefused, match="holds an array 's' that a test archive does not have"):
        io.read_npz(path, limits, expect={"x": (np.int64, (5,))})
    small = io.NpzLimits("test archive", file_bytes=1 << 20, array_bytes=16)
    with pytest.raises(io.InputRefused, match=r"array 'x': its header asks for int64 \(5,\) \(40 bytes\), more"):
        io.read_npz(path, small)
    assert io.read_npz(path, limits, expect={"x": (np.int64, (5,)), "s": ("<U4", ())})["x"].tolist() == list(range(5))


def test_a_fifo_at_a_lock_files_name_is_refused_in_one_line_without_waiting(tmp_path, monkeypatch):
    """A FIFO planted where a stage's lock file goes: refused (OutputError naming it), never
    opened as a buffered file, the FIFO left where it is."""
    import os

    from darel import io

    monkeypatch.chdir(tmp_path)
    fifo = tmp_path / ".track.lock"
    os.mkfifo(fifo)
    with pytest.raises(io.OutputError, match=r"\.track\.lock is not a plain file"):
        io.open_lock(fifo)
    assert fifo.is_fifo()
    assert io.flock_held(tmp_path / "absent.lock") is False and not (tmp_path / "absent.lock").exists()
