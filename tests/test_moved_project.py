"""A built project copied to another folder, the original gone: its tracking jobs write into
the copy's own mlartifacts/ (the store's recorded artifact folders follow it) and nothing
recreates the original."""
from __future__ import annotations

import shutil
import sqlite3
import sys
from pathlib import Path

from tests.conftest import built_one_budget_project, run_in

SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))


def _recorded_locations(db: Path) -> list[str]:
    with sqlite3.connect(db) as con:
        return ([row[0] for row in con.execute("SELECT artifact_location FROM experiments")]
                + [row[0] for row in con.execute("SELECT artifact_uri FROM runs")])


def test_a_copied_built_project_tracks_into_its_own_folder(tmp_path):
    original = built_one_budget_project(tmp_path / "original")
    # (MLflow's Default experiment records a plain path, the others a file: URI)
    assert all(loc.startswith((original.as_uri() + "/", f"{original}/"))
               for loc in _recorded_locations(original / "mlflow.db"))
    copy = tmp_path / "copy"
    shutil.copytree(original, copy, symlinks=True)
    shutil.rmtree(original)

    proc = run_in(copy, SNAKEMAKE, "--cores", "2", "--forcerun", "track_cell", "table1", "--", "results/table1.csv")

    assert not original.exists(), proc.stderr[-3000:]
    locations = _recorded_locations(copy / "mlflow.db")
    assert locations and all(loc.startswith((copy.as_uri() + "/", f"{copy}/")) for loc in locations)
    with sqlite3.connect(copy / "mlflow.db") as con:
        active = [row[0] for row in con.execute("SELECT artifact_uri FROM runs WHERE lifecycle_stage = 'active'")]
    # The rerun tracking jobs' artifacts (each cell's record, the table's files) are in the copy.
    assert active and all(any(Path(uri.removeprefix("file://")).iterdir()) for uri in active)
