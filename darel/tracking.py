"""MLflow record of the tables' cells: one run per cell, started when its training starts
(per-epoch metrics stream in live), completed by the cell's tracking job (final metrics,
parameters, artifacts, logs), and kept in step with the table (the derived figures logged,
the runs of cells no longer in the table deleted). Safe when several workflow jobs write
at the same moment (a file lock serialises the writers of an SQLite store; a database or
tracking server serialises its own).

Runs made inside `dvc exp run` carry the experiment's name (tag ``dvc_experiment``) and a
scope of their own, so they never replace or delete the table's canonical runs.
Experiments are created as training ("custom model development") experiments, so the
MLflow 3 UI opens them on their runs. An empty or foreign database file is an error that
names the file, never a silent new store."""

from __future__ import annotations

import os

# Before mlflow is imported anywhere through this module: no usage reporting.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

import contextlib
import fcntl
import json
import logging
import math
import platform
import re
import socket
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Iterator

from darel import grammar

REPO_ROOT = Path(__file__).resolve().parents[1]

# MLflow's own limits (mlflow.utils.validation), repeated here to avoid importing it early.
_MAX_PARAMS_TAGS_PER_BATCH = 100
_MAX_METRICS_PER_BATCH = 1000
_MAX_PARAM_VALUE_CHARS = 6000
_MAX_TAG_VALUE_CHARS = 8000
_TRUNCATED = "...[truncated]"


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", "--no-optional-locks", *args], cwd=REPO_ROOT, capture_output=True,
                              text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _gpu_name() -> str | None:
    """The first GPU this process sees, or None. Torch answers where a job has it loaded
    (the trainings); elsewhere NVML answers in milliseconds, where importing torch only to
    ask costs the tracking job seconds (about 5 s on the GPU machine)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
        except Exception:  # noqa: BLE001 - only a label
            return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    first = None if visible is None else visible.split(",")[0].strip()
    if first is not None and (not first or first.startswith("-")):
        return None  # no GPU visible to this process
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver, no library: no GPU
        return None
    try:
        if first is None or first.isdigit():
            handle = pynvml.nvmlDeviceGetHandleByIndex(int(first or 0))
        else:  # a UUID (GPU-..., MIG-...)
            handle = pynvml.nvmlDeviceGetHandleByUUID(first)
        name = pynvml.nvmlDeviceGetName(handle)
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:  # noqa: BLE001 - only a label
        return None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def environment_tags() -> dict[str, str]:
    """Where and with what a run was produced: code commit, hardware, library versions."""
    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain") if commit else None
    gpu = _gpu_name()
    device = f"cuda: {gpu}" if gpu else f"cpu: {_cpu_model()}"
    return {
        "git_commit": commit or "unknown",
        # Untracked files count: new source files change what ran just as edits do.
        "git_dirty": "unknown" if status is None else str(bool(status)).lower(),
        "device": device,
        "hostname": socket.gethostname(),
        "python_version": platform.python_version(),
        "torch_version": _version("torch"),
        "numpy_version": _version("numpy"),
        # The GPU kit installs the tracking client alone (mlflow-skinny), not the server package.
        "mlflow_version": next((v for v in map(_version, ("mlflow", "mlflow-skinny")) if v != "not installed"),
                               "not installed"),
        "codecarbon_version": _version("codecarbon"),
    }


def _sqlite_path(tracking_uri: str) -> Path | None:
    """The database file behind an ``sqlite:///`` URI (relative to the working folder
    with three slashes, absolute with four); None for other stores."""
    if not tracking_uri.startswith("sqlite:///"):
        return None
    path = tracking_uri[len("sqlite:///"):].split("?", 1)[0]
    if not path or path == ":memory:":
        raise ValueError(f"tracking_uri must name an SQLite file, got {tracking_uri!r}")
    return Path(path)


def lock_path_for(tracking_uri: str) -> Path | None:
    """The lock file that serialises writers of one tracking store, where the store needs
    one: an SQLite file takes one writer at a time, so its lock sits beside it (on the
    file system the jobs share, on a cluster too). A database server or `mlflow server`
    serialises its writers itself: no lock (None)."""
    db = _sqlite_path(tracking_uri)
    return None if db is None else db.with_name(db.name + ".lock")


@contextlib.contextmanager
def _exclusive_lock(path: Path) -> Iterator[None]:
    from darel.io import OutputError, open_lock

    try:  # never through a link (a dangling one would create a file where it points)
        handle = open_lock(path)
    except OutputError as err:
        raise TrackingError(f"the store's lock: {err}") from None
    with handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
TRAINING_EXPERIMENT = "custom_model_development"


# The MLflow UI's saved views: an experiment tag ``mlflow.sharedViewState.<key>`` holding
# {name, createdAt, updatedAt, state}, ``state`` the page's state as JSON text (the filter,
# the order, the columns and their widths). The experiment page's Views menu lists every
# such tag by its name; the URL parameter ``viewStateShareKey=<key>`` opens one.
# ``workflowType=machine_learning`` in the same URL shows the training runs instead of the
# GenAI overview (the UI keeps that toggle in the browser and ignores the experiment's
# kind; darel.tools.mlflow_app makes training the browser's default on this server).
SHARED_VIEW_PREFIX = "mlflow.sharedViewState."
RUN_NAME_COLUMN = "attributes.`Run Name`"
CREATED_COLUMN = "runDateAndNestInfo"  # the UI's "Created" column: always shown, its width is ours to set
TABLE1_ORDER_METRIC = "row"  # Table 1's row number, which orders its view (the paper's order)

# Each table's columns in the order a reader compares them, with their widths in pixels.
# Table 1's fit a 1600 px wide window beside the UI's sidebar, the run names (which hold the
# budget, t0.80_m0.70) and "Created" (MLflow cuts a header, and a value, to its column's
# width): each figure beside the paper's, adherence and top-1, then the calibrated settings
# as text (darel.table1.mlflow_row_figures writes them). A width is its header's or widest
# value's text (the paper profile's "128/0.80/0.28/3/200" for the settings), the UI's 24 px
# of padding and a few to spare; together they fill the grid at 1600 px, so that the UI's
# own last column ("Duration") starts just outside it rather than showing half a header.
TABLE_VIEW_COLUMNS: dict[str, tuple[tuple[str, int], ...]] = {
    "table1": (("metrics.`boost`", 58), ("metrics.`boost paper`", 97), ("metrics.`drop`", 60),
               ("metrics.`drop paper`", 91), ("metrics.`mem`", 57), ("metrics.`mem paper`", 93),
               ("metrics.`CO2e`", 58), ("metrics.`CO2e paper`", 96), ("metrics.`adherence`", 88),
               ("metrics.`top1`", 60), ("tags.`calibrated`", 140)),
    **{table: tuple((f"metrics.`{name}`", max(64, 7 * len(name) + 34))
                    for name in ("alpha", "boost", "BLEU", "TER", "METEOR", "NIST", "ROUGE_L", "CIDEr"))
       for table in ("table2", "table3")},
}
# A run name of the paper profile's ResNet18-HC, and "13 minutes ago".
VIEW_WIDTHS = {RUN_NAME_COLUMN: 235, CREATED_COLUMN: 140}


def view_column_names(experiment: str) -> list[str]:
    """The names of the metrics and tags a table's view shows, in its order."""
    return [column.split("`")[1] for column, _ in TABLE_VIEW_COLUMNS[experiment]]


