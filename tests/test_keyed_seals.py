"""Keyed seals (darel.sealkey): a record, an archive or a checkpoint sealed without the user's
key is refused in one line; the key lives outside the project, private; a lab shares one on
purpose. Then the forgeries of issue 48 on a real built project, made by someone with write
access to the project folder but another home (so another key), and by a key holder who
edits a cell record without its sources."""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import sys
from pathlib import Path

import numpy as np
import pytest

from darel import io, provenance, records, sealkey
from tests.conftest import built_project_fixtures, one_budget_table1, run_in, tiny_project

SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
OTHER_KEY = "cd" * 32


@pytest.fixture()
def own_key(tmp_path, monkeypatch):
    """A home of our own: the default key file under a fresh XDG_CONFIG_HOME."""
    # empty counts as unset; setenv (unlike delenv of an absent name) restores them afterwards,
    # whatever the test or the code under test sets
    monkeypatch.setenv(sealkey.KEY_ENV, "")
    monkeypatch.setenv(sealkey.KEY_FILE_ENV, "")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "home" / ".config"))
    return tmp_path / "home" / ".config" / "darel" / "seal.key"


def test_the_default_key_is_made_once_private_and_outside_the_project(own_key, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a folder holding a home: no project (no Snakefile), the key may lie below
    first = sealkey.seal_key()
    assert own_key.is_file() and stat.S_IMODE(own_key.stat().st_mode) == 0o600
    assert len(first) == 32 and sealkey.seal_key() == first
    assert [p.name for p in own_key.parent.iterdir()] == ["seal.key"]  # no temporary left behind
    own_key.chmod(0o644)
    sealkey._key_for.cache_clear()
    with pytest.raises(sealkey.SealKeyError, match="lets others read or change it"):
        sealkey.seal_key()


def test_a_key_file_that_is_a_link_inside_the_project_or_not_hex_is_refused(own_key, tmp_path, monkeypatch):
    project = tmp_path / "project"
    project.mkdir()
    (project / "Snakefile").write_text("")
    monkeypatch.chdir(project)
    own_key.parent.mkdir(parents=True)
    target = tmp_path / "elsewhere.key"
    target.write_text("ab" * 32)
    target.chmod(0o600)
    own_key.symlink_to(target)
    with pytest.raises(sealkey.SealKeyError, match="a link"):
        sealkey.seal_key()
    inside = project / "seal.key"
    inside.write_text("ab" * 32)
    inside.chmod(0o600)
    monkeypatch.setenv(sealkey.KEY_FILE_ENV, str(inside))
    with pytest.raises(sealkey.SealKeyError, match="inside the project folder"):
        sealkey.seal_key()
    monkeypatch.delenv(sealkey.KEY_FILE_ENV)
    monkeypatch.setenv(sealkey.KEY_ENV, "not-a-key")
    with pytest.raises(sealkey.SealKeyError, match=f"{sealkey.KEY_ENV}: a seal key must be"):
        sealkey.seal_key()


def test_a_record_sealed_under_another_key_or_recomputed_without_one_is_refused(own_key, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "record.json"
    provenance.write_record(path, {"top1": 41.5})
    assert provenance.read_record(path) == {"top1": 41.5}

    monkeypatch.setenv(sealkey.KEY_ENV, OTHER_KEY)  # the forger's home
    provenance.write_record(path, {"top1": 99.0})
    monkeypatch.delenv(sealkey.KEY_ENV)
    with pytest.raises(provenance.ArtifactError, match=r"record\.json: was sealed with another key"):
        provenance.read_record(path)

    body = {"top1": 99.0}  # the old, unkeyed way: a plain sha256 anyone can compute
    path.write_text(json.dumps({**body, provenance.RECORD_KEY: provenance.content_sha256(body)}))
    with pytest.raises(provenance.ArtifactError, match="unkeyed or malformed seal"):
        provenance.read_record(path)

    forged = {**body, provenance.RECORD_KEY: f"hmac-sha256:{sealkey.key_id()}:" + "0" * 64}  # our key id, a guess
    path.write_text(json.dumps(forged))
    with pytest.raises(provenance.ArtifactError, match="differs from its seal"):
        provenance.read_record(path)


def test_an_archive_sealed_under_another_key_is_refused(own_key, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "losses.npz"
    monkeypatch.setenv(sealkey.KEY_ENV, OTHER_KEY)
    provenance.write_sealed_npz(path, loss=np.arange(5.0))
    monkeypatch.delenv(sealkey.KEY_ENV)
    with pytest.raises(provenance.ArtifactError, match="sealed with another key"):
        provenance.read_sealed_npz(path)
    provenance.write_sealed_npz(path, loss=np.arange(5.0))
    assert provenance.read_sealed_npz(path)["loss"].tolist() == [0, 1, 2, 3, 4]


def test_a_lab_shares_one_key_through_a_key_file(tmp_path, monkeypatch):
    """Two members, two homes, one key file given by DAREL_SEAL_KEY_FILE: each reads the
    other's records; a third without it cannot."""
    monkeypatch.chdir(tmp_path)
    shared = tmp_path / "lab" / "seal.key"
    shared.parent.mkdir()
    shared.write_text("5e" * 32 + "\n")
    shared.chmod(0o640)  # the lab's group may read it
    path = tmp_path / "record.json"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "alice"))
    monkeypatch.setenv(sealkey.KEY_FILE_ENV, str(shared))
    provenance.write_record(path, {"top1": 40.0})
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "bob"))
    assert provenance.read_record(path) == {"top1": 40.0}
    monkeypatch.delenv(sealkey.KEY_FILE_ENV)  # carol: her own default key
    with pytest.raises(provenance.ArtifactError, match="another key"):
        provenance.read_record(path)


