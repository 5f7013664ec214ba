"""darel.preflight on its own: which cells an existing table holds, and which missing files
are a new cell's results (planned) rather than a damage (repaired); what .snakemake/ may hold
in a shared folder, and which incomplete markers a sealed record overrules."""

from __future__ import annotations

import base64
import logging
import os
import socket
from pathlib import Path

import pandas as pd
import pytest

from darel import config, preflight, provenance
from darel.layout import Layout
from tests.conftest import ROOT


def test_a_tables_cells_are_read_per_profile_and_seed(tmp_path):
    table = tmp_path / "table1.csv"
    pd.DataFrame([{"model": "resnet18", "cell": "baseline", "profile": "quick", "seeds": "0 1"},
                  {"model": "resnet18", "cell": "t0.80_m0.80", "profile": "quick", "seeds": "0"},
                  {"model": "resnet18", "cell": "baseline", "profile": "paper", "seeds": "2"}]).to_csv(table, index=False)
    assert preflight.built_cells(str(table), "quick") == {("resnet18", 0, "baseline"), ("resnet18", 1, "baseline"),
                                                          ("resnet18", 0, "t0.80_m0.80")}
    assert preflight.built_cells(str(table), "smoke") == set()
    table.write_text("not,a,table\n1,2,3\n")
    assert preflight.built_cells(str(table), "quick") is None  # unreadable: every cell counts as built
    assert preflight.built_cells(str(tmp_path / "none.csv"), "quick") is None


def test_a_new_budget_is_planned_not_repaired(tmp_path, monkeypatch):
    """Against a table of the committed quick budgets, one budget more: that cell alone is
    new, and only its own files are a new cell's (the baseline's and the data's are not)."""
    monkeypatch.chdir(tmp_path)
    cfg = config.load_params(ROOT / "params.yaml")
    layout = Layout(cfg["profile"])
    rows = [{"model": m, "cell": c, "profile": cfg["profile"], "seeds": str(s)} for m, s, c in config.table1_cells(cfg)]
    pd.DataFrame(rows).to_csv(tmp_path / "table1.csv", index=False)
    assert preflight.table1_new_cells(cfg, layout, str(tmp_path / "table1.csv")) == ([], set())
    more = config.merge(cfg, {})
    more["profiles"][cfg["profile"]]["table1"]["resnet18"].append([0.6, 0.6])
    cells, files = preflight.table1_new_cells(config.validate(more), layout, str(tmp_path / "table1.csv"))
    assert cells == ["resnet18/s0/t0.60_m0.60"]
    assert files and all("t0.60_m0.60" in f for f in files)
    # The other profile's cells are all new against this profile's table.
    other = config.merge(cfg, {"profile": "paper"})
    cells, _ = preflight.table1_new_cells(config.validate(other), Layout("paper"), str(tmp_path / "table1.csv"))
    assert len(cells) == len(config.table1_cells(other))


# ---- .snakemake/ in a shared folder (docs/security.md) --------------------------------------------

SECRET = "the victim's content\n"


@pytest.fixture()
def project(tmp_path, monkeypatch):
    """An empty project as the working folder with a .snakemake/ as Snakemake leaves it, and
    a folder outside holding a victim file."""
    root, outside = tmp_path / "project", tmp_path / "outside"
    for folder in (root / ".snakemake/metadata", root / ".snakemake/log", outside):
        folder.mkdir(parents=True)
    (root / ".snakemake/metadata/cnVucy94").write_text("{}")
    (root / ".snakemake/log/2026-01-01T000000.snakemake.log").write_text("a log\n")
    (outside / "victim").write_text(SECRET)
    monkeypatch.chdir(root)
    return outside


class _Workflow:
    """The Snakemake a user started (not a dry run), with Snakemake's logger manager."""

    def __init__(self, dry: bool = False, logfiles: dict | None = None):
        from snakemake_interface_executor_plugins.settings import ExecMode

        self.exec_mode = ExecMode.DEFAULT
        self.output_settings = type("Output", (), {"dryrun": dry})()
        self.logger_manager = type("Manager", (), {})()
        self.logger_manager.logger = logging.getLogger("test-snakemake")
        self.logger_manager.logfile_handlers = logfiles or {}