def table_view_key(profile: str) -> str:
    """The saved view's key for one profile's table (the same name in every experiment)."""
    return f"darel-{_slug(profile)}"


def table_view_name(experiment: str, profile: str, generated: bool = False) -> str:
    """The view's name in the experiment page's Views menu; ``generated``: the profile's runs
    trained on data made on the machine (their ``dataset_label`` says GENERATED), which the
    name says too, so no reader of the view takes its figures for the paper's."""
    return f"{experiment.replace('table', 'Table ')} ({profile} profile{', GENERATED data' if generated else ''})"


def data_is_generated(client: Any, experiment_id: str, profile: str) -> bool:
    """Whether any run of ``profile`` in the experiment carries a GENERATED data label."""
    found = client.search_runs([experiment_id], filter_string=f"tags.profile = '{profile}' and "
                               f"tags.dataset_label LIKE '{grammar.GENERATED_DATA}%'", max_results=1)
    return bool(found)


def saved_view_name(tracking_uri: str, experiment_id: str, profile: str) -> str | None:
    """The name the saved view of ``profile``'s table carries in the store (None: none saved)."""
    with _store(tracking_uri) as (client, _):
        try:
            saved = json.loads(client.get_experiment(experiment_id).tags.get(SHARED_VIEW_PREFIX +
                                                                             table_view_key(profile), ""))
        except ValueError:
            return None
    return saved.get("name") if isinstance(saved, dict) and isinstance(saved.get("name"), str) else None


def table_view_state(experiment: str, profile: str) -> dict[str, Any]:
    """The experiment page's state that shows one profile's table: its cell runs only (no
    DVC experiment runs, no table-files run, no unfinished training), Table 1 in its own
    row order (the paper's), the others by name, with the table's columns."""
    widths = dict(TABLE_VIEW_COLUMNS.get(experiment, (("metrics.`boost`", 64),)))
    columns = list(widths)
    order = f"metrics.`{TABLE1_ORDER_METRIC}`" if experiment == "table1" else "tags.`mlflow.runName`"
    return {
        "searchFilter": f"tags.scope = 'table' and tags.profile = '{profile}' and tags.state = 'finished'",
        "orderByKey": order,
        "orderByAsc": True,
        "selectedColumns": columns,
        "columnOrder": [RUN_NAME_COLUMN, CREATED_COLUMN, *columns],
        "columnWidths": {**VIEW_WIDTHS, **widths},
        "runListHidden": False,
        "viewMaximized": False,
    }


