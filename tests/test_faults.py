"""Faults lose nothing and stale state is never reused: kill -9 at several points, a second
writer, damaged intermediate files, byte-identical outputs (training stages started as
processes, bounded in time, no assertion on durations)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from darel import config, faultlab, io
from tests.conftest import ROOT

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """Tiny quick-profile slices and the data set, in a scratch folder."""
    root = tmp_path_factory.mktemp("faults")
    cfg = config.load_params(ROOT / "params.yaml", {"profiles": {"quick": {"models": {
        "resnet18": {"width": 4, "epochs": 5, "milestones": [3], "warmup_epochs": 1}}}},
        "table1": {"resnet18": [[0.5, 0.55]]}})
    slices = {"train": config.training_params(cfg, "resnet18", 0),
              "calibrate": config.calibration_params(cfg, "resnet18", "t0.50_m0.55", 0),
              "online": config.online_params(cfg, "resnet18", "t0.50_m0.55", 0)}
    subprocess.run([sys.executable, str(ROOT / "stages/download.py"), "--params",
                    json.dumps(config.dataset_params(cfg)), "--out", "data", "--no-progress"], cwd=root, check=True)
    return {"root": root, "slices": slices}


def _pretrain(lab, out: str) -> list[str]:
    return [str(ROOT / "stages/pretrain.py"), "--params", json.dumps(lab["slices"]["train"]), "--data", "data",
            "--out-dir", out, "--no-progress", "--log", f"{out}.log"]


def test_kill_9_at_several_points_resumes_to_the_uninterrupted_weights(lab):
    root = lab["root"]
    assert faultlab.run_to_end(_pretrain(lab, "whole"), root, root / "whole.out") == 0
    for kill_after in (1, 3):
        out = f"killed{kill_after}"
        proc = faultlab.start_stage(_pretrain(lab, out), root, root / f"{out}.out")
        ckpt = root / out / "ckpt.pt"
        assert faultlab.kill_when(proc, lambda: (faultlab.checkpoint_epoch(ckpt) or 0) >= kill_after), \
            "the stage ended before it could be killed"
        assert not (root / out / "model.pt").exists()
        assert faultlab.run_to_end(_pretrain(lab, out), root, root / f"{out}.out") == 0
        assert faultlab.resumed_from(root / out / "train.json") >= kill_after
        assert faultlab.same_weights(root / "whole/model.pt", root / out / "model.pt")
        # Identical runs write identical bytes (torch's zip holds no temporary file name).
    again = "again"
    assert faultlab.run_to_end(_pretrain(lab, again), root, root / "again.out") == 0
    assert io.file_sha256(root / "whole/model.pt") == io.file_sha256(root / again / "model.pt")
    # Outputs follow the umask (0644 with the usual 022), not mkstemp's 0600.
    umask = os.umask(0)
    os.umask(umask)
    assert (root / "whole/model.pt").stat().st_mode & 0o777 == 0o666 & ~umask


def test_a_second_instance_of_a_running_stage_is_refused(lab):
    import time

    root = lab["root"]
    long_run = dict(lab["slices"]["train"], protocol=dict(lab["slices"]["train"]["protocol"], epochs=10_000))
    argv = [str(ROOT / "stages/pretrain.py"), "--params", json.dumps(long_run), "--data", "data", "--out-dir", "busy",
            "--no-progress"]
    first = faultlab.start_stage(argv, root, root / "busy.out")
    try:
        lock = root / "busy" / ".pretrain.lock"
        for _ in range(6000):  # until the first instance holds the folder (generous: a busy machine)
            if lock.exists() and lock.read_text().strip() == str(first.pid):
                break
            assert first.poll() is None, (root / "busy.out").read_text()
            time.sleep(0.05)
        second = subprocess.run([sys.executable, *argv], cwd=root, capture_output=True, text=True, timeout=300)
        assert second.returncode != 0
        assert f"PID {first.pid}" in second.stderr and "being written by another pretrain process" in second.stderr
        assert first.poll() is None  # the first one runs on undisturbed
    finally:
        first.kill()
        first.wait(timeout=60)


def test_damaged_intermediate_files_are_refused_with_the_file_and_field(lab, tmp_path):
    from darel import provenance

    root = lab["root"]
    assert (root / "whole/model.pt").exists()
    score = [sys.executable, str(ROOT / "stages/score.py"), "--params", json.dumps(lab["slices"]["train"]), "--data",
             "data", "--model", "whole/model.pt", "--out", "whole/losses.npz"]
    subprocess.run(score, cwd=root, check=True, capture_output=True)
    scored = io.read_npz(root / "whole/losses.npz")
    train, _, _ = __import__("darel.data", fromlist=["read_dataset"]).read_dataset(root / "data")
    provenance.check_losses(scored, "losses.npz", labels=train["labels"],
                            scorer_sha256=io.file_sha256(root / "whole/model.pt"))
    # A permuted loss column, well formed otherwise.
    permuted = dict(scored, loss=np.random.default_rng(0).permutation(scored["loss"]))
    with pytest.raises(provenance.ArtifactError, match="losses.npz.*content does not match"):
        provenance.check_losses(permuted, "losses.npz")
    # Rows reordered together (index, label and loss).
    order = np.random.default_rng(1).permutation(len(scored["index"]))
    reordered = {k: (v[order] if k in ("index", "label", "loss") else v) for k, v in scored.items()}
    with pytest.raises(provenance.ArtifactError, match="field 'index'"):
        provenance.check_losses(reordered, "losses.npz")
    # A calibration with batch 0 stops the online stage before any work, naming file and field.
    bad = tmp_path / "calibration.json"
    bad.write_text(json.dumps({"batch": 0, "alpha": 0.8, "A": 0.5, "eta": 2}))
    subset = tmp_path / "subset.npz"
    io.write_npz(subset, indices=np.arange(10))
    proc = subprocess.run([sys.executable, str(ROOT / "stages/train_online.py"), "--params",
                           json.dumps(lab["slices"]["online"]), "--data", "data", "--calibration", str(bad),
                           "--subset", str(subset), "--out-dir", str(tmp_path / "cell")], cwd=root, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode != 0
    assert f"{bad}: field batch = 0" in proc.stderr
    assert not (tmp_path / "cell/model.pt").exists()
    shutil.rmtree(tmp_path / "cell", ignore_errors=True)
