"""DVC as its users expect it: plain `dvc repro` builds the three tables and nothing more
(the studies are the pipeline studies/dvc.yaml, run by naming it), a Table 1 budget leaves
the data stage alone, and a stage run outside the project's environment says in one line
how to enter it. In a tiny copy of the project, as tests/test_workflow.py."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import run_in, tiny_project

BIN = Path(sys.executable).parent
TABLES = {"data", "table1", "table2", "table3"}
STUDIES = {f"studies/dvc.yaml:study_table{n}" for n in (1, 2, 3)}


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return tiny_project(tmp_path_factory.mktemp("dvc_pipeline"), lambda params: params)


def _planned(project: Path, *targets: str) -> set[str]:
    """The stages `dvc repro [targets]` evaluates, in DVC's own words (it runs the changed ones)."""
    from dvc.dvcfile import PROJECT_FILE
    from dvc.repo import Repo
    from dvc.repo.reproduce import collect_stages, get_active_graph, plan_repro

    here = os.getcwd()
    os.chdir(project)  # DVC reads targets from the working folder, as on the command line
    try:
        with Repo(str(project)) as repo:
            stages = collect_stages(repo, list(targets) or [PROJECT_FILE])
            return {stage.addressing for stage in plan_repro(get_active_graph(repo.index.graph), stages)}
    finally:
        os.chdir(here)


def test_plain_dvc_repro_plans_the_tables_and_naming_the_studies_runs_them(project):
    assert _planned(project) == TABLES
    assert _planned(project, "studies/dvc.yaml") == STUDIES | {"data"}
    assert _planned(project, "studies/dvc.yaml:study_table1") == {"data", "studies/dvc.yaml:study_table1"}
    assert _planned(project, "studies/dvc.yaml:study_table2") == {"studies/dvc.yaml:study_table2"}
    # Every stage reads the project's params.yaml and writes where the Snakefile does.
    listed = run_in(project, str(BIN / "dvc"), "stage", "list", "--all").stdout
    assert {line.split()[0] for line in listed.splitlines() if line.strip()} == TABLES | STUDIES
    assert "Outputs results/study_table1.csv" in listed, listed


def _outside_path(tmp_path: Path) -> str:
    """PATH as a shell without the environment has it: `python` is the interpreter the
    environment was made from (no snakemake beside it), then the system's folders."""
    system = "/usr/bin:/bin"
    if shutil.which("snakemake", path=system):
        pytest.skip("this machine has a system-wide snakemake")
    outside = tmp_path / "bin"
    outside.mkdir()
    (outside / "python").symlink_to(os.path.realpath(sys._base_executable))
    return f"{outside}:{system}"


def test_a_stage_outside_the_environment_says_how_to_enter_it(project, tmp_path):
    """`.venv/bin/dvc repro` without activating the environment: one line, no traceback."""
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = _outside_path(tmp_path)
    proc = subprocess.run([str(BIN / "dvc"), "repro", "data"], cwd=project, env=env, capture_output=True, text=True,
                          timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    said = [line for line in out.splitlines() if "run `source .venv/bin/activate` (or `make dvc-repro`) first" in line]
    assert len(said) == 1 and said[0].startswith("dvc_run: "), out
    assert "Traceback" not in out and "FileNotFoundError" not in out, out
    assert not (project / "data/quick").exists()


def _edit_params(project: Path, edit) -> None:
    path = project / "params.yaml"
    params = yaml.safe_load(path.read_text())
    edit(params)
    path.write_text(yaml.safe_dump(params, sort_keys=False))


def _status(project: Path, stage: str) -> str:
    return run_in(project, str(BIN / "dvc"), "status", stage).stdout


@pytest.mark.slow
def test_a_table1_budget_leaves_the_data_stage_unchanged(project):
    """The data stage lists only what the data set depends on: a new Table 1 budget changes
    Table 1's stage, not the data's; a data set setting changes the data's."""
    run_in(project, str(BIN / "dvc"), "repro", "data", env={"PYTHONPATH": str(project)})
    up_to_date = "Data and pipelines are up to date."
    assert up_to_date in _status(project, "data")
    # What plain `dvc repro` would run now: the tables; the data is done, the studies are not its business.
    dry = run_in(project, str(BIN / "dvc"), "repro", "--dry", env={"PYTHONPATH": str(project)}).stdout
    assert set(re.findall(r"Running stage '([^']+)'", dry)) == {"table1", "table2", "table3"}, dry
    assert set(re.findall(r"Stage '([^']+)' didn't change", dry)) == {"data"}, dry
    try:
        _edit_params(project, lambda p: p["profiles"]["quick"]["table1"]["resnet18"].append([0.6, 0.9]))
        assert up_to_date in _status(project, "data")
        _edit_params(project, lambda p: p["datasets"]["synth"].update(label_noise=0.2))
        changed = _status(project, "data")
        assert "data:" in changed and "modified:           datasets" in changed, changed
    finally:
        run_in(project, "git", "checkout", "-q", "--", "params.yaml")