# The experiment's description: the UI shows this experiment tag on the experiment page,
# folded to its first two lines, so the first sentence says what the runs are and on what data.
DESCRIPTION_TAG = "mlflow.note.content"
# Per table: its name in the paper and what its view shows.
TABLE_DESCRIPTIONS = {
    "table1": ("Table 1 of the DAREL paper",
               "Per model (ResNet18, ResNet18-HC) the full-data baseline, DAREL under each time and memory budget "
               "B(t, m) and IDS + ADONIS, with boost, top-1 drop, memory and CO2e cut, each beside the paper's figure "
               "for the same row (`<name> paper`)."),
    "table2": ("Table 2 of the DAREL paper",
               "GPT-2 fine-tuned with LoRA on E2E-NLG, with and without DAREL: its text metrics and boost."),
    "table3": ("Table 3 of the DAREL paper",
               "GPT-2 fine-tuned with LoRA on WebNLG, with and without DAREL: its text metrics and boost."),
}


def experiment_description(experiment: str, data_by_profile: dict[str, list[str]]) -> str:
    """The experiment's description (Markdown): a first sentence naming the table and each
    profile's data (GENERATED data: its figures are not the paper's results), then what the
    table shows, per profile its data labels and view, and the GENERATED caveat in full."""
    title, content = TABLE_DESCRIPTIONS.get(experiment, (f"{experiment} of the DAREL reproduction", ""))
    made = {profile: any(label.startswith(grammar.GENERATED_DATA) for label in labels)
            for profile, labels in data_by_profile.items()}
    said = [f"{profile} profile on GENERATED data, whose figures are not the paper's results" if made[profile]
            else f"{profile} profile on {'; '.join(labels) or 'data not recorded'}"
            for profile, labels in sorted(data_by_profile.items())]
    lines = [f"{title}, reproduced" + (": " + "; ".join(said) if said else "") + ".", ""]
    lines += [content, ""] if content else []
    for profile, labels in sorted(data_by_profile.items()):
        lines.append(f"- {profile} profile: data {'; '.join(labels) or 'not recorded'}; its view in the Views menu: "
                     f"{table_view_name(experiment, profile, made[profile])}")
    if any(made.values()):
        lines += ["", "Figures on GENERATED data test the methods at this scale on data made on the machine; they "
                      "are not the paper's results and not comparable with its CIFAR-100 / E2E / WebNLG figures."]
    return "\n".join(lines).rstrip("\n")


def set_experiment_description(client: Any, experiment_id: str, experiment: str) -> str:
    """Write (or refresh) the experiment's description from its finished table runs'
    profiles and data labels; left as it is when unchanged. Returns the description."""
    runs = client.search_runs([experiment_id], filter_string="tags.scope = 'table' and tags.state = 'finished'",
                              max_results=50_000)
    data_by_profile: dict[str, list[str]] = {}
    for run in runs:
        profile = run.data.tags.get("profile")
        if profile:
            labels = data_by_profile.setdefault(profile, [])
            label = run.data.tags.get("dataset_label")
            if label and label not in labels:
                labels.append(label)
    text = experiment_description(experiment, {profile: sorted(labels) for profile, labels in data_by_profile.items()})
    if client.get_experiment(experiment_id).tags.get(DESCRIPTION_TAG) != text:
        client.set_experiment_tag(experiment_id, DESCRIPTION_TAG, text)
    return text


def set_table_view(client: Any, experiment_id: str, experiment: str, profile: str) -> str:
    """Write (or refresh) the saved view of ``profile``'s table in the experiment, listed in
    its Views menu, and the experiment's description (set_experiment_description); returns
    the view's key. Unchanged views are not rewritten (their date stays)."""
    set_experiment_description(client, experiment_id, experiment)
    key = table_view_key(profile)
    name = table_view_name(experiment, profile, data_is_generated(client, experiment_id, profile))
    state = json.dumps(table_view_state(experiment, profile), separators=(",", ":"))
    found = client.get_experiment(experiment_id)
    try:
        saved = json.loads(found.tags.get(SHARED_VIEW_PREFIX + key, ""))
    except ValueError:
        saved = None
    if not isinstance(saved, dict) or saved.get("name") != name or saved.get("state") != state:
        now_ms = int(time.time() * 1000)
        created = saved.get("createdAt") if isinstance(saved, dict) and isinstance(saved.get("createdAt"), int) \
            else now_ms
        client.set_experiment_tag(experiment_id, SHARED_VIEW_PREFIX + key, json.dumps(
            {"name": name, "createdAt": created, "updatedAt": now_ms, "state": state}, separators=(",", ":")))
    return key


def table_view_url(base_url: str, experiment_id: str, profile: str) -> str:
    """The address that opens the saved view of ``profile``'s table on the training runs."""
    return (f"{base_url.rstrip('/')}/#/experiments/{experiment_id}/runs?workflowType=machine_learning"
            f"&compareRunsMode=TABLE&viewStateShareKey={table_view_key(profile)}")


def prepare_table_view(tracking_uri: str, experiment: str, profile: str) -> str | None:
    """The experiment's id, its saved view of ``profile``'s table written; None when the
    store or the experiment does not exist yet (nothing is created)."""
    db = _sqlite_path(tracking_uri)
    if db is not None and not db.exists():
        return None
    with _store(tracking_uri) as (client, _):
        found = client.get_experiment_by_name(experiment)
        if found is None or found.lifecycle_stage == "deleted":
            return None
        set_table_view(client, found.experiment_id, experiment, profile)
        return found.experiment_id


