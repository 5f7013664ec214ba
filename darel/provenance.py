"""What produced an artifact, and checks that an artifact still matches it.

Every intermediate file records its producer (``produced_by``: the content hashes of the
inputs it was made from), and every reader validates the file against its schema and its
producer before using it: wrong shapes, out-of-range values or a file that no longer
matches what it claims to come from stop with an error naming the file and the field.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np

from darel.io import file_sha256, json_text

PACKAGE = Path(__file__).resolve().parent


class ArtifactError(ValueError):
    """An input file that does not match its schema or its producer."""


@lru_cache(maxsize=1)
def code_version() -> str:
    """sha256 over the package's source files: a checkpoint written by other code is not resumed."""
    digest = hashlib.sha256()
    for path in sorted(PACKAGE.rglob("*.py")):
        digest.update(str(path.relative_to(PACKAGE)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def content_sha256(obj: Any) -> str:
    """sha256 of a JSON-able object in the project's one JSON form (darel.io.json_text)."""
    return hashlib.sha256(json_text(obj).encode("utf-8")).hexdigest()


def array_sha256(*arrays: np.ndarray) -> str:
    digest = hashlib.sha256()
    for array in arrays:
        array = np.ascontiguousarray(array)
        digest.update(str(array.dtype).encode() + str(array.shape).encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def sha256_of(path: str | Path) -> str:
    return file_sha256(path)


# ---- losses.npz (offline scoring) --------------------------------------------------------

def losses_record(index: np.ndarray, label: np.ndarray, loss: np.ndarray, scorer_sha256: str) -> dict:
    """The arrays of losses.npz plus what produced them and a hash of their content."""
    return {"index": index, "label": label, "loss": loss, "scorer_sha256": np.str_(scorer_sha256),
            "content_sha256": np.str_(array_sha256(index, label, loss))}


def check_losses(scored: dict, path: str | Path, *, labels: np.ndarray | None = None,
                 scorer_sha256: str | None = None) -> None:
    """losses.npz must be whole (one finite loss per training sample, in index order), its
    content must match the hash it was written with, its labels the data's, and its scorer
    the model given."""
    where = f"{path}"
    for key in ("index", "label", "loss", "content_sha256"):
        if key not in scored:
            raise ArtifactError(f"{where}: field {key!r} missing (written by an older version? re-run the scoring)")
    index, label, loss = scored["index"], scored["label"], scored["loss"]
    if not (index.ndim == label.ndim == loss.ndim == 1 and len(index) == len(label) == len(loss)):
        raise ArtifactError(f"{where}: index, label and loss must be 1-D of one length, got shapes "
                            f"{index.shape}, {label.shape}, {loss.shape}")
    if not np.array_equal(index, np.arange(len(index))):
        raise ArtifactError(f"{where}: field 'index' is not 0..{len(index) - 1} in order (rows reordered?)")
    if not np.isfinite(loss).all():
        raise ArtifactError(f"{where}: field 'loss' holds {int((~np.isfinite(loss)).sum())} non-finite value(s)")
    if array_sha256(index, label, loss) != str(scored["content_sha256"]):
        raise ArtifactError(f"{where}: its content does not match the hash it was written with (edited or "
                            "permuted after scoring); re-run the scoring stage")
    if labels is not None and (len(labels) != len(label) or not np.array_equal(np.asarray(labels), label)):
        raise ArtifactError(f"{where}: field 'label' does not match the data set's labels (another data set or a "
                            "permutation); re-run the scoring stage")
    if scorer_sha256 is not None and str(scored.get("scorer_sha256")) != scorer_sha256:
        raise ArtifactError(f"{where}: field 'scorer_sha256' names another scorer model than the one given; "
                            "re-run the scoring stage")


# ---- calibration.json ---------------------------------------------------------------------

_pos_int = {"type": "integer", "minimum": 1}
_fraction = {"type": "number", "exclusiveMinimum": 0, "maximum": 1}
_pos = {"type": "number", "exclusiveMinimum": 0}
CALIBRATION_SCHEMA = {
    "type": "object",
    "required": ["batch", "alpha", "A", "eta"],
    "properties": {
        "batch": _pos_int, "alpha": _fraction, "A": _fraction, "eta": _pos_int,
        "t_max_s": {"type": ["number", "null"], "exclusiveMinimum": 0},
        "t": {"type": ["number", "null"]}, "m": {"type": ["number", "null"]},
        "planned_epochs": _pos_int, "score_batch": _pos_int, "n_kept": _pos_int,
        "t_b_s": _pos, "t_ref_s": _pos, "t_score_s": _pos, "seconds_per_probe_second": _pos,
        "epoch_cost_s": {"type": "object", "additionalProperties": {"type": "number", "minimum": 0}},
    },
}
# A budgeted cell's calibration has everything the plan needs; IDS + ADONIS settings have none.
BUDGETED_REQUIRED = ["t_max_s", "planned_epochs", "score_batch", "n_kept", "t_b_s", "t_ref_s", "t_score_s",
                     "seconds_per_probe_second", "epoch_cost_s"]


def check_calibration(calibration: Any, path: str | Path) -> dict:
    """calibration.json against its schema; the error names the file and the field."""
    errors = sorted(jsonschema.Draft202012Validator(CALIBRATION_SCHEMA).iter_errors(calibration),
                    key=lambda e: list(e.absolute_path))
    if not errors and isinstance(calibration, dict) and calibration.get("t_max_s") is not None:
        missing = [key for key in BUDGETED_REQUIRED if key not in calibration]
        if missing:
            raise ArtifactError(f"{path}: field(s) {missing} missing (written by an older version? re-run the "
                                "calibration)")
    if errors:
        err = errors[0]
        field = ".".join(str(p) for p in err.absolute_path) or "(top level)"
        raise ArtifactError(f"{path}: field {field} = {err.instance!r}: {err.message}; re-run the calibration")
    return calibration


# ---- train.json, eval.json -------------------------------------------------------------------

_count = {"type": "integer", "minimum": 1}
TRAIN_SCHEMA = {
    "type": "object",
    "required": ["time_s", "peak_mem_bytes", "steps", "epochs_completed", "epochs_planned", "batch", "n_train",
                 "n_train_full", "samples_trained", "energy", "curves"],
    "properties": {
        "time_s": _pos, "peak_mem_bytes": _count, "steps": _count, "epochs_completed": _count,
        "epochs_planned": _count, "batch": _count, "n_train": _count, "n_train_full": _count,
        "samples_trained": _count, "energy": {"type": "object"}, "curves": {"type": "object"},
    },
}
EVAL_SCHEMA = {
    "type": "object",
    "required": ["top1", "n_test"],
    "properties": {"top1": {"type": "number", "minimum": 0, "maximum": 100}, "n_test": _count},
}


def _validate(obj: Any, schema: dict, path: str | Path, rerun: str) -> None:
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(obj), key=lambda e: list(e.absolute_path))
    if errors:
        err = errors[0]
        field = ".".join(str(p) for p in err.absolute_path) or "(top level)"
        if err.validator == "required":
            raise ArtifactError(f"{path}: {err.message} (written by an older version? {rerun})")
        raise ArtifactError(f"{path}: field {field} = {err.instance!r}: {err.message}; {rerun}")


def check_train(train: Any, path: str | Path) -> dict:
    """A training stage's train.json (read for T and M by the calibration, for the row by
    the report): positive time, memory and counts, and counts that agree."""
    _validate(train, TRAIN_SCHEMA, path, "re-run the training")
    if train["epochs_completed"] > train["epochs_planned"]:
        raise ArtifactError(f"{path}: field epochs_completed = {train['epochs_completed']} exceeds epochs_planned = "
                            f"{train['epochs_planned']}; re-run the training")
    if train["n_train"] > train["n_train_full"]:
        raise ArtifactError(f"{path}: field n_train = {train['n_train']} exceeds n_train_full = "
                            f"{train['n_train_full']}; re-run the training")
    return train


def check_eval(evaluation: Any, path: str | Path) -> dict:
    """eval.json: top-1 in [0, 100] over at least one test image."""
    _validate(evaluation, EVAL_SCHEMA, path, "re-run the evaluation")
    return evaluation


# ---- subset.npz ----------------------------------------------------------------------------

def check_subset(subset: dict, path: str | Path, *, n_samples: int, calibration_sha256: str | None = None) -> None:
    """subset.npz: sorted unique indices within the data set, made from the calibration given."""
    indices = subset.get("indices")
    if indices is None or indices.ndim != 1 or len(indices) == 0:
        raise ArtifactError(f"{path}: field 'indices' must be a non-empty 1-D array")
    if indices.min() < 0 or indices.max() >= n_samples or not np.all(np.diff(indices) > 0):
        raise ArtifactError(f"{path}: field 'indices' must be sorted, unique and within [0, {n_samples})")
    recorded = subset.get("calibration_sha256")
    if calibration_sha256 is not None and recorded is None:
        raise ArtifactError(f"{path}: field 'calibration_sha256' missing (written by an older version?); re-run the "
                            "subset stage")
    if calibration_sha256 is not None and str(recorded) != calibration_sha256:
        raise ArtifactError(f"{path}: field 'calibration_sha256' names another calibration than the one given "
                            "(the subset is stale); re-run the subset stage")
