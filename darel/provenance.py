"""What produced an artifact, and checks that an artifact still matches it.

Every intermediate file records its producer (``produced_by``: the content hashes of the
inputs it was made from), and every reader validates the file against its schema and its
producer before using it: wrong shapes, out-of-range values or a file that no longer
matches what it claims to come from stop with an error naming the file and the field.

Integrity, for every artifact a later stage reads:

* a JSON record is *sealed*: it carries ``record_seal``, a keyed MAC (HMAC-SHA256 under
  the user's or the lab's seal key, darel.sealkey) of its own content (``write_record``);
  ``read_record`` recomputes it, so one flipped byte, an edited figure or a seal
  recomputed without the key stops the reader; a cell record also carries
  ``results_sha256``, the plain sha256 of its results alone (without the fields that are
  measurements of time, energy or memory: darel.records.MEASUREMENTS), equal for two
  builds that computed the same results, under any key (``seal_results`` /
  ``check_results``): a fingerprint to compare builds, itself covered by the keyed seal;
* an ``.npz`` archive carries ``record_seal`` over its arrays the same way
  (``write_sealed_npz`` / ``read_sealed_npz``);
* a binary file (model weights) or a folder (tokenizer, pretrained model, adapter) has
  its sha256 in its producer's sealed record (``model_sha256`` in train.json, a folder's
  ``files_sha256``), checked by ``check_file`` / ``check_folder`` before it is loaded.

Identity, for every sealed record (JSON or .npz) written at a place of the layout: its
``identity`` block holds what its place says it is (profile, table, model, seed, cell,
method, data set; darel.layout.path_identity), the path it was written to, and the sha256
of the inputs its writer names (``inputs``). ``read_record`` / ``read_sealed_npz`` compare
the block with the place they read it from, and with the inputs the reader was given, so
a record copied into another cell, another profile or beside other inputs stops the
reader in one line naming both places.

Every failure names the file and what re-creates it (darel.layout.how_to_recreate). No
reader unpickles anything: JSON, numpy arrays without pickle, and torch files with
``weights_only=True`` only.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping, Optional

import jsonschema
import numpy as np

from darel import io, sealkey
from darel.io import file_sha256, json_text
from darel.layout import how_to_recreate, path_identity

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


# ---- sealed records --------------------------------------------------------------------------

# The seal of a record or an archive: a keyed MAC (darel.sealkey) over its content, so that
# who can write the project folder but holds no key cannot recompute it after an edit.
RECORD_KEY = "record_seal"


def _normal(obj: Any) -> Any:
    """``obj`` as it reads back from its JSON file (numpy scalars, tuples and non-string
    keys turned into what JSON holds), so a seal computed before writing matches the file."""
    return json.loads(json_text(obj))


IDENTITY_KEY = "identity"
Inputs = Optional[Mapping[str, Any]]  # name -> the file a record was made from (None: skipped)


def _place(path: str | Path) -> str | None:
    """``path`` relative to the project (the working folder), or None outside it."""
    import os

    absolute = Path(os.path.abspath(path))
    try:
        return absolute.relative_to(Path(os.path.abspath(os.getcwd()))).as_posix()
    except ValueError:
        return None


def identity(path: str | Path, inputs: Inputs = None) -> dict | None:
    """The identity block of a record written at ``path``: what its place says it is, the
    place itself, and the sha256 of each named input file (None: no block, for a path
    outside the layout written without inputs)."""
    place = _place(path)
    fields = path_identity(place) if place is not None else None
    given = {name: str(value) for name, value in (inputs or {}).items() if value}
    if fields is None and not given:
        return None
    block: dict[str, Any] = {**(fields or {}), "path": place if place is not None else str(path)}
    if given:
        block["inputs_sha256"] = {name: file_sha256(value) for name, value in sorted(given.items())}
    return block


def check_identity(path: str | Path, block: Any, inputs: Inputs = None) -> None:
    """A record read from ``path`` must carry the identity of that place, and have been
    made from the ``inputs`` (name -> file) the reader was given; ArtifactError naming
    both places otherwise."""
    place = _place(path)
    expected = path_identity(place) if place is not None else None
    given = {name: value for name, value in (inputs or {}).items() if value}
    if expected is None and not given:
        return
    if not isinstance(block, dict):
        raise damaged(path, f"carries no {IDENTITY_KEY} (written by an older version)")
    differs = [f"{key} {block.get(key)!r} instead of {value!r}" for key, value in (expected or {}).items()
               if block.get(key) != value]
    if differs:
        raise damaged(path, f"holds the record written as {block.get('path')} ({', '.join(differs)}), not the one of "
                            f"this place (copied or moved here)")
    recorded = block.get("inputs_sha256") or {}
    for name, value in sorted(given.items()):
        if name not in recorded:
            raise damaged(path, f"records no sha256 of its {name} (written by an older version)")
        if file_sha256(value) != recorded[name]:
            raise damaged(path, f"was made from another {name} than {value} (its {name} had sha256 "
                                f"{recorded[name][:12]}..., {value} has {file_sha256(value)[:12]}...)")


def seal(record: dict) -> dict:
    """``record`` (its JSON form) with its keyed seal (``record_seal``) over the rest of its content."""
    body = _normal({key: value for key, value in record.items() if key != RECORD_KEY})
    return {**body, RECORD_KEY: sealkey.seal_bytes(json_text(body).encode("utf-8"))}


def seal_failure(path: str | Path, problem: str | None) -> None:
    """Raise the one-line error of a record whose seal does not check (``problem``: why)."""
    if problem is not None:
        raise damaged(path, problem)


def write_record(path: str | Path, record: dict, inputs: Inputs = None) -> dict:
    """Write a sealed JSON record atomically, with its identity (its place and the sha256 of
    ``inputs``: name -> the file it was made from); return it as ``read_record`` will (no seal)."""
    block = identity(path, inputs)
    sealed = seal(record if block is None else {**record, IDENTITY_KEY: block})
    io.write_json(path, sealed)
    return {key: value for key, value in sealed.items() if key != RECORD_KEY}


def damaged(path: str | Path, what: str) -> ArtifactError:
    return ArtifactError(f"{path}: {what}; {how_to_recreate(path, missing=what.startswith('missing'))}")


def read_record(path: str | Path, inputs: Inputs = None) -> dict:
    """A sealed JSON record, without its seal; ArtifactError naming the file when it is
    missing, not JSON, unsealed, its content no longer matches its seal, or its identity
    is not that of its place or of the ``inputs`` given (check_identity)."""
    path = Path(path)
    try:  # bounded: a plain file of at most io.RECORD_LIMIT, JSON of bounded depth and digit runs
        text = io.read_regular_bytes(path, io.RECORD_LIMIT, "JSON record").decode("utf-8")
        record = io.safe_json_loads(text, path)
    except FileNotFoundError:
        raise damaged(path, "missing") from None
    except io.InputRefused as err:
        raise damaged(path, err.what) from None
    except UnicodeDecodeError:
        raise damaged(path, "not UTF-8 text (damaged)") from None
    except json.JSONDecodeError as err:
        raise damaged(path, f"not valid JSON ({err.msg} at line {err.lineno}, column {err.colno}): damaged or cut "
                            "short") from None
    if not isinstance(record, dict) or RECORD_KEY not in record:
        raise damaged(path, f"carries no {RECORD_KEY} (written by hand or by an older version)")
    recorded = record.pop(RECORD_KEY)
    seal_failure(path, sealkey.seal_problem(json_text(record).encode("utf-8"), recorded))
    check_identity(path, record.get(IDENTITY_KEY), inputs)
    return record


def check_file(path: str | Path, expected_sha256: str | None, record_path: str | Path) -> None:
    """``path`` must have the sha256 its producer recorded in ``record_path``."""
    path = Path(path)
    if not path.is_file():
        raise damaged(path, "missing")
    if not expected_sha256:
        raise damaged(path, f"{record_path} records no sha256 for it (written by an older version)")
    if file_sha256(path) != expected_sha256:
        raise damaged(path, f"its sha256 differs from the one recorded in {record_path} (edited or damaged after "
                            "it was written)")


def folder_sha256(folder: str | Path, exclude: tuple[str, ...] = ()) -> dict[str, str]:
    """sha256 of every file of ``folder`` (recursively, by relative path), except ``exclude``."""
    folder = Path(folder)
    return {str(p.relative_to(folder)): file_sha256(p) for p in sorted(folder.rglob("*"))
            if p.is_file() and str(p.relative_to(folder)) not in exclude and not p.name.startswith(".")}


def write_folder_record(folder: str | Path, record_name: str, record: dict | None = None,
                        inputs: Inputs = None) -> dict:
    """Seal a written folder: ``record_name`` inside it (a sealed record, ``record`` plus
    ``files_sha256`` of every other file), for ``check_folder``."""
    folder = Path(folder)
    return write_record(folder / record_name, {**(record or {}),
                                               "files_sha256": folder_sha256(folder, exclude=(record_name,))},
                        inputs)


def check_folder(folder: str | Path, record_name: str, inputs: Inputs = None) -> dict:
    """A folder written with ``folder_sha256`` recorded as ``files_sha256`` in its sealed
    record ``record_name``: every file must be there, unchanged, and no other file
    added. Returns the record."""
    folder = Path(folder)
    record_path = folder / record_name
    record = read_record(record_path, inputs)
    recorded = record.get("files_sha256")
    if not isinstance(recorded, dict) or not recorded:
        raise damaged(folder, f"{record_path} lists no files_sha256 (written by an older version)")
    actual = folder_sha256(folder, exclude=(record_name,))
    for name in sorted(set(recorded) | set(actual)):
        if name not in actual:
            raise damaged(folder / name, f"missing from {folder} (listed in {record_path})")
        if name not in recorded:
            raise damaged(folder / name, f"not listed in {record_path} (added after {folder} was written)")
        if actual[name] != recorded[name]:
            raise damaged(folder / name, f"its sha256 differs from the one recorded in {record_path} (edited or "
                                         "damaged after it was written)")
    return record


def _npz_content(arrays: dict[str, np.ndarray]) -> bytes:
    """What an archive's seal covers: each array's name, dtype, shape and bytes (by sha256)."""
    return b"".join(name.encode() + b"\0" + array_sha256(np.asarray(arrays[name])).encode()
                    for name in sorted(arrays))


def _npz_seal(arrays: dict[str, np.ndarray]) -> str:
    return sealkey.seal_bytes(_npz_content(arrays))


def write_sealed_npz(path: str | Path, inputs: Inputs = None, **arrays: Any) -> None:
    """An .npz archive with its keyed seal ``record_seal`` over its arrays (names, dtypes, shapes, bytes)
    and its identity (as JSON text in the array ``identity``, sealed with the others)."""
    plain = {name: np.asarray(value) for name, value in arrays.items() if name != RECORD_KEY}
    block = identity(path, inputs)
    if block is not None:
        plain[IDENTITY_KEY] = np.str_(json_text(block))
    io.write_npz(path, **plain, **{RECORD_KEY: np.str_(_npz_seal(plain))})


def read_npz_checked(path: str | Path) -> dict[str, np.ndarray]:
    """The arrays of an .npz archive (never unpickled); an archive that cannot be read
    names the file and what re-creates it. Bounded (io.read_npz, io.SEALED_NPZ): a plain
    file, its array headers checked before anything is allocated."""
    try:
        return io.read_npz(path, io.SEALED_NPZ)
    except FileNotFoundError:
        raise damaged(path, "missing") from None
    except io.InputRefused as err:
        raise damaged(path, err.what) from None
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, KeyError) as err:
        raise damaged(path, f"not a readable .npz archive ({type(err).__name__}: {str(err)[:120]})") from None


def read_sealed_npz(path: str | Path, inputs: Inputs = None) -> dict[str, np.ndarray]:
    """The arrays of a sealed .npz archive, its seal checked (and removed), its identity
    checked against its place and the ``inputs`` given (and removed)."""
    arrays = read_npz_checked(path)
    recorded = arrays.pop(RECORD_KEY, None)
    if recorded is None:
        raise damaged(path, f"carries no {RECORD_KEY} (written by an older version)")
    seal_failure(path, sealkey.seal_problem(_npz_content(arrays), str(recorded)))
    block = arrays.pop(IDENTITY_KEY, None)
    check_identity(path, None if block is None else io.safe_json_loads(str(block), path), inputs)
    return arrays


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


# ---- results seal ---------------------------------------------------------------------------

RESULTS_KEY = "results_sha256"
# Not results: the seals, and the hashes of the records a record was made from (those hold
# measurements of their own, so they differ between builds as the measurements do).
# "identity" is the block of the record's place and input hashes.
_NOT_RESULTS = (RECORD_KEY, RESULTS_KEY, "sources_sha256", "sources", "identity")


def _without(record: dict, names: tuple[str, ...]) -> dict:
    """``record`` without the fields ``names`` (a dotted name reaches into a sub-dict)."""
    out = dict(record)
    for name in names:
        head, _, rest = name.partition(".")
        if rest and isinstance(out.get(head), dict):
            out[head] = _without(out[head], (rest,))
        elif not rest:
            out.pop(head, None)
    return out


def results_view(record: dict, measurements: tuple[str, ...]) -> dict:
    """What a record holds as results: everything but the fields ``measurements`` names
    (time, energy, memory and how each was measured), its seals and its input hashes."""
    return _without(_normal(record), (*_NOT_RESULTS, *measurements))


def results_sha256(record: dict, measurements: tuple[str, ...]) -> str:
    """sha256 of ``results_view``: equal for two builds that computed the same results,
    however differently they were timed or metered."""
    return content_sha256(results_view(record, measurements))


def seal_results(record: dict, measurements: tuple[str, ...]) -> dict:
    """``record`` with ``results_sha256``; ``write_record`` then seals both (record_seal)."""
    return {**record, RESULTS_KEY: results_sha256(record, measurements)}


def check_results(record: dict, measurements: tuple[str, ...], path: str | Path) -> str | None:
    """A record's ``results_sha256`` recomputed: the hash (None for a record written
    before records carried one); ArtifactError naming the file when it no longer matches."""
    recorded = record.get(RESULTS_KEY)
    if recorded is None:
        return None
    if results_sha256(record, measurements) != recorded:
        raise damaged(path, f"its results differ from its {RESULTS_KEY} (edited after it was written, or the list "
                            "of measurement fields changed: rebuild it)")
    return recorded


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