class TrackingError(RuntimeError):
    """The tracking store cannot be used; the message names it and says what to do."""


def check_store(tracking_uri: str) -> None:
    """Refuse a database file that is empty or not MLflow's (a new file is fine)."""
    db = _sqlite_path(tracking_uri)
    if db is None or not db.exists():
        return
    if db.stat().st_size == 0:
        raise TrackingError(f"the MLflow store {db} is an empty file (0 bytes), not an MLflow database, and nothing "
                            f"was written to it; restore it from a copy, or move it away to start a new store "
                            f"(mv {db} {db}.empty)")
    import sqlite3

    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
            tables = {row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.DatabaseError as err:
        raise TrackingError(f"the MLflow store {db} is not a readable SQLite database ({err}); restore it from a "
                            f"copy, or move it away to start a new store") from None
    missing = {"experiments", "runs", "alembic_version"} - tables
    if missing:
        raise TrackingError(f"{db} is an SQLite database but not an MLflow store (no {', '.join(sorted(missing))} "
                            f"table); point tracking.uri at another file or move this one away")


def run_scope() -> dict[str, str]:
    """``scope`` tag of the runs this process writes: the tables' own, or a DVC experiment's."""
    name = os.environ.get("DVC_EXP_NAME")
    return {"scope": f"dvc-exp:{name}", "dvc_experiment": name} if name else {"scope": "table"}


def _run_name(key: str) -> str:
    """A run's name: its key for the tables' own runs; inside a DVC experiment the key and
    the experiment's name, so the two never share a name."""
    scope = run_scope()
    return key if scope["scope"] == "table" else f"{key} [dvc exp {scope['dvc_experiment']}]"


def _experiment_id(client: Any, experiment: str, db: Path | None) -> str:
    found = client.get_experiment_by_name(experiment)
    if found is None:
        # Keep artifacts beside the database rather than wherever the job's cwd is.
        location = (db.resolve().parent / "mlartifacts" / _slug(experiment)).as_uri() if db else None
        experiment_id = client.create_experiment(experiment, artifact_location=location,
                                                 tags={EXPERIMENT_KIND_TAG: TRAINING_EXPERIMENT})
    else:
        experiment_id = found.experiment_id
        if found.lifecycle_stage == "deleted":
            client.restore_experiment(experiment_id)
        if found.tags.get(EXPERIMENT_KIND_TAG) != TRAINING_EXPERIMENT:
            client.set_experiment_tag(experiment_id, EXPERIMENT_KIND_TAG, TRAINING_EXPERIMENT)
    return experiment_id


def _scope_filter(cell_key: str | None = None) -> str:
    parts = [f"tags.scope = '{run_scope()['scope']}'"]
    if cell_key is not None:
        parts.append(f"tags.cell_key = '{cell_key}'")
    return " and ".join(parts)


@contextlib.contextmanager
def _store(tracking_uri: str) -> Iterator[tuple[Any, Path | None]]:
    """(MlflowClient, database path) under the writers' lock, the store checked first."""
    check_store(tracking_uri)
    from mlflow.tracking import MlflowClient

    db = _sqlite_path(tracking_uri)
    if db is not None:
        _inside(db)
        db.parent.mkdir(parents=True, exist_ok=True)
    lock = lock_path_for(tracking_uri)
    with _exclusive_lock(lock) if lock is not None else contextlib.nullcontext():
        if db is not None and db.exists():
            follow_moved_store(db)
        yield MlflowClient(tracking_uri=tracking_uri), db


# MLflow records each experiment's artifact folder, and each run's, as an absolute path
# (it makes a relative one absolute from the working folder), so a store copied or moved
# with its project, or a shared file system mounted at another path, would still point
# at the first place. The store's own folder is the truth: at every use the recorded
# locations are made to follow it.
_ARTIFACT_COLUMNS = (("experiments", "artifact_location"), ("runs", "artifact_uri"),
                     ("logged_models", "artifact_location"))


def _recorded_project_folder(location: str) -> str | None:
    """The project folder, as the store recorded it, of an artifact location this module
    made (``<folder>/mlartifacts/<experiment>``); None for any other location."""
    head, marker, tail = location.rpartition("/mlartifacts/")
    return head if marker and head and tail and "/" not in tail.rstrip("/") else None


def follow_moved_store(db: Path) -> dict[str, str]:
    """Point the artifact locations recorded in the SQLite store ``db`` at the project the
    store now lies in (the folder holding it), where they name another folder (the project
    was copied or moved). Returns {old folder: new folder} of what was changed (empty when
    nothing had moved). Run under the writers' lock."""
    import sqlite3
    from urllib.parse import unquote, urlsplit

    root = db.resolve().parent
    moved: dict[str, str] = {}
    replacements: dict[str, str] = {}
    with contextlib.closing(sqlite3.connect(str(db))) as con:
        tables = {row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "experiments" not in tables:
            return moved
        for (location,) in con.execute("SELECT artifact_location FROM experiments"):
            recorded = _recorded_project_folder(location or "")
            if recorded is None or recorded in moved:
                continue
            parts = urlsplit(recorded)
            if parts.scheme not in ("", "file"):
                continue
            folder = Path(unquote(parts.path))
            if folder == root or (folder.exists() and os.path.samefile(folder, root)):
                continue
            moved[recorded] = root.as_uri() if parts.scheme == "file" else str(root)
            # MLflow's own Default experiment records a plain path (<folder>/mlruns/0)
            replacements[str(folder)] = str(root)
        if not moved:
            return moved
        replacements.update(moved)
        with con:  # one transaction: every location follows, or none
            for old, new in replacements.items():
                for table, column in _ARTIFACT_COLUMNS:
                    if table in tables:
                        con.execute(f"UPDATE {table} SET {column} = ? || substr({column}, ?) "
                                    f"WHERE {column} = ? OR substr({column}, 1, ?) = ?",
                                    (new, len(old) + 1, old, len(old) + 1, old + "/"))
    for old, new in moved.items():
        print(f"MLflow: the store {db} was moved or copied; its artifact folders now follow it "
              f"({old} -> {new})", file=sys.stderr)
    return moved


def _inside(path: str | Path) -> None:
    """A file of the store (the database, an artifact) may not lead out of the project."""
    from darel.io import OutputError, inside_project

    try:
        inside_project(path)
    except OutputError as err:
        raise TrackingError(str(err)) from None


def _artifact_root(client: Any, experiment_id: str, db: Path | None) -> None:
    """An experiment whose artifacts go to a folder of this project: no link may lead that
    folder out of it."""
    _local_folder_inside(client.get_experiment(experiment_id).artifact_location or "",
                         f"experiment {experiment_id}'s artifact folder")


def _local_folder_inside(location: str, what: str) -> None:
    """An artifact location on this machine (a path or file: URI) that lies in the project
    reaches no link out of it. (A location elsewhere is what the store records: a store
    trusts whoever can write to it, docs/security.md.)"""
    from urllib.parse import unquote, urlsplit

    from darel.io import inside_project

    parts = urlsplit(location)
    if parts.scheme in ("", "file"):
        try:
            inside_project(Path(unquote(parts.path)))
        except OSError as err:
            raise TrackingError(f"{what}: {err}") from None


def _attachable(path: Path) -> None:
    """An artifact to attach: a plain file or folder of the project, reached through no link."""
    _inside(path)
    if path.is_symlink():
        raise TrackingError(f"{path} is a link; only plain files are attached")


def _check_key(cell_key: str) -> None:
    if not isinstance(cell_key, str) or not cell_key or "'" in cell_key or "\\" in cell_key:
        raise ValueError(f"cell_key must be a non-empty string without quotes or backslashes, got {cell_key!r}")


def _log_params_tags(client: Any, run_id: str, params: dict[str, Any], tags: dict[str, Any]) -> None:
    from mlflow.entities import Param, RunTag

    flat: dict[str, Any] = {}
    _flatten("", params, flat)
    existing = client.get_run(run_id).data.params
    # MLflow refuses to change a logged param; a run keeps the values it started with.
    param_entities = [Param(k, _as_text(v, _MAX_PARAM_VALUE_CHARS)) for k, v in sorted(flat.items())
                      if k not in existing]
    tag_entities = [RunTag(k, _as_text(v, _MAX_TAG_VALUE_CHARS)) for k, v in sorted(tags.items())]
    for chunk in _chunks(param_entities, _MAX_PARAMS_TAGS_PER_BATCH):
        client.log_batch(run_id, params=chunk)
    for chunk in _chunks(tag_entities, _MAX_PARAMS_TAGS_PER_BATCH):
        client.log_batch(run_id, tags=chunk)


def start_cell_run(tracking_uri: str, experiment: str, cell_key: str, params: dict[str, Any],
                   tags: dict[str, Any]) -> str:
    """The cell's run, created when its training starts (or the unfinished one of an
    interrupted training, which the resumed training continues); returns its id."""
    _check_key(cell_key)
    from mlflow.entities import ViewType

    with _store(tracking_uri) as (client, db):
        experiment_id = _experiment_id(client, experiment, db)
        unfinished = client.search_runs([experiment_id], filter_string=_scope_filter(cell_key)
                                        + " and tags.state = 'training'", run_view_type=ViewType.ACTIVE_ONLY,
                                        max_results=1, order_by=["attributes.start_time DESC"])
        if unfinished:
            run_id = unfinished[0].info.run_id
        else:
            run_id = client.create_run(experiment_id, run_name=_run_name(cell_key), tags={"cell_key": cell_key}).info.run_id
        _log_params_tags(client, run_id, params, {**environment_tags(), **run_scope(), **tags,
                                                   "cell_key": cell_key, "state": "training"})
    return run_id


class LiveRun:
    """Per-epoch metrics of a training into its MLflow run as they happen. Tracking never
    stops a training: a failure is reported once and later epochs are not logged."""

    def __init__(self, tracking_uri: str, run_id: str, warn: Any) -> None:
        self.tracking_uri, self.run_id, self.warn = tracking_uri, run_id, warn
        self.failed = False

    def log_epoch(self, epoch: int, record: dict[str, Any]) -> None:
        if self.failed:
            return
        from mlflow.entities import Metric

        now_ms = int(time.time() * 1000)
        metrics = [Metric(k, float(v), now_ms, epoch) for k, v in sorted(record.items())
                   if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))]
        try:
            with _store(self.tracking_uri) as (client, _):
                client.log_batch(self.run_id, metrics=metrics)
        except Exception as err:  # noqa: BLE001 - see the class docstring
            self.failed = True
            self.warn(f"MLflow: live metrics of run {self.run_id} stopped ({type(err).__name__}: {err}); the "
                      "cell's tracking job records the whole run later")


