"""A shared folder's .snakemake/ is hostile ground (issue 48): whoever can write the project
folder but not the code plants links, FIFOs, files of other owners, Slurm job records and
incomplete markers in it. Real Snakemake runs of a tiny project: each plant stops the run in
one line naming it before any job, or is ignored in one line; nothing outside the project
is truncated, deleted or created, and no finished result is destroyed."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import built_one_budget_project, one_budget_table1, run_in, tiny_project

pytestmark = pytest.mark.slow

SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
SECRET = b"the victim's content\n"
CELL = "runs/quick/table1/resnet18/s0/t0.50_m0.55"


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> Path:
    return tiny_project(tmp_path_factory.mktemp("hostile") / "project", one_budget_table1)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return built_one_budget_project(tmp_path_factory.mktemp("hostile-built") / "project")


def _copy(project: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of ``project`` to attack, and a folder outside it holding the victim file."""
    copy, outside = tmp_path / "project", tmp_path / "outside"
    shutil.copytree(project, copy, symlinks=True)
    outside.mkdir()
    (outside / "victim").write_bytes(SECRET)
    return copy, outside


def _outside_state(outside: Path) -> dict[str, bytes]:
    return {str(p.relative_to(outside)): p.read_bytes() for p in sorted(outside.rglob("*")) if p.is_file()}


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


# ---- what .snakemake/ may hold ---------------------------------------------------------------------

def _jobs_file_and_temp_links(project: Path, outside: Path) -> str:
    """Item 1's first plant: a record to rewrite, and links at the rewrite's old temporary
    names (``darel-slurm-jobs.<pid>.tmp``) for the PIDs a new Snakemake may get."""
    folder = project / ".snakemake"
    folder.mkdir()
    # No job to cancel, so the old start-up went straight to the rewrite (through the link).
    (folder / "darel-slurm-jobs.tsv").write_text("not a record\n")
    for pid in range(os.getpid(), os.getpid() + 2000):
        (folder / f"darel-slurm-jobs.{pid}.tmp").symlink_to(outside / "victim")
    victim = re.escape(str(outside / "victim"))
    return rf"\.snakemake/darel-slurm-jobs\.\d+\.tmp is a link \(to {victim}\) \(and 1999 more\)"


def _locks_link(project: Path, outside: Path) -> str:
    (outside / "0.input.lock").write_bytes(SECRET)  # what the stale-lock clean-up removed
    (project / ".snakemake").mkdir()
    (project / ".snakemake/locks").symlink_to(outside)
    return f".snakemake/locks is a link (to {outside})"


def _log_link(project: Path, outside: Path) -> str:
    (project / ".snakemake").mkdir()
    (project / ".snakemake/log").symlink_to(outside)
    return f".snakemake/log is a link (to {outside})"


def _device_lock(kind: str):
    def plant(project: Path, outside: Path) -> str:
        lock = project / f".snakemake/darel-device/device-{socket.gethostname()}-local-all.lock"
        lock.parent.mkdir(parents=True)
        if kind == "link":
            lock.symlink_to(outside / "victim")
            return f"{lock.relative_to(project)} is a link (to {outside / 'victim'})"
        os.mkfifo(lock)
        return f"{lock.relative_to(project)} is a named pipe (FIFO)"
    return plant


def _hard_link(project: Path, outside: Path) -> str:
    (project / ".snakemake/metadata").mkdir(parents=True)
    os.link(outside / "victim", project / ".snakemake/metadata/cmVzdWx0cy90YWJsZTEuY3N2")
    return ".snakemake/metadata/cmVzdWx0cy90YWJsZTEuY3N2 is a file with 2 hard links"


def _another_owner(project: Path, outside: Path) -> str:
    marker = project / ".snakemake/incomplete/cmVzdWx0cy90YWJsZTEuY3N2"
    marker.parent.mkdir(parents=True)
    marker.write_text("{}")
    os.chown(marker, os.geteuid() + 4321, -1)
    return f".snakemake/incomplete/cmVzdWx0cy90YWJsZTEuY3N2 belongs to another user (uid {os.geteuid() + 4321})"


PLANTS = {"jobs-file-temp-links": _jobs_file_and_temp_links, "locks-link": _locks_link, "log-link": _log_link,
          "device-lock-link": _device_lock("link"), "device-lock-fifo": _device_lock("fifo"),
          "hard-link": _hard_link, "another-owner": _another_owner}


