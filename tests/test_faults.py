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

from darel import checkpoint, config, faultlab, io, provenance
from darel.stagekit import watchdog
from tests.conftest import ROOT

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """Tiny quick-profile slices and the data set, in a scratch folder."""
    root = tmp_path_factory.mktemp("faults")
    cfg = config.load_params(ROOT / "params.yaml", {"profiles": {"quick": {"models": {
        "resnet18": {"width": 4, "epochs": 5, "milestones": [3], "warmup_epochs": 1}},
        "table1": {"resnet18": [[0.5, 0.55], [1.0, 1.0]]}}}})
    slices = {"train": config.training_params(cfg, "resnet18", 0),
              "calibrate": config.calibration_params(cfg, "resnet18", "t0.50_m0.55", 0),
              "online": config.online_params(cfg, "resnet18", "t0.50_m0.55", 0),
              "calibrate_full": config.calibration_params(cfg, "resnet18", "t1.00_m1.00", 0),
              "online_full": config.online_params(cfg, "resnet18", "t1.00_m1.00", 0)}
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
            if lock.exists() and f"pid={first.pid} " in lock.read_text():
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
    # (Sealed as its stage seals it: the content is well formed JSON, the value is what is wrong.)
    bad = tmp_path / "calibration.json"
    provenance.write_record(bad, {"batch": 0, "alpha": 0.8, "A": 0.5, "eta": 2})
    subset = tmp_path / "subset.npz"
    provenance.write_sealed_npz(subset, indices=np.arange(10))
    proc = subprocess.run([sys.executable, str(ROOT / "stages/train_online.py"), "--params",
                           json.dumps(lab["slices"]["online"]), "--data", "data", "--calibration", str(bad),
                           "--subset", str(subset), "--out-dir", str(tmp_path / "cell")], cwd=root, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode != 0
    assert f"{bad}: field batch = 0" in proc.stderr
    assert not (tmp_path / "cell/model.pt").exists()
    shutil.rmtree(tmp_path / "cell", ignore_errors=True)


# -- an online cell, a configuration change, a killed workflow --------------------------------


def _stage_ok(root: Path, *argv: str) -> None:
    proc = subprocess.run([sys.executable, *argv], cwd=root, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, f"{argv[0]} failed:\n{proc.stderr[-3000:]}"


@pytest.fixture(scope="module")
def cell(lab):
    """A budgeted DAREL cell (B(1, 1)): scorer, losses, calibration and subset, made once."""
    root = lab["root"]
    train = json.dumps(lab["slices"]["train"])
    _stage_ok(root, str(ROOT / "stages/pretrain.py"), "--params", train, "--data", "data", "--out-dir", "scorer",
              "--no-progress")
    _stage_ok(root, str(ROOT / "stages/score.py"), "--params", train, "--data", "data", "--model", "scorer/model.pt",
              "--out", "scorer/losses.npz")
    _stage_ok(root, str(ROOT / "stages/calibrate.py"), "--params", json.dumps(lab["slices"]["calibrate_full"]),
              "--data", "data", "--baseline", "scorer/train.json", "--out", "cellcfg/calibration.json")
    _stage_ok(root, str(ROOT / "stages/subset.py"), "--params", json.dumps({"mode": "hard"}), "--losses",
              "scorer/losses.npz", "--scorer-model", "scorer/model.pt", "--data", "data", "--calibration",
              "cellcfg/calibration.json", "--out", "cellcfg/subset.npz")
    return {"calibration": "cellcfg/calibration.json", "subset": "cellcfg/subset.npz"}


def _online(lab, cell, out: str) -> list[str]:
    return [str(ROOT / "stages/train_online.py"), "--params", json.dumps(lab["slices"]["online_full"]), "--data",
            "data", "--calibration", cell["calibration"], "--subset", cell["subset"], "--out-dir", out,
            "--no-progress", "--log", f"{out}.log"]


def _same_run(root: Path, whole: str, other: str) -> None:
    """``other`` ended with ``whole``'s weights (byte for byte) and curves, and its time and
    energy cover the whole run."""
    assert io.file_sha256(root / whole / "model.pt") == io.file_sha256(root / other / "model.pt")
    a, b = (json.loads((root / name / "train.json").read_text()) for name in (whole, other))
    for key in ("epochs_completed", "steps", "samples_trained"):
        assert a[key] == b[key], key
    assert a["curves"]["train_loss"] == b["curves"]["train_loss"]
    assert b["energy"]["timed_intervals"] == b["epochs_completed"]
    assert "whole run" in b["energy_covers"]


def test_online_cell_killed_mid_run_mid_checkpoint_write_and_after_its_outputs(lab, cell):
    root = lab["root"]
    assert faultlab.run_to_end(_online(lab, cell, "on_whole"), root, root / "on_whole.out") == 0
    planned = json.loads((root / "on_whole/train.json").read_text())["epochs_planned"]
    assert planned >= 2, "the cell plans a single epoch: nothing to kill in between"

    # 1. kill -9 once the first checkpoint is there (anywhere in the epochs after it).
    proc = faultlab.start_stage(_online(lab, cell, "on_killed"), root, root / "on_killed.out")
    assert faultlab.kill_when(proc, lambda: (faultlab.checkpoint_epoch(root / "on_killed/ckpt.pt") or 0) >= 1), \
        "the stage ended before it could be killed"
    # 2. What a kill inside a checkpoint write leaves: the newest already renamed to .prev,
    # the new one half-written in a temporary file of the dead process.
    shutil.copytree(root / "on_killed", root / "on_midwrite")
    ckpt = root / "on_midwrite/ckpt.pt"
    ckpt.replace(ckpt.with_name("ckpt.pt.prev"))
    partial = root / "on_midwrite" / f".ckpt.pt.{proc.pid}.x1y2.tmp"
    partial.write_bytes(ckpt.with_name("ckpt.pt.prev").read_bytes()[:5000])

    for out in ("on_killed", "on_midwrite"):
        assert faultlab.run_to_end(_online(lab, cell, out), root, root / f"{out}.out") == 0
        assert faultlab.resumed_from(root / out / "train.json") >= 1
        _same_run(root, "on_whole", out)
    log = (root / "on_midwrite.log").read_text()
    assert "resuming from ckpt.pt.prev" in log and partial.name in log and not partial.exists()

    # 3. A kill after the outputs were written but before the workflow accepted them (it
    # then deletes them): the final checkpoint rewrites them without training again.
    whole_bytes = (root / "on_whole/model.pt").read_bytes()
    shutil.copytree(root / "on_whole", root / "on_gap")
    for name in ("model.pt", "train.json"):
        (root / "on_gap" / name).unlink()
    assert faultlab.run_to_end(_online(lab, cell, "on_gap"), root, root / "on_gap.out") == 0
    assert faultlab.resumed_from(root / "on_gap/train.json") == planned
    assert (root / "on_gap/model.pt").read_bytes() == whole_bytes
    _same_run(root, "on_whole", "on_gap")
    # The cell-record stage removes the checkpoints once the outputs are accepted.
    checkpoint.discard(root / "on_gap/ckpt.pt")
    assert not any(p.name.startswith("ckpt.pt") for p in (root / "on_gap").iterdir())


def test_a_configuration_change_after_a_kill_starts_clean(lab):
    """The issue's case: rotation 10 -> 0 after a kill resumed the old run."""
    root = lab["root"]
    original = lab["slices"]["train"]
    assert original["augment"]["rotation_deg"] != 0
    changed = dict(original, augment=dict(original["augment"], rotation_deg=0))

    def argv(out: str, params: dict) -> list[str]:
        return [str(ROOT / "stages/pretrain.py"), "--params", json.dumps(params), "--data", "data", "--out-dir", out,
                "--no-progress", "--log", f"{out}.log"]

    assert faultlab.run_to_end(argv("rot0_whole", changed), root, root / "rot0_whole.out") == 0
    proc = faultlab.start_stage(argv("rot_changed", original), root, root / "rot_changed.out")
    assert faultlab.kill_when(proc, lambda: (faultlab.checkpoint_epoch(root / "rot_changed/ckpt.pt") or 0) >= 1), \
        "the stage ended before it could be killed"
    assert faultlab.run_to_end(argv("rot_changed", changed), root, root / "rot_changed.out") == 0
    log = (root / "rot_changed.log").read_text()
    lines = [line for line in log.splitlines() if "another configuration" in line]
    assert len(lines) == 1 and lines[0].endswith("starting clean")
    assert faultlab.checkpoint_line(log) == lines[0]  # the line bench/faults.py reports
    assert faultlab.resumed_from(root / "rot_changed/train.json") is None
    assert (root / "rot_changed/ckpt.pt.stale").exists()  # the old run's checkpoint, kept aside
    assert io.file_sha256(root / "rot0_whole/model.pt") == io.file_sha256(root / "rot_changed/model.pt")


def test_permuted_losses_are_refused_by_the_subset_stage(lab, tmp_path):
    root = lab["root"]
    if not (root / "scorer/losses.npz").exists():
        pytest.skip("needs the cell fixture's scorer")
    scored = io.read_npz(root / "scorer/losses.npz")
    calibration = tmp_path / "calibration.json"
    calibration.write_text(json.dumps({"batch": 16, "alpha": 0.8, "A": 0.5, "eta": 2}))
    order = np.random.default_rng(2).permutation(len(scored["index"]))
    cases = {
        # the loss column alone shuffled, the archive's seal kept: the seal no longer matches
        "loss_only": (dict(scored, loss=scored["loss"][order]), "differs from its seal", io.write_npz),
        # label and loss rows shuffled together, index kept, content hash and seal recomputed (an
        # unkeyed hash anyone can redo): the labels are no longer the data set's
        "rows": (dict(scored, label=scored["label"][order], loss=scored["loss"][order],
                      content_sha256=np.str_(provenance.array_sha256(scored["index"], scored["label"][order],
                                                                     scored["loss"][order]))), "field 'label'",
                 provenance.write_sealed_npz),
    }
    for name, (arrays, expected, write) in cases.items():
        path = tmp_path / f"{name}.npz"
        write(path, **arrays)
        proc = subprocess.run([sys.executable, str(ROOT / "stages/subset.py"), "--params", json.dumps({"mode": "hard"}),
                               "--losses", str(path), "--scorer-model", "scorer/model.pt", "--data", "data",
                               "--calibration", str(calibration), "--out", str(tmp_path / f"{name}_subset.npz")],
                              cwd=root, capture_output=True, text=True, timeout=300)
        assert proc.returncode != 0, name
        assert str(path) in proc.stderr and expected in proc.stderr, proc.stderr[-2000:]
        assert not (tmp_path / f"{name}_subset.npz").exists()


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")  # exited (a zombie nobody reaped yet counts as gone)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_stage_stops_when_its_snakemake_is_killed_and_the_rerun_resumes(tmp_path):
    import signal
    import time

    from tests.conftest import tiny_project

    def long_pretrain(params: dict) -> dict:
        params["profiles"]["quick"]["models"]["resnet18"] = {"width": 4, "epochs": 40, "milestones": [30],
                                                             "warmup_epochs": 1}
        return params

    project = tiny_project(tmp_path / "project", long_pretrain)
    bin_dir = Path(sys.executable).parent
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", MLFLOW_DISABLE_TELEMETRY="true")
    target = "runs/quick/table1/resnet18/s0/baseline/train.json"
    run_dir = project / "runs/quick/table1/resnet18/s0/baseline"
    with open(tmp_path / "snakemake.out", "wb") as out:
        snake = subprocess.Popen([str(bin_dir / "snakemake"), "--cores", "1", target], cwd=project, env=env,
                                 stdout=out, stderr=subprocess.STDOUT)
    try:
        stage_pid = None
        deadline = time.monotonic() + 900  # generous: a busy machine
        while time.monotonic() < deadline and stage_pid is None:
            assert snake.poll() is None, (tmp_path / "snakemake.out").read_text()[-3000:]
            lock = run_dir / ".pretrain.lock"
            if lock.exists() and lock.read_text().strip() and (faultlab.checkpoint_epoch(run_dir / "ckpt.pt") or 0) >= 1:
                stage_pid = int(watchdog._parse_holder(lock.read_text())["pid"])
            time.sleep(0.1)
        assert stage_pid is not None, "the training stage did not start"
    finally:
        os.kill(snake.pid, signal.SIGKILL)
        snake.wait(timeout=60)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not _gone(stage_pid):
        time.sleep(0.2)
    assert _gone(stage_pid), f"the stage (PID {stage_pid}) runs on as an orphan"
    assert not (run_dir / "train.json").exists()
    log = (project / "logs/quick/table1/resnet18/s0/baseline/pretrain.log").read_text()
    last = log.strip().splitlines()[-1]
    assert "stopping (an interrupted training resumes from its last checkpoint)" in last, last
    # The user's way back: unlock, re-run the incomplete job; it resumes from the checkpoint.
    subprocess.run([str(bin_dir / "snakemake"), "--unlock", target], cwd=project, env=env, check=True,
                   capture_output=True, timeout=600)
    rerun = subprocess.run([str(bin_dir / "snakemake"), "--cores", "1", "--rerun-incomplete", target], cwd=project,
                           env=env, capture_output=True, text=True, timeout=1800)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert faultlab.resumed_from(run_dir / "train.json") >= 1