def _check_sealed_runs(client: Any, run_ids: dict[str, str]) -> None:
    """Each run a cell's mlflow.json names must be that cell's own (its ``cell_key`` tag): a
    marker naming another cell's run would make the table delete the real one as foreign.
    A run the store no longer holds (a new store) is left to the table's usual course."""
    from mlflow.exceptions import MlflowException

    for key, run_id in sorted(run_ids.items()):
        try:
            tagged = client.get_run(run_id).data.tags.get("cell_key")
        except MlflowException:
            continue
        if tagged != key:
            raise TrackingError(f"the mlflow.json of cell {key} names run {run_id}, which is the run of "
                                f"{tagged or 'no cell'}: nothing deleted; rebuild that cell's marker "
                                "(snakemake --forcerun track_cell)")


def follow_table(tracking_uri: str, experiment: str, profile: str, rows: dict[str, dict[str, Any]],
                 table_key: str, artifacts: list[str | Path],
                 run_ids: dict[str, str] | None = None) -> dict[str, int]:
    """Keep the experiment in step with a table: log each row's derived figures (``rows``:
    cell_key -> {name: number (a metric) or text (a tag)}) into its run, delete the runs of
    this profile's cells that are no longer in the table, and record the table's files in a
    run of its own.

    With ``run_ids`` (cell_key -> the run id its tracking job sealed in mlflow.json) a row
    adopts only that run: any other run under the same key (one written into the store by
    someone else) is deleted and counted as ``foreign``, so the table's view never shows it."""
    from mlflow.entities import RunStatus, ViewType

    counts = {"updated": 0, "deleted": 0, "restored": 0, "foreign": 0}
    for path in map(Path, artifacts):
        _attachable(path)
    with _store(tracking_uri) as (client, db):
        experiment_id = _experiment_id(client, experiment, db)
        _artifact_root(client, experiment_id, db)
        if run_ids is not None:
            _check_sealed_runs(client, run_ids)
        runs = client.search_runs([experiment_id], filter_string=_scope_filter() + f" and tags.profile = '{profile}'",
                                  run_view_type=ViewType.ACTIVE_ONLY, max_results=50_000)
        now_ms = int(time.time() * 1000)
        adopted = []
        for run in runs:
            key = run.data.tags.get("cell_key")
            if key == table_key:
                client.delete_run(run.info.run_id)  # replaced below
            elif key in rows and run_ids is not None and run_ids.get(key) != run.info.run_id:
                client.delete_run(run.info.run_id)
                counts["foreign"] += 1
            elif key in rows:
                adopted.append(run)
                _log_row(client, run.info.run_id, rows[key], now_ms)
                counts["updated"] += 1
            else:
                client.delete_run(run.info.run_id)
                counts["deleted"] += 1
        # A row whose run an earlier table deleted (the budget left the table and came back,
        # its cell files kept): its newest finished run is restored rather than left out
        # (with run_ids: its sealed run only).
        active = {run.data.tags.get("cell_key") for run in adopted}
        for key in sorted(set(rows) - active):
            gone = client.search_runs([experiment_id], filter_string=_scope_filter(key) + " and tags.state = 'finished'",
                                      run_view_type=ViewType.DELETED_ONLY, max_results=1 if run_ids is None else 1000,
                                      order_by=["attributes.start_time DESC"])
            if run_ids is not None:
                gone = [run for run in gone if run.info.run_id == run_ids.get(key)]
            if gone:
                client.restore_run(gone[0].info.run_id)
                _log_row(client, gone[0].info.run_id, rows[key], now_ms)
                counts["restored"] += 1
        set_table_view(client, experiment_id, experiment, profile)
        run_id = client.create_run(experiment_id, run_name=_run_name(table_key),
                                   tags={"cell_key": table_key, "profile": profile, "kind": "table",
                                         **run_scope(), **environment_tags()}).info.run_id
        for path in artifacts:
            client.log_artifact(run_id, str(path))
        client.set_terminated(run_id, RunStatus.to_string(RunStatus.FINISHED))
    return counts