@pytest.mark.parametrize("name", list(PLANTS))
def test_a_plant_in_snakemake_folder_stops_the_run_in_one_line_before_any_job(fresh, tmp_path, name):
    if name == "another-owner" and os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    project, outside = _copy(fresh, tmp_path)
    first = PLANTS[name](project, outside)
    before = _outside_state(outside)
    out = run_in(project, SNAKEMAKE, "--cores", "1", "results/table1.csv", check=False, timeout=600)
    text = out.stdout + out.stderr
    lines = [line for line in text.splitlines() if line.startswith(".snakemake")]
    assert out.returncode != 0 and len(lines) == 1, text[-3000:]
    assert re.match(first if name == "jobs-file-temp-links" else re.escape(first), lines[0]), lines[0]
    assert lines[0].endswith("(nothing was run)"), lines[0]
    assert "Traceback" not in text and "Building DAG" not in text, text[-3000:]
    assert _outside_state(outside) == before
    assert sorted(p.name for p in outside.iterdir()) == sorted(before)  # nothing created there either
    for folder in ("data", "runs", "results/cells", "logs"):
        assert not (project / folder).exists(), folder


def test_a_snakemake_folder_that_is_a_link_out_leaves_no_file_there(fresh, tmp_path):
    """Snakemake itself makes .snakemake/log/ and opens its log file before the Snakefile
    runs: the refusal removes that (empty) file again. What no workflow code can undo is
    the empty log/ folder Snakemake made there first."""
    project, outside = _copy(fresh, tmp_path)
    (project / ".snakemake").symlink_to(outside)
    out = run_in(project, SNAKEMAKE, "--cores", "1", "results/table1.csv", check=False, timeout=600)
    text = out.stdout + out.stderr
    assert out.returncode != 0 and f".snakemake is a link (to {outside})" in text and "Traceback" not in text
    assert _outside_state(outside) == {"victim": SECRET}
    assert sorted(str(p.relative_to(outside)) for p in outside.rglob("*")) == ["log", "victim"]


# ---- finished work is never destroyed by a planted marker ---------------------------------------

def test_a_planted_incomplete_marker_over_a_finished_model_destroys_nothing(built, tmp_path):
    project, _ = _copy(built, tmp_path)
    model = project / CELL / "model.pt"
    weights, mtime = model.read_bytes(), model.stat().st_mtime_ns
    marker = project / ".snakemake/incomplete" / base64.urlsafe_b64encode(f"{CELL}/model.pt".encode()).decode()
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text("")
    out = run_in(project, SNAKEMAKE, "--cores", "1", "results/table1.csv", timeout=600)
    text = out.stdout + out.stderr
    said = [line for line in text.splitlines() if "marked incomplete" in line]
    assert len(said) == 1 and said[0].startswith(f"{CELL}/model.pt: marked incomplete in .snakemake/incomplete/ "), \
        text[-3000:]
    assert "ignored: marker removed" in said[0]
    assert "Nothing to be done" in text and "Forced execution" not in text, text[-3000:]
    assert model.read_bytes() == weights and model.stat().st_mtime_ns == mtime
    assert not marker.exists()


# ---- Slurm job records are never arguments --------------------------------------------------------------

FAKE_SLURM = """#!{python}
import json, os, sys
name = os.path.basename(sys.argv[0])
with open({log!r}, "a") as out:
    out.write(json.dumps([name, *sys.argv[1:]]) + "\\n")
if name == "squeue":
    print("999999|wrap|" + {project!r})
"""


def test_a_job_record_that_is_an_option_never_reaches_scancel(built, tmp_path):
    """Item 2: the record with job id ``--user=root`` (and one naming another host) made a
    local run call ``scancel --user=root 999999``. Now the option is named in one line and
    dropped; scancel gets ``--`` before the one job id Slurm confirms as this folder's."""
    project, _ = _copy(built, tmp_path)
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.jsonl"
    bin_dir.mkdir()
    for name in ("squeue", "scancel"):
        (bin_dir / name).write_text(FAKE_SLURM.format(python=sys.executable, log=str(log), project=str(project)))
        (bin_dir / name).chmod(0o755)
    dead = _dead_pid()
    (project / ".snakemake/darel-slurm-jobs.tsv").write_text(f"--user=root\t{dead}\tlogin2\t-\n"
                                                             f"999999\t{dead}\tlogin2\t-\n")
    out = run_in(project, SNAKEMAKE, "--cores", "1", "results/table1.csv", timeout=600,
                 env={"PATH": f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}"})
    text = out.stdout + out.stderr
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert [call for call in calls if call[0] == "scancel"] == [["scancel", "--", "999999"]], calls
    assert not any("--user=root" in arg for call in calls for arg in call)
    named = [line for line in text.splitlines() if "'--user=root'" in line]
    assert len(named) == 1 and "line 1 is not a Slurm job record" in named[0], text[-3000:]
    assert "cancelled 1 Slurm job(s) left by a Snakemake that was killed: 999999" in text
    assert (project / ".snakemake/darel-slurm-jobs.tsv").read_text() == ""
