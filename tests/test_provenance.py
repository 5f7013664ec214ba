"""darel.provenance: every reader of an intermediate file checks its schema and producer,
and names the file and the field when something is off."""

import numpy as np
import pytest

from darel import provenance
from darel.provenance import ArtifactError

TRAIN = {"time_s": 12.5, "peak_mem_bytes": 1 << 20, "steps": 40, "epochs_completed": 4, "epochs_planned": 4,
         "batch": 16, "n_train": 90, "n_train_full": 100, "samples_trained": 360, "energy": {}, "curves": {}}


@pytest.mark.parametrize("field, value, expected", [
    ("time_s", 0, "field time_s = 0"),
    ("peak_mem_bytes", 0, "field peak_mem_bytes = 0"),
    ("batch", 2.5, "field batch = 2.5"),
    ("epochs_completed", 5, "field epochs_completed = 5 exceeds epochs_planned = 4"),
    ("n_train", 101, "field n_train = 101 exceeds n_train_full = 100"),
    ("energy", None, "field energy = None"),
])
def test_train_json_out_of_range_is_refused_naming_file_and_field(field, value, expected):
    with pytest.raises(ArtifactError, match="baseline/train.json: " + expected):
        provenance.check_train(dict(TRAIN, **{field: value}), "baseline/train.json")
    broken = {k: v for k, v in TRAIN.items() if k != field}
    with pytest.raises(ArtifactError, match=f"baseline/train.json: '{field}' is a required property"):
        provenance.check_train(broken, "baseline/train.json")
    assert provenance.check_train(dict(TRAIN), "baseline/train.json") == TRAIN


def test_eval_json_top1_must_be_a_percentage():
    assert provenance.check_eval({"top1": 71.5, "n_test": 10}, "eval.json")["top1"] == 71.5
    with pytest.raises(ArtifactError, match="eval.json: field top1 = 171.5"):
        provenance.check_eval({"top1": 171.5, "n_test": 10}, "eval.json")


@pytest.mark.parametrize("field, value", [("batch", 0), ("alpha", 0), ("A", 1.5), ("eta", 0), ("batch", "128")])
def test_calibration_out_of_range_is_refused(field, value):
    calibration = {"batch": 64, "alpha": 0.8, "A": 0.5, "eta": 2}
    assert provenance.check_calibration(dict(calibration), "c.json")
    with pytest.raises(ArtifactError, match=f"c.json: field {field} = {value!r}"):
        provenance.check_calibration(dict(calibration, **{field: value}), "c.json")


def test_losses_must_match_the_data_and_the_scorer():
    index = np.arange(6)
    label = np.array([0, 1, 2, 0, 1, 2])
    loss = np.linspace(0.1, 0.6, 6).astype(np.float32)
    record = provenance.losses_record(index, label, loss, scorer_sha256="abc")
    provenance.check_losses(record, "l.npz", labels=label, scorer_sha256="abc")
    with pytest.raises(ArtifactError, match="l.npz: field 'scorer_sha256'"):
        provenance.check_losses(record, "l.npz", scorer_sha256="another")
    # Rows permuted (labels and losses together), index kept, content hash recomputed.
    order = np.array([1, 0, 2, 4, 3, 5])
    permuted = provenance.losses_record(index, label[order], loss[order], scorer_sha256="abc")
    with pytest.raises(ArtifactError, match="l.npz: field 'label'"):
        provenance.check_losses(permuted, "l.npz", labels=label)
    with pytest.raises(ArtifactError, match="l.npz: field 'loss'"):
        provenance.check_losses(provenance.losses_record(index, label, np.where(index == 2, np.nan, loss), "abc"),
                                "l.npz")


def test_subset_must_be_sorted_unique_in_range_and_from_its_calibration():
    good = {"indices": np.array([0, 3, 5]), "calibration_sha256": np.str_("c1")}
    provenance.check_subset(good, "s.npz", n_samples=6, calibration_sha256="c1")
    for indices in (np.array([0, 6]), np.array([3, 1]), np.array([1, 1]), np.array([], dtype=np.int64)):
        with pytest.raises(ArtifactError, match="s.npz: field 'indices'"):
            provenance.check_subset(dict(good, indices=indices), "s.npz", n_samples=6)
    with pytest.raises(ArtifactError, match="s.npz: field 'calibration_sha256'"):
        provenance.check_subset(good, "s.npz", n_samples=6, calibration_sha256="c2")
    with pytest.raises(ArtifactError, match="s.npz: field 'calibration_sha256' missing"):
        provenance.check_subset({"indices": good["indices"]}, "s.npz", n_samples=6, calibration_sha256="c1")


def test_content_hash_is_the_hash_of_the_file_write_json_writes(tmp_path):
    from darel import io

    settings = {"method": "ids+adonis", "batch": 128, "A": 0.3, "t_max_s": None, "ids": {"keep": "far"}}
    io.write_json(tmp_path / "calibration.json", settings)
    assert provenance.content_sha256(settings) == io.file_sha256(tmp_path / "calibration.json")