def _log_row(client: Any, run_id: str, row: dict[str, Any], now_ms: int) -> None:
    """A table row's figures into its run: numbers as metrics (step 0), text as tags."""
    from mlflow.entities import Metric, RunTag

    metrics = [Metric(k, float(v), now_ms, 0) for k, v in sorted(row.items())
               if not isinstance(v, str) and _as_number(k, v) is not None]
    tags = [RunTag(k, _as_text(v, _MAX_TAG_VALUE_CHARS)) for k, v in sorted(row.items()) if isinstance(v, str)]
    if metrics or tags:
        client.log_batch(run_id, metrics=metrics, tags=tags)


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            _flatten(f"{prefix}.{key}" if prefix else str(key), item, out)
    else:
        out[prefix] = value


def _as_text(value: Any, limit: int) -> str:
    if isinstance(value, str):
        text = value
    elif isinstance(value, (list, tuple)):
        text = json.dumps(value, default=str)
    else:
        text = str(value)
    return text if len(text) <= limit else text[: limit - len(_TRUNCATED)] + _TRUNCATED


def _as_number(name: str, value: Any) -> float | None:
    """A metric value as float; None for missing (None or NaN)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return float(value)
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"metric {name!r} is not a number: {value!r}") from None
    return None if math.isnan(number) else number


def _chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "experiment"


def log_cell_run(tracking_uri: str, experiment: str, cell_key: str, params: dict[str, Any],
                 metrics: dict[str, Any], curves: dict[str, list[float]], tags: dict[str, Any],
                 artifacts: list[str | Path]) -> str:
    """Complete the MLflow run of one cell (named ``cell_key``) and return its id.

    The unfinished run its training started (per-epoch metrics already in it) is
    completed; without one (a cell trained with tracking off), a run is created and the
    curves are logged as metric histories, step = epoch (0-based). Params may be nested
    (dotted names). Final metrics that are None or NaN are skipped and listed in the tag
    ``missing_metrics``. Once the run is complete, the other active runs of the same
    ``cell_key`` (and scope) are deleted, so the UI shows one run per cell; if logging
    fails, the run is marked FAILED and the earlier ones are kept.
    """
    _check_key(cell_key)
    if not experiment:
        raise ValueError(f"experiment must be a non-empty name, got {experiment!r}")
    artifact_paths = [Path(p) for p in artifacts]
    missing_files = [str(p) for p in artifact_paths if not p.exists()]
    if missing_files:
        raise ValueError(f"artifacts do not exist: {missing_files}")
    for path in artifact_paths:
        _attachable(path)
    clashes = sorted(set(metrics) & set(curves))
    if clashes:
        raise ValueError(f"names used both as final metric and as curve: {clashes}")
    final_metrics: dict[str, float] = {}
    missing_metrics: list[str] = []
    for name, value in metrics.items():
        number = _as_number(name, value)
        if number is None:
            missing_metrics.append(name)
        else:
            final_metrics[name] = number

    from mlflow.entities import Metric, RunStatus, ViewType

    with _store(tracking_uri) as (client, db):
        experiment_id = _experiment_id(client, experiment, db)
        _artifact_root(client, experiment_id, db)
        active = client.search_runs([experiment_id], filter_string=_scope_filter(cell_key),
                                    run_view_type=ViewType.ACTIVE_ONLY, max_results=10_000,
                                    order_by=["attributes.start_time DESC"])
        live = next((r for r in active if r.data.tags.get("state") == "training"), None)
        if live is not None:
            run_id, log_curves = live.info.run_id, False
        else:
            run_id, log_curves = client.create_run(experiment_id, run_name=_run_name(cell_key),
                                                   tags={"cell_key": cell_key}).info.run_id, True
        try:
            _log_params_tags(client, run_id, params, {**environment_tags(), **run_scope(),
                                                      **{str(k): v for k, v in tags.items()}, "cell_key": cell_key,
                                                      "state": "finished",
                                                      "missing_metrics": ",".join(sorted(missing_metrics))})
            now_ms = int(time.time() * 1000)
            metric_entities = [Metric(k, v, now_ms, 0) for k, v in sorted(final_metrics.items())]
            if log_curves:
                metric_entities += [Metric(name, float(value), now_ms, step) for name, values in curves.items()
                                    for step, value in enumerate(values) if value is not None]
            for chunk in _chunks(metric_entities, _MAX_METRICS_PER_BATCH):
                client.log_batch(run_id, metrics=chunk)
            _local_folder_inside(client.get_run(run_id).info.artifact_uri or "", f"run {run_id}'s artifact folder")
            for path in artifact_paths:
                if path.is_dir():
                    client.log_artifacts(run_id, str(path), artifact_path=path.name)
                else:
                    client.log_artifact(run_id, str(path))
        except BaseException:
            client.set_terminated(run_id, RunStatus.to_string(RunStatus.FAILED))
            raise
        client.set_terminated(run_id, RunStatus.to_string(RunStatus.FINISHED))
        for old in active:
            if old.info.run_id != run_id:
                client.delete_run(old.info.run_id)
    return run_id


if __name__ == "__main__":  # pragma: no cover - manual check of the tags
    json.dump(environment_tags(), sys.stdout, indent=2)
    print()


def redacted(tracking_uri: str) -> str:
    """The URI with any password replaced by ***, for messages, logs and command lines
    (a password holding '@' or '/' included: the user part ends at the last '@')."""
    scheme, sep, rest = str(tracking_uri).partition("://")
    user, at, host = rest.rpartition("@")
    if not sep or not at or ":" not in user:
        return str(tracking_uri)
    return f"{scheme}://{user.split(':', 1)[0]}:***@{host}"


# The workflow's tracking URI, whole, as its jobs receive it: in their environment, never
# on a command line (Snakemake records command lines and parameters in .snakemake/ and its
# logs, and every user of the machine can read a process's command line).
URI_ENV = "DAREL_TRACKING_URI"


def job_uri(given: str) -> str:
    """The store a job writes to: ``given`` itself, or, when ``given`` is redacted (its
    password replaced by ***), the workflow's URI from the environment (DAREL_TRACKING_URI),
    which must be the same store; TrackingError otherwise."""
    if ":***@" not in given:
        return given
    whole = os.environ.get(URI_ENV)
    if not whole:
        raise TrackingError(f"the tracking URI {given} comes without its password, and {URI_ENV} is not set (the "
                            "workflow sets it for its jobs: run the stage through snakemake, or set it)")
    if redacted(whole) != given:
        raise TrackingError(f"the tracking URI {given} is not the workflow's ({redacted(whole)}, from {URI_ENV})")
    return whole


_URI_PASSWORD = re.compile(r"(://[^\s:/@]+):([^\s@]+)@")


def scrub(text: str) -> str:
    """``text`` with every password of a URI in it (and the workflow's own, wherever it
    appears) replaced by ***."""
    text = _URI_PASSWORD.sub(r"\1:***@", str(text))
    whole = os.environ.get(URI_ENV, "")
    user = whole.partition("://")[2].rpartition("@")[0]
    if ":" in user:
        from urllib.parse import unquote

        password = user.split(":", 1)[1]
        for form in {password, unquote(password)}:
            if len(form) >= 3:
                text = text.replace(form, "***")
    return text


class ScrubbingFormatter(logging.Formatter):
    """A log formatter that hides passwords (darel.tracking.scrub) in every line, tracebacks included."""

    def format(self, record: logging.LogRecord) -> str:
        return scrub(super().format(record))


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(text: object) -> str:
    """``text`` without terminal control characters (escape sequences from a store)."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(text))


