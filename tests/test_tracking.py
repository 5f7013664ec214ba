from __future__ import annotations

import math
import multiprocessing
import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

from darel import tracking  # noqa: E402
from tests.conftest import ROOT  # noqa: E402

EXPERIMENT = "table1-test"


def _log(uri: str, cell: str, top1: float, tmp_path: Path, epochs: int = 3) -> str:
    artifact = tmp_path / f"{cell}.json"
    artifact.write_text('{"cell": "%s"}' % cell)
    return tracking.log_cell_run(
        uri, EXPERIMENT, cell,
        params={"model": "resnet18", "budget": {"t": 0.8, "m": 0.7}, "milestones": [4, 7]},
        metrics={"top1": top1, "co2e_kg": None, "energy_kwh": math.nan, "boost": 1.25},
        curves={"train_loss": [2.0 - 0.1 * i for i in range(epochs)], "lr": [0.1] * epochs},
        tags={"profile": "quick"},
        artifacts=[artifact],
    )


def _client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _active_runs(uri: str):
    from mlflow.entities import ViewType

    client = _client(uri)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    return client.search_runs([experiment.experiment_id], run_view_type=ViewType.ACTIVE_ONLY)


def test_one_run_per_cell_after_relogging(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    first = _log(uri, "baseline", 70.0, tmp_path)
    _log(uri, "t0.80_m0.70", 60.0, tmp_path)
    again = _log(uri, "baseline", 71.5, tmp_path, epochs=4)

    runs = _active_runs(uri)
    assert sorted(r.data.tags["cell_key"] for r in runs) == ["baseline", "t0.80_m0.70"]
    relogged = next(r for r in runs if r.data.tags["cell_key"] == "baseline")
    assert relogged.info.run_id == again != first
    assert relogged.info.run_name == "baseline"
    assert relogged.info.status == "FINISHED"
    assert relogged.data.metrics["top1"] == 71.5
    assert relogged.data.params["budget.t"] == "0.8"
    assert relogged.data.params["milestones"] == "[4, 7]"
    assert relogged.data.tags["missing_metrics"] == "co2e_kg,energy_kwh"
    assert relogged.data.tags["profile"] == "quick"
    for key in ("git_commit", "git_dirty", "device", "torch_version", "mlflow_version", "hostname"):
        assert relogged.data.tags[key]
    assert "co2e_kg" not in relogged.data.metrics

    client = _client(uri)
    history = client.get_metric_history(again, "train_loss")
    assert sorted(m.step for m in history) == [0, 1, 2, 3]
    assert [m.value for m in sorted(history, key=lambda m: m.step)] == pytest.approx([2.0, 1.9, 1.8, 1.7])
    assert [a.path for a in client.list_artifacts(again)] == ["baseline.json"]
    # The artifact store sits beside the database, not in the working folder.
    assert (tmp_path / "mlartifacts").is_dir()
    assert tracking.lock_path_for(uri) == tmp_path / "mlflow.db.lock"


def test_table_deletes_runs_of_cells_that_left_it_and_restores_them_when_they_come_back(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    kept = _log(uri, "baseline", 70.0, tmp_path)
    left = _log(uri, "t0.80_m0.70", 60.0, tmp_path)
    counts = tracking.follow_table(uri, EXPERIMENT, "quick", {"baseline": {"boost": 1.0}}, "quick/table1", [])
    assert counts == {"updated": 1, "deleted": 1, "restored": 0, "foreign": 0}
    cells = sorted(r.data.tags["cell_key"] for r in _active_runs(uri))
    assert cells == ["baseline", "quick/table1"]
    rows = {"baseline": {"boost": 1.0}, "t0.80_m0.70": {"boost": 1.4, "acc_drop_pp": None}}
    counts = tracking.follow_table(uri, EXPERIMENT, "quick", rows, "quick/table1", [])
    assert counts == {"updated": 1, "deleted": 0, "restored": 1, "foreign": 0}
    runs = {r.data.tags["cell_key"]: r for r in _active_runs(uri)}
    assert sorted(runs) == ["baseline", "quick/table1", "t0.80_m0.70"]  # one table run, the old one replaced
    assert runs["t0.80_m0.70"].info.run_id == left and runs["baseline"].info.run_id == kept
    assert runs["t0.80_m0.70"].data.metrics["boost"] == 1.4
    # A run written into the store under a row's key is not the row's: with the run ids the
    # cells' mlflow.json sealed, the table deletes it instead of showing it in its view.
    experiment_id = _client(uri).get_experiment_by_name(EXPERIMENT).experiment_id
    forged = _client(uri).create_run(experiment_id, run_name="baseline", tags={
        "cell_key": "baseline", "profile": "quick", "scope": "table", "state": "finished"}).info.run_id
    counts = tracking.follow_table(uri, EXPERIMENT, "quick", rows, "quick/table1", [],
                                   run_ids={"baseline": kept, "t0.80_m0.70": left})
    assert counts == {"updated": 2, "deleted": 0, "restored": 0, "foreign": 1}
    assert forged not in {r.info.run_id for r in _active_runs(uri)}


def test_rejects_bad_input(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with pytest.raises(ValueError, match="cell_key"):
        tracking.log_cell_run(uri, EXPERIMENT, "it's", {}, {}, {}, {}, [])
    with pytest.raises(ValueError, match="missing.json"):
        tracking.log_cell_run(uri, EXPERIMENT, "c", {}, {}, {}, {}, [tmp_path / "missing.json"])
    with pytest.raises(ValueError, match="top1"):
        tracking.log_cell_run(uri, EXPERIMENT, "c", {}, {"top1": "high"}, {}, {}, [])
    with pytest.raises(ValueError, match="loss"):
        tracking.log_cell_run(uri, EXPERIMENT, "c", {}, {"loss": 1.0}, {"loss": [1.0]}, {}, [])


def test_environment_tags_outside_git_is_labelled(monkeypatch, tmp_path):
    monkeypatch.setattr(tracking, "REPO_ROOT", tmp_path)
    tags = tracking.environment_tags()
    assert tags["git_commit"] == "unknown" and tags["git_dirty"] == "unknown"
    assert tags["python_version"].count(".") == 2


def test_environment_tags_ask_no_torch_where_the_job_has_not_loaded_it():
    """The tracking job has no use for torch: its device tag comes from NVML (here: no
    GPU, so the CPU's model), without the seconds of torch's import."""
    import subprocess

    probe = ("import sys\nfrom darel import tracking\ntags = tracking.environment_tags()\n"
             "print('torch' in sys.modules, tags['device'])")
    for visible in (None, ""):
        env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
        if visible is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible
        done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=600, check=True)
        loaded, device = done.stdout.strip().split(" ", 1)
        assert loaded == "False"
        import torch

        if visible == "" or not torch.cuda.is_available():
            assert device.startswith("cpu: "), device
        else:
            assert device == f"cuda: {torch.cuda.get_device_name(0)}"


def _log_in_child(uri: str, cell: str, folder: str) -> None:
    _log(uri, cell, 50.0, Path(folder))


def test_concurrent_processes_do_not_collide(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    ctx = multiprocessing.get_context("spawn")
    children = [ctx.Process(target=_log_in_child, args=(uri, cell, str(tmp_path))) for cell in ("a", "b")]
    for child in children:
        child.start()
    for child in children:
        child.join(timeout=240)
    assert [child.exitcode for child in children] == [0, 0]
    assert sorted(r.data.tags["cell_key"] for r in _active_runs(uri)) == ["a", "b"]


def test_dvc_experiment_runs_never_share_a_name_with_the_tables_own(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    rows = {"baseline": {"boost": 1.0}}
    _log(uri, "baseline", 80.0, tmp_path)
    tracking.follow_table(uri, EXPERIMENT, "quick", rows, "quick/table1", [])
    monkeypatch.setenv("DVC_EXP_NAME", "busy-pams")
    _log(uri, "baseline", 81.0, tmp_path)
    tracking.follow_table(uri, EXPERIMENT, "quick", rows, "quick/table1", [])
    names = sorted(run.info.run_name for run in _active_runs(uri))
    assert names == ["baseline", "baseline [dvc exp busy-pams]", "quick/table1", "quick/table1 [dvc exp busy-pams]"]


def test_the_view_of_generated_data_says_so_in_its_name(tmp_path):
    """A profile whose runs carry a GENERATED data label gets a view named so (the Views menu
    and make mlflow-ui's directions show it); another profile's real data does not."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    for profile, label in (("quick", "GENERATED: synth benchmark, cpu size"), ("paper", "CIFAR-100")):
        tracking.log_cell_run(uri, "table1", f"{profile}/resnet18/s0/baseline", {}, {"top1": 80.0}, {},
                              {"profile": profile, "dataset_label": label}, [])
    experiment_id = tracking.prepare_table_view(uri, "table1", "quick")
    assert tracking.saved_view_name(uri, experiment_id, "quick") == "Table 1 (quick profile, GENERATED data)"
    assert tracking.prepare_table_view(uri, "table1", "paper") == experiment_id
    assert tracking.saved_view_name(uri, experiment_id, "paper") == "Table 1 (paper profile)"
    assert tracking.saved_view_name(uri, experiment_id, "gpu") is None  # no view saved for it


def test_the_experiment_describes_its_table_its_profiles_data_and_that_generated_figures_are_not_the_papers(tmp_path):
    """The experiment's description (the tag the UI shows on the experiment page) says what
    the table is, each profile's data label and view, and, where the data is GENERATED,
    that the figures are not the paper's; a DVC experiment's run does not change it."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracking.log_cell_run(uri, "table1", "quick/resnet18/s0/baseline", {}, {"top1": 80.0}, {},
                          {"profile": "quick", "dataset_label": "GENERATED: synth benchmark, cpu size"}, [])
    experiment_id = tracking.prepare_table_view(uri, "table1", "quick")
    described = _client(uri).get_experiment(experiment_id).tags[tracking.DESCRIPTION_TAG]
    assert described.splitlines() == [
        "Table 1 of the DAREL paper, reproduced: quick profile on GENERATED data, whose figures are not the paper's "
        "results.",
        "",
        "Per model (ResNet18, ResNet18-HC) the full-data baseline, DAREL under each time and memory budget B(t, m) "
        "and IDS + ADONIS, with boost, top-1 drop, memory and CO2e cut, each beside the paper's figure for the same "
        "row (`<name> paper`).",
        "",
        "- quick profile: data GENERATED: synth benchmark, cpu size; its view in the Views menu: Table 1 (quick "
        "profile, GENERATED data)",
        "",
        "Figures on GENERATED data test the methods at this scale on data made on the machine; they are not the "
        "paper's results and not comparable with its CIFAR-100 / E2E / WebNLG figures."]
    os.environ["DVC_EXP_NAME"] = "tiny-exp"
    try:  # not the table's own run: the description ignores it
        tracking.log_cell_run(uri, "table1", "gpu/resnet18/s0/baseline", {}, {"top1": 1.0}, {},
                              {"profile": "gpu", "dataset_label": "CIFAR-100"}, [])
    finally:
        del os.environ["DVC_EXP_NAME"]
    tracking.log_cell_run(uri, "table1", "paper/resnet18/s0/baseline", {}, {"top1": 80.0}, {},
                          {"profile": "paper", "dataset_label": "CIFAR-100"}, [])
    tracking.prepare_table_view(uri, "table1", "paper")
    both = _client(uri).get_experiment(experiment_id).tags[tracking.DESCRIPTION_TAG].splitlines()
    assert both[0] == ("Table 1 of the DAREL paper, reproduced: paper profile on CIFAR-100; quick profile on "
                       "GENERATED data, whose figures are not the paper's results.")
    assert both[4:6] == ["- paper profile: data CIFAR-100; its view in the Views menu: Table 1 (paper profile)",
                         described.splitlines()[4]]
    assert both[-1] == described.splitlines()[-1]  # quick's data is still GENERATED
    only_real = tracking.experiment_description("table1", {"paper": ["CIFAR-100"]})
    assert "GENERATED" not in only_real and "not the paper's" not in only_real


def test_the_table_writes_its_saved_view_and_the_address_opens_it(tmp_path):
    """The view is a saved view of the Views menu ({name, createdAt, updatedAt, state}), in
    Table 1's row order, each figure beside the paper's; rewriting an unchanged view keeps it."""
    import json

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracking.log_cell_run(uri, "table1", "baseline", {}, {"top1": 80.0}, {}, {"profile": "quick"}, [])
    assert tracking.prepare_table_view(f"sqlite:///{tmp_path / 'none.db'}", "table1", "quick") is None
    tracking.follow_table(uri, "table1", "quick", {"baseline": {"boost": 1.0, "calibrated": "32/1.00/1.00/1/40"}},
                          "quick/table1", [])
    experiment = _client(uri).get_experiment_by_name("table1")
    saved = json.loads(experiment.tags[tracking.SHARED_VIEW_PREFIX + "darel-quick"])
    assert saved["name"] == "Table 1 (quick profile)" and isinstance(saved["createdAt"], int)
    state = json.loads(saved["state"])
    assert state["searchFilter"] == "tags.scope = 'table' and tags.profile = 'quick' and tags.state = 'finished'"
    assert state["orderByKey"] == "metrics.`row`" and state["orderByAsc"] is True
    columns = state["selectedColumns"]
    assert columns[:2] == ["metrics.`boost`", "metrics.`boost paper`"] and columns[-1] == "tags.`calibrated`"
    assert state["columnOrder"][:2] == [tracking.RUN_NAME_COLUMN, tracking.CREATED_COLUMN]
    assert set(state["columnWidths"]) == {tracking.RUN_NAME_COLUMN, tracking.CREATED_COLUMN, *columns}
    # A text figure is a tag of the row's run, a number a metric.
    run = next(r for r in _client(uri).search_runs([experiment.experiment_id]) if r.data.tags["cell_key"] == "baseline")
    assert run.data.tags["calibrated"] == "32/1.00/1.00/1/40" and run.data.metrics["boost"] == 1.0
    assert tracking.prepare_table_view(uri, "table1", "quick") == experiment.experiment_id
    again = _client(uri).get_experiment_by_name("table1").tags[tracking.SHARED_VIEW_PREFIX + "darel-quick"]
    assert json.loads(again) == saved  # unchanged: not rewritten
    url = tracking.table_view_url("http://127.0.0.1:5000", experiment.experiment_id, "quick")
    assert url == (f"http://127.0.0.1:5000/#/experiments/{experiment.experiment_id}/runs?"
                   "workflowType=machine_learning&compareRunsMode=TABLE&viewStateShareKey=darel-quick")


def test_the_ui_start_page_gets_the_training_defaults_and_nothing_else_changes():
    """darel.tools.mlflow_app: the start page's HTML gets the defaults script first in its
    <head> (its length said again, no cache validator kept); every other answer passes as is."""
    import asyncio

    from darel.tools import mlflow_app

    page = b"<!doctype html><html><head><title>MLflow</title></head><body></body></html>"
    seen: list[dict] = []

    async def inner(scope, receive, send):
        seen.append(scope)
        body = page if scope["path"] == "/" else b'{"ok": true}'
        kind = b"text/html; charset=utf-8" if scope["path"] == "/" else b"application/json"
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", kind), (b"content-length", str(len(body)).encode()),
                                (b"etag", b'"abc"')]})
        await send({"type": "http.response.body", "body": body[:10], "more_body": True})
        await send({"type": "http.response.body", "body": body[10:]})

    def call_with(app, path: str, headers: list) -> tuple[dict, bytes]:
        sent: list[dict] = []

        async def send(message):
            sent.append(message)

        async def receive():
            return {"type": "http.request"}

        scope = {"type": "http", "method": "GET", "path": path, "headers": headers}
        asyncio.run(app(scope, receive, send))
        return sent[0], b"".join(m.get("body", b"") for m in sent[1:])

    def call(path: str, headers: list) -> tuple[dict, bytes]:
        return call_with(mlflow_app.TrainingDefaults(inner), path, headers)

    start, body = call("/", [(b"if-none-match", b'"abc"'), (b"host", b"127.0.0.1")])
    script = mlflow_app.defaults_script().encode()
    assert body == page.replace(b"<head>", b"<head>" + script) and body.index(script) < body.index(b"<title>")
    headers = dict(start["headers"])
    assert headers[b"content-length"] == str(len(body)).encode() and b"etag" not in headers
    assert seen[-1]["headers"] == [(b"host", b"127.0.0.1")]  # no 304 for a page that changed
    for key in ("mlflow.assistant.fab.autoOpenedOnFirstLoad_v1", "mlflow.workflowType_v1",
                "mlflow.assistant.panelOpen_v1", "machine_learning"):
        assert key.encode() in script, key
    # The panel closes on every profile's table view (its address: viewStateShareKey=darel-<profile>).
    assert b'indexOf("viewStateShareKey=darel-")' in script
    # MLflow's notice that it collects usage data, and the UI's telemetry setting: left to the
    # browser while the server's telemetry is on; read and off while it is off.
    for off in (False, True):
        chosen = mlflow_app.defaults_script(telemetry_off=off)
        assert ('"mlflow.telemetry.info.alert.dismissed_v1": "true"' in chosen) is off
        assert ('"mlflow.settings.telemetry.enabled_v1": "false"' in chosen) is off
    assert b"mlflow.telemetry" not in script
    start, body = call_with(mlflow_app.TrainingDefaults(inner, telemetry_off=True), "/", [])
    assert mlflow_app.defaults_script(telemetry_off=True).encode() in body
    start, body = call("/ajax-api/2.0/mlflow/experiments/search", [])
    assert body == b'{"ok": true}' and dict(start["headers"])[b"etag"] == b'"abc"'


