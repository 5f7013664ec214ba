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


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def environment_tags() -> dict[str, str]:
    """Where and with what a run was produced: code commit, hardware, library versions."""
    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain") if commit else None
    try:
        import torch

        if torch.cuda.is_available():
            device = f"cuda: {torch.cuda.get_device_name(0)}"
        else:
            device = f"cpu: {_cpu_model()}"
    except Exception:  # noqa: BLE001 - only a label
        device = f"cpu: {_cpu_model()}"
    return {
        "git_commit": commit or "unknown",
        # Untracked files count: new source files change what ran just as edits do.
        "git_dirty": "unknown" if status is None else str(bool(status)).lower(),
        "device": device,
        "hostname": socket.gethostname(),
        "python_version": platform.python_version(),
        "torch_version": _version("torch"),
        "numpy_version": _version("numpy"),
        "mlflow_version": _version("mlflow"),
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
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
TRAINING_EXPERIMENT = "custom_model_development"


# The MLflow UI's saved views: an experiment tag ``mlflow.sharedViewState.<key>`` holding
# the page's state as JSON (the filter, the order and the columns), opened by the URL
# parameter ``viewStateShareKey=<key>``; ``workflowType=machine_learning`` in the same URL
# shows the training runs instead of the GenAI overview (the UI keeps that toggle in the
# browser and ignores the experiment's kind).
SHARED_VIEW_PREFIX = "mlflow.sharedViewState."
# Each table's columns in the order a reader compares them: ours, then the paper's.
TABLE_VIEW_METRICS: dict[str, tuple[str, ...]] = {
    "table1": ("t", "m", "batch", "alpha", "A", "eta", "epochs", "boost", "boost_paper", "acc_drop_pp",
               "acc_drop_pp_paper", "mem_cut", "mem_cut_paper", "co2e_cut", "co2e_cut_paper", "budget_adherence",
               "top1"),
    "table2": ("alpha", "boost", "BLEU", "TER", "METEOR", "NIST", "ROUGE_L", "CIDEr"),
    "table3": ("alpha", "boost", "BLEU", "TER", "METEOR", "NIST", "ROUGE_L", "CIDEr"),
}


RUN_NAME_COLUMN = "attributes.`Run Name`"


def table_view_key(profile: str) -> str:
    """The saved view's key for one profile's table (the same name in every experiment)."""
    return f"darel-{_slug(profile)}"


def table_view_state(experiment: str, profile: str) -> dict[str, Any]:
    """The experiment page's state that shows one profile's table: its cell runs only (no
    DVC experiment runs, no table-files run, no unfinished training), sorted by name, with
    the table's columns."""
    metrics = TABLE_VIEW_METRICS.get(experiment, ("boost",))
    columns = [f"metrics.`{name}`" for name in metrics] + ["tags.`method`", "tags.`seed`"]
    return {
        "searchFilter": f"tags.scope = 'table' and tags.profile = '{profile}' and tags.state = 'finished'",
        "orderByKey": "tags.`mlflow.runName`",
        "orderByAsc": True,
        "selectedColumns": columns,
        "columnOrder": [RUN_NAME_COLUMN, *columns],
        # Wide enough for each header (the UI cuts a header to its column's width).
        "columnWidths": {RUN_NAME_COLUMN: 270, **{column: max(64, 7 * len(column.split("`")[1]) + 34)
                                                  for column in columns}},
        "runListHidden": False,
        "viewMaximized": False,
    }


def set_table_view(client: Any, experiment_id: str, experiment: str, profile: str) -> str:
    """Write (or refresh) the saved view of ``profile``'s table in the experiment; returns its key."""
    key = table_view_key(profile)
    value = json.dumps(table_view_state(experiment, profile), separators=(",", ":"))
    found = client.get_experiment(experiment_id)
    if found.tags.get(SHARED_VIEW_PREFIX + key) != value:
        client.set_experiment_tag(experiment_id, SHARED_VIEW_PREFIX + key, value)
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
        db.parent.mkdir(parents=True, exist_ok=True)
    lock = lock_path_for(tracking_uri)
    with _exclusive_lock(lock) if lock is not None else contextlib.nullcontext():
        yield MlflowClient(tracking_uri=tracking_uri), db


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


def follow_table(tracking_uri: str, experiment: str, profile: str, rows: dict[str, dict[str, Any]],
                 table_key: str, artifacts: list[str | Path]) -> dict[str, int]:
    """Keep the experiment in step with a table: log each row's derived figures (``rows``:
    cell_key -> metrics) into its run, delete the runs of this profile's cells that are
    no longer in the table, and record the table's files in a run of its own."""
    from mlflow.entities import Metric, RunStatus, ViewType

    counts = {"updated": 0, "deleted": 0, "restored": 0}
    with _store(tracking_uri) as (client, db):
        experiment_id = _experiment_id(client, experiment, db)
        runs = client.search_runs([experiment_id], filter_string=_scope_filter() + f" and tags.profile = '{profile}'",
                                  run_view_type=ViewType.ACTIVE_ONLY, max_results=50_000)
        now_ms = int(time.time() * 1000)
        for run in runs:
            key = run.data.tags.get("cell_key")
            if key == table_key:
                client.delete_run(run.info.run_id)  # replaced below
            elif key in rows:
                metrics = [Metric(k, float(v), now_ms, 0) for k, v in sorted(rows[key].items())
                           if _as_number(k, v) is not None]
                if metrics:
                    client.log_batch(run.info.run_id, metrics=metrics)
                counts["updated"] += 1
            else:
                client.delete_run(run.info.run_id)
                counts["deleted"] += 1
        # A row whose run an earlier table deleted (the budget left the table and came back,
        # its cell files kept): its newest finished run is restored rather than left out.
        active = {run.data.tags.get("cell_key") for run in runs}
        for key in sorted(set(rows) - active):
            gone = client.search_runs([experiment_id], filter_string=_scope_filter(key) + " and tags.state = 'finished'",
                                      run_view_type=ViewType.DELETED_ONLY, max_results=1,
                                      order_by=["attributes.start_time DESC"])
            if gone:
                client.restore_run(gone[0].info.run_id)
                metrics = [Metric(k, float(v), now_ms, 0) for k, v in sorted(rows[key].items())
                           if _as_number(k, v) is not None]
                if metrics:
                    client.log_batch(gone[0].info.run_id, metrics=metrics)
                counts["restored"] += 1
        set_table_view(client, experiment_id, experiment, profile)
        run_id = client.create_run(experiment_id, run_name=_run_name(table_key),
                                   tags={"cell_key": table_key, "profile": profile, "kind": "table",
                                         **run_scope(), **environment_tags()}).info.run_id
        for path in artifacts:
            client.log_artifact(run_id, str(path))
        client.set_terminated(run_id, RunStatus.to_string(RunStatus.FINISHED))
    return counts


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
    """The URI with any password replaced by ***, for messages and logs."""
    return re.sub(r"^([a-z0-9+]+://[^:@/]+):[^@/]*@", r"\1:***@", tracking_uri)


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
