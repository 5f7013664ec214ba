"""MLflow record of a finished Table 1 cell: one run per cell, replaced on re-runs,
safe when several workflow jobs finish at the same moment."""

from __future__ import annotations

import os

# Before mlflow is imported anywhere through this module: no usage reporting.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

import contextlib
import fcntl
import hashlib
import json
import math
import platform
import re
import socket
import subprocess
import sys
import tempfile
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


def lock_path_for(tracking_uri: str) -> Path:
    """The lock file that serialises writers of one tracking store: beside the SQLite
    file, or in the temp folder (keyed by the URI) for other stores."""
    db = _sqlite_path(tracking_uri)
    if db is not None:
        return db.with_name(db.name + ".lock")
    digest = hashlib.sha256(tracking_uri.encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"darel-mlflow-{digest}.lock"


@contextlib.contextmanager
def _exclusive_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


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
    """Record one finished cell as an MLflow run named ``cell_key`` and return its id.

    Params may be nested (logged with dotted names). Final metrics that are None or
    NaN are skipped and listed in the tag ``missing_metrics``. Each curve is logged as
    a metric history with step = epoch index (0-based). Once the new run is complete,
    earlier active runs of the same experiment with the same ``cell_key`` tag are
    deleted, so the UI shows one run per cell; if logging fails, the new run is marked
    FAILED and the earlier one is kept. Everything happens under an exclusive file
    lock, so concurrent jobs never write the SQLite store at the same time.
    """
    if not isinstance(cell_key, str) or not cell_key or "'" in cell_key or "\\" in cell_key:
        raise ValueError(f"cell_key must be a non-empty string without quotes or backslashes, got {cell_key!r}")
    if not experiment:
        raise ValueError(f"experiment must be a non-empty name, got {experiment!r}")
    artifact_paths = [Path(p) for p in artifacts]
    missing_files = [str(p) for p in artifact_paths if not p.exists()]
    if missing_files:
        raise ValueError(f"artifacts do not exist: {missing_files}")
    clashes = sorted(set(metrics) & set(curves))
    if clashes:
        raise ValueError(f"names used both as final metric and as curve: {clashes}")

    flat_params: dict[str, Any] = {}
    _flatten("", params, flat_params)
    final_metrics: dict[str, float] = {}
    missing_metrics: list[str] = []
    for name, value in metrics.items():
        number = _as_number(name, value)
        if number is None:
            missing_metrics.append(name)
        else:
            final_metrics[name] = number
    curve_points: list[tuple[str, int, float]] = []
    for name, values in curves.items():
        for step, value in enumerate(values):
            if value is not None:
                curve_points.append((name, step, float(value)))
    all_tags = {**environment_tags(), **{str(k): v for k, v in tags.items()},
                "cell_key": cell_key, "missing_metrics": ",".join(sorted(missing_metrics))}

    from mlflow.entities import Metric, Param, RunStatus, RunTag, ViewType
    from mlflow.tracking import MlflowClient

    db = _sqlite_path(tracking_uri)
    if db is not None:
        db.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive_lock(lock_path_for(tracking_uri)):
        client = MlflowClient(tracking_uri=tracking_uri)
        found = client.get_experiment_by_name(experiment)
        if found is None:
            # Keep artifacts beside the database rather than wherever the job's cwd is.
            location = (db.resolve().parent / "mlartifacts" / _slug(experiment)).as_uri() if db else None
            experiment_id = client.create_experiment(experiment, artifact_location=location)
        else:
            experiment_id = found.experiment_id
            if found.lifecycle_stage == "deleted":
                client.restore_experiment(experiment_id)
        earlier = client.search_runs([experiment_id], filter_string=f"tags.cell_key = '{cell_key}'",
                                     run_view_type=ViewType.ACTIVE_ONLY, max_results=10_000)
        run = client.create_run(experiment_id, run_name=cell_key, tags={"cell_key": cell_key})
        run_id = run.info.run_id
        try:
            now_ms = int(time.time() * 1000)
            param_entities = [Param(k, _as_text(v, _MAX_PARAM_VALUE_CHARS)) for k, v in sorted(flat_params.items())]
            tag_entities = [RunTag(k, _as_text(v, _MAX_TAG_VALUE_CHARS)) for k, v in sorted(all_tags.items())]
            metric_entities = [Metric(k, v, now_ms, 0) for k, v in sorted(final_metrics.items())]
            metric_entities += [Metric(k, v, now_ms, step) for k, step, v in curve_points]
            for chunk in _chunks(param_entities, _MAX_PARAMS_TAGS_PER_BATCH):
                client.log_batch(run_id, params=chunk)
            for chunk in _chunks(tag_entities, _MAX_PARAMS_TAGS_PER_BATCH):
                client.log_batch(run_id, tags=chunk)
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
        for old in earlier:
            client.delete_run(old.info.run_id)
    return run_id


if __name__ == "__main__":  # pragma: no cover - manual check of the tags
    json.dump(environment_tags(), sys.stdout, indent=2)
    print()