@pytest.mark.parametrize("profile", ["quick", "paper", "gpu", "my-profile", "a.b_c"])
def test_the_start_page_closes_the_assistant_on_every_table_view_and_nowhere_else(profile):
    """The start page's script closes the assistant panel when the address opens one of
    this project's table views (darel.tracking.table_view_url), for any profile, and leaves
    it alone elsewhere. Its marker once was "darel-experiment" (table_view_key(""): an empty
    name slugs to "experiment"), which no view's address holds."""
    import json
    import shutil
    import subprocess

    from darel.tools import mlflow_app

    url = tracking.table_view_url("http://127.0.0.1:5000", "7", profile)
    view_hash = "#" + url.split("#", 1)[1]
    assert mlflow_app.VIEW_MARKER in view_hash
    other = "#/experiments/7/runs?viewStateShareKey=someone-elses-view"
    assert mlflow_app.VIEW_MARKER not in other
    node = shutil.which("node")
    if node is None:
        return  # the address check above is the contract; node runs the script itself where it is installed
    script = mlflow_app.defaults_script().removeprefix("<script>").removesuffix("</script>")
    for where, closed in ((view_hash, True), (other, False), ("#/experiments/7", False)):
        harness = ("var store={};var window={localStorage:{getItem:function(k){return k in store?store[k]:null;},"
                   "setItem:function(k,v){store[k]=String(v);}},location:{hash:" + json.dumps(where) + "}};"
                   + script + ";console.log(JSON.stringify(store));")
        out = subprocess.run([node, "-e", harness], capture_output=True, text=True, timeout=60, check=True).stdout
        stored = json.loads(out)
        assert (stored.get(mlflow_app.ASSISTANT_PANEL_OPEN) == "false") is closed, (where, stored)
        assert stored[mlflow_app.WORKFLOW_TYPE] == '"machine_learning"'


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _artifact_folders(uri: str) -> list[str]:
    client = _client(uri)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    from mlflow.entities import ViewType

    runs = client.search_runs([experiment.experiment_id], run_view_type=ViewType.ALL)
    return [experiment.artifact_location] + sorted(r.info.artifact_uri for r in runs)