def test_figure_disagreements_names_each_copied_figure_that_differs():
    cell = {"table": "table1", "time_s": 10.0, "top1": 40.0, "energy_kwh": 1e-4, "T_full_s": 20.0}
    sources = {"train": {"time_s": 10.0}, "eval": {"top1": 40.0}, "carbon": {"energy_kwh": 1e-3},
               "baseline_train": {"time_s": 20.0}}
    assert records.figure_disagreements(cell, sources) == ["energy_kwh 0.0001 but carbon energy_kwh 0.001"]
    assert records.figure_disagreements({**cell, "energy_kwh": 1e-3}, sources) == []


# ---- the forgeries, on a real project -------------------------------------------------------------

CELL = "runs/quick/table1/resnet18/s0/t0.50_m0.55"
CELL_JSON = "results/cells/quick/table1/resnet18/s0/t0.50_m0.55.json"


built, project = built_project_fixtures("keyed")  # a built project, and a copy per test


def _reseal(path: Path, record: dict, key_hex: str | None, cwd: Path) -> None:
    """Write ``record`` sealed as someone with ``key_hex`` would (None: the user's own key)."""
    saved = os.environ.get(sealkey.KEY_ENV), os.getcwd()
    try:
        os.chdir(cwd)
        if key_hex is None:
            os.environ.pop(sealkey.KEY_ENV, None)
        else:
            os.environ[sealkey.KEY_ENV] = key_hex
        body = {k: v for k, v in record.items() if k != provenance.RECORD_KEY}
        path.write_text(io.json_text(provenance.seal(body)))
    finally:
        os.chdir(saved[1])
        if saved[0] is None:
            os.environ.pop(sealkey.KEY_ENV, None)
        else:
            os.environ[sealkey.KEY_ENV] = saved[0]


def _divided(cell: dict) -> dict:
    """Time, memory and energy divided by 10, the results fingerprint recomputed: boost x10."""
    forged = dict(cell)
    for field in ("time_s", "time_total_s", "peak_mem_bytes", "energy_kwh", "co2e_kg"):
        if isinstance(forged.get(field), (int, float)):
            forged[field] = type(forged[field])(forged[field] / 10)
    return records.sealed_results({k: v for k, v in forged.items() if k != provenance.RESULTS_KEY})





@pytest.mark.slow
def test_forged_measurements_never_reach_the_table(project):
    """Issue 48 item 4: time, memory and energy of a cell divided by 10 and every seal
    recomputed. From another home (another key) the seal is refused; by a key holder, the
    table's cross-check against train.json refuses it. Either way no table holds the forged
    figures (Snakemake removes the output of the table job it ran, the table stage writes none)."""
    table = (project / "results/table1.csv").read_text()
    cell = json.loads((project / CELL_JSON).read_text())
    for key_hex, expected in ((OTHER_KEY, rf"{CELL_JSON}: was sealed with another key"),
                              (None, rf"{CELL_JSON}: does not hold the figures of the records it was made from "
                                     r"\(time_s [0-9.]+ but train time_s")):
        _reseal(project / CELL_JSON, _divided(cell), key_hex, project)
        out = run_in(project, SNAKEMAKE, "--cores", "1", "results/table1.csv", check=False)
        console = out.stdout + out.stderr
        assert out.returncode != 0 and re.search(expected, console), console[-3000:]
        now = project / "results/table1.csv"
        assert not now.exists() or now.read_text() == table


