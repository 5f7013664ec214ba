"""A shared folder cannot turn the workflow against its user (docs/security.md, "A shared
folder"): no write follows a link out of the project, a lock file is never opened through
a link or truncated when it holds something else, the track stage attaches no link, and a
record copied to another place (another cell, another profile, beside other inputs) stops
its reader in one line naming both places. Unit tests: seconds, no Snakemake."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from darel import io, preflight, provenance, tracking
from darel.provenance import ArtifactError
from darel.stagekit import cli, watchdog

SECRET = "the victim's content\n"
BASE = "runs/quick/table1/resnet18/s0/baseline"
BUDGET = "runs/quick/table1/resnet18/s0/t0.50_m0.55"


@pytest.fixture()
def project(tmp_path, monkeypatch):
    """An empty project as the working folder, a victim file and an empty folder outside it."""
    root, outside = tmp_path / "project", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "victim").write_text(SECRET)
    monkeypatch.chdir(root)
    return outside


# ---- no write follows a link ---------------------------------------------------------------------

@pytest.mark.parametrize("name", ["report", "track"])
def test_a_lock_file_that_is_a_link_is_refused_and_its_target_untouched(project, name):
    Path(BUDGET).mkdir(parents=True)
    lock = Path(BUDGET) / f".{name}.lock"
    lock.symlink_to(project / "victim")
    with pytest.raises(SystemExit) as stop:
        watchdog.claim_folder(BUDGET, name, logging.getLogger("test"))
    assert str(lock) in str(stop.value) and "link" in str(stop.value) and "\n" not in str(stop.value)
    assert (project / "victim").read_text() == SECRET


def test_a_lock_file_holding_something_else_is_never_truncated(project):
    Path(BUDGET).mkdir(parents=True)
    (Path(BUDGET) / ".report.lock").write_text("not a lock record: someone's notes\nline two\n")
    with pytest.raises(SystemExit, match=r"\.report\.lock is a file that holds something other than a lock record"):
        watchdog.claim_folder(BUDGET, "report", logging.getLogger("test"))
    assert (Path(BUDGET) / ".report.lock").read_text().startswith("not a lock record")
    (Path(BUDGET) / ".report.lock").write_text("pid=1 host=elsewhere\n")  # an old holder's record: reused
    watchdog.claim_folder(BUDGET, "report", logging.getLogger("test"))
    assert (Path(BUDGET) / ".report.lock").read_text() == watchdog.holder_record() + "\n"


@pytest.mark.parametrize("link", ["runs/smoke", "results/cells/smoke", "logs/smoke"])
def test_no_record_is_written_through_a_folder_link(project, link):
    Path(link).parent.mkdir(parents=True, exist_ok=True)
    Path(link).symlink_to(project)
    target = f"{link}/table1/resnet18/s0/baseline.json"
    with pytest.raises(io.LinkError) as refused:
        provenance.write_record(target, {"top1": 1.0})
    assert str(refused.value).startswith(f"{link} is a link to {project}") and "\n" not in str(refused.value)
    assert sorted(p.name for p in project.iterdir()) == ["victim"]
    with pytest.raises(SystemExit, match=f"{link} is a link"):  # a stage's log file: refused the same way
        cli.start(cli.parser("x").parse_args(["--log", f"{link}/x.log"]), "x")
    with pytest.raises(io.LinkError, match=f"{link} is a link"):  # a folder save_pretrained writes
        io.save_folder(f"{link}/table2/gpt2-small/s0/lora/adapter")
    assert sorted(p.name for p in project.iterdir()) == ["victim"]
    # An absolute path outside the project is its caller's choice (tests, users' scripts).
    io.write_json(project / "chosen.json", {"a": 1})


def test_a_log_that_is_a_link_inside_the_project_is_replaced_not_followed(project):
    Path("logs").mkdir()
    Path("keep.txt").write_text("kept\n")
    Path("logs/train.log").symlink_to(Path("keep.txt").resolve())
    with io.fresh_file("logs/train.log") as log:
        log.write("new\n")
    assert Path("keep.txt").read_text() == "kept\n" and not Path("logs/train.log").is_symlink()


def test_the_stores_lock_is_never_created_through_a_dangling_link(project):
    Path("mlflow.db.lock").symlink_to(project / "created-by-the-lock")
    with pytest.raises(tracking.TrackingError, match="mlflow.db.lock is a link"):
        with tracking._exclusive_lock(Path("mlflow.db.lock")):
            pass
    assert not (project / "created-by-the-lock").exists()


def test_the_track_stage_attaches_no_link(project):
    from stages.track import copy_plain, stage_logs

    logs = Path("logs/quick/table1/resnet18/s0/baseline")
    logs.mkdir(parents=True)
    (logs / "pretrain.log").write_text("trained\n")
    (logs / "secret.log").symlink_to(project / "victim")
    os.link(logs / "pretrain.log", logs / "hardlinked.log")
    (logs / "score.log").write_text("scored\n")
    assert [Path(p).name for p in stage_logs([str(logs)], own=str(logs / "track.log"))] == ["score.log"]
    with pytest.raises(OSError):  # a link put in place after the listing
        copy_plain(logs / "secret.log", Path("copy"))
    assert not Path("copy").exists()


def test_the_preflight_names_a_link_out_of_the_project_before_any_job(project):
    Path("runs").mkdir()
    Path("data/raw").mkdir(parents=True)
    (Path("data/raw") / "cifar-100-python.tar.gz").symlink_to(project / "victim")  # an input: fine
    Path("runs/inner").symlink_to(Path("data").resolve())  # leads inside: fine
    preflight.check_links(["mlflow.db", "mlflow.db.lock"])
    Path("mlflow.db").symlink_to(project / "elsewhere.db")
    with pytest.raises(preflight.Refusal) as refused:
        preflight.check_links(["mlflow.db", "mlflow.db.lock"])
    assert str(refused.value).startswith(f"mlflow.db is a link to {project / 'elsewhere.db'}")


# ---- records bound to their place and their inputs ------------------------------------------------

def _train(folder: str, **inputs) -> Path:
    path = Path(folder) / "train.json"
    provenance.write_record(path, {"batch": 128, "epochs_completed": 3}, inputs=inputs or None)
    return path


def test_a_record_copied_into_another_cell_names_both_places(project):
    _train(BASE)
    Path(BUDGET).mkdir(parents=True)
    shutil.copy(f"{BASE}/train.json", f"{BUDGET}/train.json")
    with pytest.raises(ArtifactError) as refused:
        provenance.read_record(f"{BUDGET}/train.json")
    line = str(refused.value)
    assert line.startswith(f"{BUDGET}/train.json: holds the record written as {BASE}/train.json") and "\n" not in line
    assert "cell 'baseline' instead of 't0.50_m0.55'" in line and "rule train_online re-creates it" in line
    assert provenance.read_record(f"{BASE}/train.json")["identity"]["method"] == "baseline"


def test_another_profiles_record_is_refused(project):
    theirs, ours = ("results/cells/other/table1/resnet18/s0/ids_adonis.json",
                    "results/cells/quick/table1/resnet18/s0/ids_adonis.json")
    provenance.write_record(theirs, {"top1": 50.0})
    Path(ours).parent.mkdir(parents=True)
    shutil.copy(theirs, ours)
    with pytest.raises(ArtifactError, match=f"{ours}: holds the record written as {theirs} \\(profile 'other' "
                                            "instead of 'quick'\\)"):
        provenance.read_record(ours)


def test_an_adapter_copied_into_another_alpha_cell_is_refused(project):
    lora, alpha = "runs/quick/table2/gpt2-small/s0/lora/adapter", "runs/quick/table2/gpt2-small/s0/a0.80/adapter"
    Path(lora).mkdir(parents=True)
    (Path(lora) / "adapter_model.safetensors").write_bytes(b"weights")
    provenance.write_folder_record(lora, "train.json", {"time_s": 1.0})
    shutil.copytree(lora, alpha)
    with pytest.raises(ArtifactError, match="cell 'lora' instead of 'a0.80', method 'lora' instead of 'darel'"):
        provenance.check_folder(alpha, "train.json")


def test_a_training_is_checked_against_the_calibration_the_report_is_given(project):
    Path(BUDGET).mkdir(parents=True)
    ours, other = Path(BUDGET) / "calibration.json", Path("other-calibration.json")
    provenance.write_record(ours, {"batch": 64})
    provenance.write_record(other, {"batch": 128})
    train = _train(BUDGET, calibration=ours)
    assert provenance.read_record(train, inputs={"calibration": ours})["batch"] == 128
    with pytest.raises(ArtifactError) as refused:
        provenance.read_record(train, inputs={"calibration": other})
    assert f"{train}: was made from another calibration than {other}" in str(refused.value)
    baseline = _train(BASE)  # a baseline records no calibration: it cannot pose as a budget's training
    with pytest.raises(ArtifactError, match="records no sha256 of its calibration"):
        provenance.read_record(baseline, inputs={"calibration": ours})


def test_a_sealed_array_copied_to_another_cell_is_refused(project):
    subset = f"{BUDGET}/subset.npz"
    provenance.write_sealed_npz(subset, indices=np.arange(5))
    other = "runs/quick/table1/resnet18/s0/t0.80_m0.80/subset.npz"
    Path(other).parent.mkdir(parents=True)
    shutil.copy(subset, other)
    assert provenance.read_sealed_npz(subset)["indices"].tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(ArtifactError, match=f"{other}: holds the record written as {subset}"):
        provenance.read_sealed_npz(other)


def test_the_tables_take_run_ids_only_from_markers_of_their_own_cells(project):
    cell = "results/cells/quick/table1/resnet18/s0/baseline.json"
    provenance.write_record(cell, {"top1": 70.0})
    provenance.write_record(f"{BASE}/mlflow.json", {"run_id": "abc", "cell_key": "quick/resnet18/s0/baseline",
                                                    "experiment": "table1"}, inputs={"cell": cell})
    assert cli.sealed_run_ids([cell]) == {"quick/resnet18/s0/baseline": "abc"}
    provenance.write_record(cell, {"top1": 71.0})  # a new cell record: the marker is of the old one
    with pytest.raises(ArtifactError, match=f"{BASE}/mlflow.json: was made from another cell than {cell}"):
        cli.sealed_run_ids([cell])


def test_hyps_must_be_the_outputs_the_evaluation_scored(project):
    from stages.cell_record import check_hyps

    Path("hyps.txt").write_text("a sentence\n")
    check_hyps("hyps.txt", {"hyps_sha256": io.file_sha256("hyps.txt")}, "eval.json", logging.getLogger("t"))
    Path("hyps.txt").write_text("another sentence\n")
    with pytest.raises(SystemExit, match="hyps.txt is not the output eval.json scored"):
        check_hyps("hyps.txt", {"hyps_sha256": "0" * 64}, "eval.json", logging.getLogger("t"))


# ---- secrets ---------------------------------------------------------------------------------------

def test_a_password_in_the_tracking_uri_is_refused_and_never_echoed(project, monkeypatch, capsys):
    """A password in tracking.uri (params.yaml or --config) stops the run in one line that
    hides it and says where to give it (issue 48: Snakemake prints and logs its command
    line); the summary of a store without one still shows no control character."""
    import yaml

    from darel import config
    from darel.tools import summary
    from tests.conftest import ROOT

    uri = "postgresql://user:MARKER-pw@db.example:5432/mlflow"
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["tracking"]["uri"] = uri
    Path("params.yaml").write_text(yaml.safe_dump(params))
    for load in (lambda: config.load_params("params.yaml"),
                 lambda: config.workflow_config(ROOT / "params.yaml", {"tracking": {"uri": uri}})):
        with pytest.raises(config.ConfigError) as err:
            load()
        line = str(err.value)
        assert line.startswith("params: tracking.uri = 'postgresql://user:***@db.example:5432/mlflow': holds a "
                               "password") and "PGPASSWORD" in line and "MARKER" not in line, line
    # What still hides a password that reaches a message some other way (a driver's error).
    monkeypatch.setenv(tracking.URI_ENV, uri)
    assert "MARKER" not in tracking.scrub(f"could not connect to {uri} (password MARKER-pw refused)")
    assert tracking.redacted(uri) == "postgresql://user:***@db.example:5432/mlflow"
    plain = "postgresql://user@db.example:5432/mlflow"  # a user without a password is allowed
    monkeypatch.setattr(summary, "store_experiments",
                        lambda *_: {"table1\x1b[2J\x1b]0;owned\x07": {"cells": 3, "tables": 1, "other": 0}})
    monkeypatch.setattr(summary.config, "load_params", lambda _: {"profile": "quick", "tracking": {"uri": plain}})
    monkeypatch.setattr("sys.argv", ["summary"])
    summary.main()
    out = capsys.readouterr().out
    assert "MARKER" not in out and plain in out and "\x1b" not in out and "\x07" not in out