def test_a_copied_store_tracks_into_its_own_project_and_leaves_the_original_alone(tmp_path):
    import shutil

    original, copy = tmp_path / "original", tmp_path / "copy"
    original.mkdir()
    _log(f"sqlite:///{original / 'mlflow.db'}", "baseline", 70.0, original)
    shutil.copytree(original, copy)
    before = _files(original)

    uri = f"sqlite:///{copy / 'mlflow.db'}"
    _log(uri, "baseline", 71.0, copy)  # relogs: the old run is deleted, a new one written
    _log(uri, "t0.80_m0.70", 60.0, copy)

    assert _files(original) == before
    locations = _artifact_folders(uri)
    assert locations and all(loc.startswith((copy / "mlartifacts").as_uri() + "/") for loc in locations)
    finished = [r for r in _active_runs(uri)]
    for run in finished:
        folder = Path(run.info.artifact_uri.removeprefix("file://"))
        assert (folder / f"{run.data.tags['cell_key']}.json").is_file()
    # The original's own store still names its own folders.
    assert all(loc.startswith((original / "mlartifacts").as_uri() + "/")
               for loc in _artifact_folders(f"sqlite:///{original / 'mlflow.db'}"))


def test_a_moved_store_never_recreates_the_folder_it_left(tmp_path):
    first, moved = tmp_path / "first", tmp_path / "moved"
    first.mkdir()
    _log(f"sqlite:///{first / 'mlflow.db'}", "baseline", 70.0, first)
    first.rename(moved)

    uri = f"sqlite:///{moved / 'mlflow.db'}"
    assert tracking.follow_moved_store(moved / "mlflow.db") == {first.as_uri(): moved.as_uri()}
    assert tracking.follow_moved_store(moved / "mlflow.db") == {}  # once followed, nothing left to change
    _log(uri, "t0.80_m0.70", 60.0, moved)

    assert not first.exists()
    assert sorted(p.name for p in (moved / "mlartifacts" / EXPERIMENT).iterdir()) == sorted(
        r.info.run_id for r in _active_runs(uri))
