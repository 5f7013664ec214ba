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