def store_answers(tracking_uri: str, timeout_s: float = 10.0) -> str | None:
    """None when the store can be reached, else one line saying why (password hidden). A
    server must answer its /health; a database a connection through the driver MLflow will
    use (SQLAlchemy, as MLflow connects), over TCP or a socket file alike. An SQLite file
    always answers (check_store judges its content)."""
    from urllib.parse import urlsplit

    if tracking_uri.startswith("sqlite:"):
        return None
    parts = urlsplit(tracking_uri)
    shown = redacted(tracking_uri)
    if parts.scheme in ("http", "https"):
        import urllib.request

        try:
            with urllib.request.urlopen(f"{tracking_uri.rstrip('/')}/health", timeout=timeout_s):
                return None
        except Exception as err:  # noqa: BLE001 - any failure is the same answer
            return (f"the MLflow server {shown} does not answer ({type(err).__name__}: {err}); start it or correct "
                    "tracking.uri (nothing was run)")
    return _database_answers(tracking_uri, shown, timeout_s)


def _database_answers(tracking_uri: str, shown: str, timeout_s: float) -> str | None:
    """Connect to the database and run SELECT 1; one line (password hidden) when it fails."""
    import sqlalchemy
    from sqlalchemy.pool import NullPool

    url = sqlalchemy.engine.make_url(tracking_uri)
    socket_file = url.query.get("unix_socket") or url.query.get("host")
    if isinstance(socket_file, tuple):
        socket_file = socket_file[-1]
    if socket_file and str(socket_file).startswith("/"):
        where = f"socket {socket_file}"
    else:
        where = f"{url.host or 'localhost'}:{url.port or (5432 if url.get_backend_name() == 'postgresql' else 3306)}"

    def hidden(text: str) -> str:
        line = " ".join(str(text).split())
        return line.replace(url.password, "***") if url.password else line

    try:
        engine = sqlalchemy.create_engine(url, poolclass=NullPool,
                                          connect_args={"connect_timeout": max(1, round(timeout_s))})
    except ImportError as err:
        return (f"the MLflow database {shown} needs the driver {err.name or url.get_driver_name()}, which is not "
                "installed here (the cluster extra, requirements-cluster.lock, has psycopg2 for postgresql:// and "
                "PyMySQL for mysql+pymysql://); install it or correct tracking.uri (nothing was run)")
    except Exception as err:  # noqa: BLE001 - an unknown dialect or a malformed URI: the same answer
        return f"the MLflow database {shown} cannot be used ({hidden(err)}); correct tracking.uri (nothing was run)"
    try:
        with engine.connect() as connection:
            connection.execute(sqlalchemy.text("SELECT 1"))
        return None
    except Exception as err:  # noqa: BLE001 - refused, unreachable, no such user or database
        cause = getattr(err, "orig", None) or err
        return (f"the MLflow database {shown} does not answer on {where} ({type(cause).__name__}: "
                f"{hidden(cause)}); start it or correct tracking.uri (nothing was run)")
    finally:
        engine.dispose()