@pytest.mark.slow
def test_a_resealed_data_set_is_restored_and_trains_nothing_new(project):
    """Every training label shifted by one and meta.json resealed by someone without the key:
    the preflight finds meta.json's seal wrong and re-creates the data set's bytes from its
    parameters; nothing is retrained, the table is unchanged."""
    folder = next((project / "data").glob("quick*/**/meta.json")).parent
    before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir() if p.is_file()}
    table = (project / "results/table1.csv").read_text()
    arrays = dict(np.load(folder / "train.npz"))
    label_key = next(k for k in arrays if "label" in k)
    arrays[label_key] = (arrays[label_key] + 1) % (int(arrays[label_key].max()) + 1)
    io.write_npz(folder / "train.npz", **arrays)
    meta = json.loads((folder / "meta.json").read_text())
    meta["sha256"]["train.npz"] = io.file_sha256(folder / "train.npz")
    _reseal(folder / "meta.json", meta, OTHER_KEY, project)
    out = run_in(project, SNAKEMAKE, "--cores", "1", "results/table1.csv")
    after = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir() if p.is_file()}
    assert after == before, out.stdout[-2000:] + out.stderr[-2000:]
    assert (project / "results/table1.csv").read_text() == table
    assert "Nothing to be done" in out.stdout + out.stderr


@pytest.mark.slow
def test_forged_calibrations_from_another_project_are_refused_in_one_line(project, tmp_path_factory):
    """`calibrations_from=<folder>`: a calibration sealed with another key, one moved from
    another cell's place, and one planning more epochs than the protocol (sealed by a key
    holder) are each refused naming the file, before the cell trains."""
    source = project / f"{CELL}/calibration.json"
    calibration = json.loads(source.read_text())
    cases = [
        ("another key", calibration, OTHER_KEY),
        ("another place", {**calibration, "identity": {**calibration["identity"], "cell": "t0.70_m0.70"}}, None),
        ("too many epochs", {**calibration, "planned_epochs": 1000}, None),
    ]
    expected = {"another key": "was sealed with another key", "another place": "instead of 't0.50_m0.55'",
                "too many epochs": "plans 1000 epochs, more than this protocol's 2"}
    second = tiny_project(tmp_path_factory.mktemp("reuser") / "project", one_budget_table1)
    for name, record, key_hex in cases:
        _reseal(source, record, key_hex, project)
        out = run_in(second, SNAKEMAKE, "--cores", "1", f"{CELL}/calibration.json", "--config",
                     f"calibrations_from={project}", check=False)
        lines = [line for line in (out.stdout + out.stderr).splitlines() if line.startswith("calibrations_from:")]
        assert out.returncode != 0 and lines and expected[name] in lines[0], (name, (out.stdout + out.stderr)[-3000:])
        assert str(source) in lines[0] and "Traceback" not in (second / "logs").joinpath(
            "quick/table1/resnet18/s0/t0.50_m0.55/calibrate.log").read_text()
        assert not (second / CELL / "calibration.json").exists()


@pytest.mark.slow
def test_a_marker_naming_another_cells_run_deletes_nothing(project):
    """Issue 48 item 5: the baseline's mlflow.json resealed (by a key holder) to name the budget
    cell's run: the table stage stops naming it, and both runs stay in the store."""
    import mlflow
    from mlflow.tracking import MlflowClient

    baseline_marker = project / "runs/quick/table1/resnet18/s0/baseline/mlflow.json"
    cell_marker = json.loads((project / CELL / "mlflow.json").read_text())
    marker = json.loads(baseline_marker.read_text())
    _reseal(baseline_marker, {**marker, "run_id": cell_marker["run_id"]}, None, project)
    (project / "results/table1.csv").unlink()
    out = run_in(project, SNAKEMAKE, "--cores", "1", "results/table1.csv", check=False)
    console = out.stdout + out.stderr
    assert out.returncode != 0 and f"names run {cell_marker['run_id']}, which is the run of" in console, console[-3000:]
    mlflow.set_tracking_uri(f"sqlite:///{project / 'mlflow.db'}")
    client = MlflowClient()
    for run_id in (marker["run_id"], cell_marker["run_id"]):
        assert client.get_run(run_id).info.lifecycle_stage == "active"


def test_jobs_are_pointed_at_the_submitters_key_file(own_key, tmp_path, monkeypatch):
    """A job on a node whose home differs must not make a key of its own: the workflow
    exports the key file's absolute path, and a job that cannot find it stops naming it."""
    monkeypatch.chdir(tmp_path)
    key = sealkey.seal_key()
    sealkey.export_for_jobs()
    assert os.environ[sealkey.KEY_FILE_ENV] == str(own_key)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "node-home"))  # another node's home
    assert sealkey.seal_key() == key and not (tmp_path / "node-home").exists()
    own_key.rename(tmp_path / "moved.key")
    sealkey._key_for.cache_clear()
    with pytest.raises(sealkey.SealKeyError, match="no such key file"):
        sealkey.seal_key()