def _plant(kind: str, outside: Path) -> Path:
    """One hostile entry in .snakemake/, at a name the workflow or Snakemake writes."""
    target = Path({"link": ".snakemake/darel-slurm-jobs.4242.tmp", "dangling": ".snakemake/metadata/new",
                   "fifo": ".snakemake/darel-device/device-host-local-all.lock", "hardlink": ".snakemake/metadata/x",
                   "socket": ".snakemake/darel.sock", "owner": ".snakemake/incomplete/x",
                   "folder-link": ".snakemake/locks", "top": ".snakemake"}[kind])
    target.parent.mkdir(parents=True, exist_ok=True)
    if kind == "link":
        target.symlink_to(outside / "victim")
    elif kind == "dangling":
        target.symlink_to(outside / "created")
    elif kind == "fifo":
        os.mkfifo(target)
    elif kind == "hardlink":
        os.link(outside / "victim", target)
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(target))
        sock.close()
    elif kind == "owner":
        target.write_text("")
        os.chown(target, os.geteuid() + 4321, -1)
    elif kind == "folder-link":
        target.symlink_to(outside)
    else:
        os.rename(target, outside / "snakemake")
        target.symlink_to(outside / "snakemake")
    return target


KINDS = {"link": "is a link (to", "dangling": "is a link (to", "fifo": "is a named pipe (FIFO)",
         "hardlink": "is a file with 2 hard links", "socket": "is a socket", "owner": "belongs to another user",
         "folder-link": "is a link (to", "top": "is a link (to"}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_anything_but_plain_files_and_folders_of_ones_own_in_snakemake_stops_the_run(project, kind):
    if kind == "owner" and os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    assert preflight.snakemake_folder_problems() == []
    preflight.check_snakemake_folder(_Workflow())  # what Snakemake itself leaves there passes
    planted = _plant(kind, project)
    with pytest.raises(preflight.Refusal) as refused:
        preflight.check_snakemake_folder(_Workflow())
    line = str(refused.value)
    assert line.startswith(f"{planted} {KINDS[kind]}") and "\n" not in line and line.endswith("(nothing was run)")
    assert len(line) <= 300, line
    assert (project / "victim").read_text() == SECRET and not (project / "created").exists()


def test_a_log_snakemake_opened_through_a_link_is_closed_and_only_its_own_empty_file_removed(project):
    """Snakemake opens .snakemake/log/<time>.snakemake.log before any workflow code runs: with
    the folder a link out, the refusal closes it and removes the empty file it made there,
    and never a file it did not make (one that was there already keeps its content)."""
    import shutil

    shutil.rmtree(".snakemake/log")
    Path(".snakemake/log").symlink_to(project)
    made = os.path.abspath(".snakemake/log/2026-01-02T000000.snakemake.log")
    found = os.path.abspath(".snakemake/log/victim")
    handlers = {logging.FileHandler(made): made, logging.FileHandler(found): found}
    workflow = _Workflow(logfiles=dict(handlers))
    for handler in handlers:
        workflow.logger_manager.logger.addHandler(handler)
    with pytest.raises(preflight.Refusal, match=r"^\.snakemake/log is a link .*the empty log file Snakemake opened "):
        preflight.check_snakemake_folder(workflow)
    assert sorted(p.name for p in project.iterdir()) == ["victim"]
    assert (project / "victim").read_text() == SECRET
    assert workflow.logger_manager.logfile_handlers == {}
    assert not set(handlers) & set(workflow.logger_manager.logger.handlers)
    assert all(handler.stream is None for handler in handlers)  # closed


def test_the_stale_lock_clean_up_never_follows_a_linked_locks_folder(project, monkeypatch):
    monkeypatch.setattr(preflight, "_LIVE", [])
    (project / "0.input.lock").write_text("results/table1.csv\n")
    Path(".snakemake/locks").symlink_to(project)
    with pytest.raises(preflight.Refusal) as refused:
        preflight.clear_stale_locks(_Workflow())
    assert str(refused.value).startswith(".snakemake/locks is a link (to ") and "\n" not in str(refused.value)
    assert sorted(p.name for p in project.iterdir()) == ["0.input.lock", "victim"] and preflight._LIVE == []
    # A real folder: its lock files go, a link among them stays where it points, untouched.
    Path(".snakemake/locks").unlink()
    Path(".snakemake/locks").mkdir()
    Path(".snakemake/locks/0.output.lock").write_text("x\n")
    Path(".snakemake/locks/1.input.lock").symlink_to(project / "0.input.lock")
    try:
        assert preflight.clear_stale_locks(_Workflow()) == [".snakemake/locks/0.output.lock"]
    finally:
        for handle in preflight._LIVE:
            handle.close()
    assert (project / "0.input.lock").read_text() == "results/table1.csv\n"


CELL = Path("runs/quick/table1/resnet18/s0/baseline")


def _marker(output: str) -> Path:
    path = Path(".snakemake/incomplete") / base64.urlsafe_b64encode(output.encode()).decode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("")
    return path


def _finished_training() -> Path:
    CELL.mkdir(parents=True)
    (CELL / "model.pt").write_bytes(b"weights of a finished training")
    provenance.write_record(CELL / "train.json", {"model_sha256": provenance.file_sha256(CELL / "model.pt")})
    return CELL / "model.pt"


def test_an_incomplete_marker_over_a_sealed_output_is_dropped_and_a_real_one_kept(project, monkeypatch):
    model = _finished_training()
    planted, on_record = _marker(str(model)), _marker(str(CELL / "train.json"))
    said = []
    monkeypatch.setattr(preflight, "say", lambda line, key=None: said.append(line))
    # A dry run (no writer lock) says it and removes nothing.
    assert preflight.ignore_sealed_incomplete(_Workflow(dry=True)) == [] and planted.exists()
    monkeypatch.setattr(preflight, "_RUN", ["held"])
    removed = preflight.ignore_sealed_incomplete(_Workflow())
    assert sorted(removed) == [str(model), str(CELL / "train.json")]
    assert not planted.exists() and not on_record.exists()
    assert said[-1].startswith(f"{model} (and 1 more): marked incomplete in .snakemake/incomplete/ while ")
    assert "vouches that it is finished; ignored: marker removed" in said[-1] and "\n" not in said[-1]
    # Interrupted for real: weights the record does not vouch for, a record that is missing
    # or damaged. Their markers stay, and Snakemake re-runs the job.
    model.write_bytes(b"half-written weights")
    markers = [_marker(str(model))]
    assert preflight.ignore_sealed_incomplete(_Workflow()) == []
    (CELL / "train.json").write_text((CELL / "train.json").read_text().replace("model_sha256", "model_sha257"))
    markers.append(_marker(str(CELL / "train.json")))
    assert preflight.ignore_sealed_incomplete(_Workflow()) == []
    (CELL / "train.json").unlink()
    assert preflight.ignore_sealed_incomplete(_Workflow()) == []
    assert all(marker.exists() for marker in markers)


def test_a_marker_over_a_link_or_a_fifo_vouches_for_nothing(project, monkeypatch):
    model = _finished_training()
    monkeypatch.setattr(preflight, "_RUN", ["held"])
    elsewhere = CELL / "other.pt"
    elsewhere.symlink_to(model.resolve())
    fifo = CELL / "pipe.pt"
    os.mkfifo(fifo)
    markers = [_marker(str(elsewhere)), _marker(str(fifo)), _marker("/etc/passwd"), _marker("../outside/victim")]
    assert preflight.ignore_sealed_incomplete(_Workflow()) == []  # returns: the FIFO was never opened
    assert all(marker.exists() for marker in markers)
