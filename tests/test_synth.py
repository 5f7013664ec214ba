"""The generated benchmark: exact shares, exclusive categories, a clean balanced test set,
the same bytes from the same settings, and the data stage's format with its columns."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from darel import config, synth
from darel.data import build_dataset, damaged_files, read_dataset, repair_dataset, write_dataset
from tests.conftest import ROOT


def tiny_params(**changes) -> dict:
    """The committed synth settings at a tiny size (generated in a few milliseconds)."""
    cfg = config.load_params(ROOT / "params.yaml", {"profiles": {"quick": {"dataset": "synth",
                                                                           "dataset_size": "cpu"}}})
    params = config.dataset_params(cfg)
    params.update(num_classes=10, n_train=400, n_test=100, image_size=8, classes_per_group=2, size="tiny")
    params.update(changes)
    return params


@pytest.fixture(scope="module")
def tiny():
    return build_dataset(tiny_params(), "unused-raw-folder")


def test_shares_are_exact_and_categories_exclusive(tiny):
    train, test, meta = tiny
    params = tiny_params()
    category = train["category"]
    counts = np.bincount(category, minlength=len(synth.CATEGORIES))
    n = len(category)
    assert n == params["n_train"] == meta["n_train"]
    assert counts[synth.NOISY] == round(params["label_noise"] * n)
    assert counts[synth.HARD] == round(params["hard"] * n)
    assert counts[synth.DUPLICATE] == round(params["near_duplicate"] * n)
    assert counts.sum() == n  # one category per sample
    assert meta["category_counts"] == dict(zip(synth.CATEGORIES, counts.tolist()))
    # Only label-noise samples carry a label other than their class.
    wrong = train["labels"] != train["true_labels"]
    assert np.array_equal(wrong, category == synth.NOISY)


def test_near_duplicates_are_faint_copies_of_clean_samples_of_their_class(tiny):
    train, _, _ = tiny
    rows = np.flatnonzero(train["category"] == synth.DUPLICATE)
    sources = train["duplicate_of"][rows]
    assert (sources >= 0).all() and (train["duplicate_of"][train["category"] != synth.DUPLICATE] == -1).all()
    assert (train["category"][sources] == synth.CLEAN).all()
    assert np.array_equal(train["labels"][rows], train["labels"][sources])
    gap = np.abs(train["images"][rows].astype(int) - train["images"][sources].astype(int)).mean()
    others = np.abs(train["images"][rows].astype(int) - train["images"][np.roll(sources, 1)].astype(int)).mean()
    assert gap < 3 and others > 5 * gap


def test_rare_classes_have_fewer_samples_and_the_test_set_is_clean_and_balanced(tiny):
    train, test, meta = tiny
    per_class = np.bincount(train["true_labels"], minlength=10)
    rare = meta["rare_classes"]
    assert len(rare) == round(tiny_params()["rare_classes"] * 10) >= 1
    assert np.array_equal(np.flatnonzero(train["rare"]), np.flatnonzero(np.isin(train["true_labels"], rare)))
    common = np.delete(per_class, rare)
    assert per_class[rare].max() < common.min() and common.max() - common.min() <= 1
    assert set(test) == {"images", "labels"}  # no categories: every test sample is clean
    assert np.bincount(test["labels"], minlength=10).tolist() == [10] * 10
    assert meta["label"].startswith("GENERATED") and meta["generated"] is True
    assert train["images"].shape == (400, 8, 8, 3) and train["images"].dtype == np.uint8


def test_the_same_settings_give_the_same_bytes_and_shares_leave_the_classes_alone():
    a = synth.make_prototypes(10, 2, 2, 0.3, (1.0, 3.0), (0.3, 0.6), seed=0)
    b = synth.make_prototypes(10, 2, 2, 0.3, (1.0, 3.0), (0.3, 0.6), seed=0)
    c = synth.make_prototypes(10, 2, 2, 0.3, (1.0, 3.0), (0.3, 0.6), seed=1)
    assert all(np.array_equal(a["atoms"][k], b["atoms"][k]) for k in a["atoms"])
    assert not np.array_equal(a["atoms"]["theta"], c["atoms"]["theta"])
    first, _, _ = build_dataset(tiny_params(), "unused")
    again, _, _ = build_dataset(tiny_params(), "unused")
    assert all(np.array_equal(first[k], again[k]) for k in first)
    other = build_dataset(tiny_params(seed=1), "unused")[0]
    assert not np.array_equal(first["images"], other["images"])


@pytest.mark.parametrize("changes, match", [({"label_noise": 0.5, "hard": 0.3, "near_duplicate": 0.2}, "no clean"),
                                            ({"n_test": 5}, "at least")])
def test_impossible_settings_are_refused(changes, match):
    with pytest.raises(ValueError, match=match):
        build_dataset(tiny_params(**changes), "unused")


def test_the_columns_survive_the_on_disk_format_and_reach_the_loader(tmp_path: Path, tiny):
    from darel.stagekit.models import load_split

    train, test, meta = tiny
    write_dataset(tmp_path, train, test, meta)
    again, _, meta_again = read_dataset(tmp_path)
    assert set(again) == set(train) and all(np.array_equal(again[k], train[k]) for k in train)
    assert meta_again["category_counts"] == meta["category_counts"]
    split = load_split(tmp_path, torch.device("cpu"))
    assert split["train_x"].shape == (400, 3, 8, 8) and split["train_x"].dtype == torch.uint8
    assert torch.equal(split["train_columns"]["category"], torch.from_numpy(train["category"]))
    assert set(split["train_columns"]) == set(synth.COLUMNS)
    # The data stage's repair re-creates a damaged file byte for byte, columns included.
    good = (tmp_path / "train.npz").read_bytes()
    (tmp_path / "train.npz").write_bytes(b"damaged")
    assert damaged_files(tmp_path) == ["train.npz"]
    assert repair_dataset(tmp_path, tiny_params(), "unused") == ["train.npz"]
    assert (tmp_path / "train.npz").read_bytes() == good


def test_the_profile_picks_a_size_and_only_synth_has_sizes():
    cfg = config.load_params(ROOT / "params.yaml", {"profiles": {"quick": {"dataset": "synth",
                                                                           "dataset_size": "cifar100"}}})
    params = config.dataset_params(cfg)
    assert (params["n_train"], params["n_test"], params["image_size"], params["num_classes"]) == (50000, 10000, 32,
                                                                                                  100)
    assert "sizes" not in params and params["size"] == "cifar100"
    with pytest.raises(config.ConfigError, match="dataset_size = 'huge'"):
        config.load_params(ROOT / "params.yaml", {"profiles": {"quick": {"dataset": "synth", "dataset_size": "huge"}}})
    with pytest.raises(config.ConfigError, match="only the generated data set"):
        config.load_params(ROOT / "params.yaml", {"profiles": {"paper": {"dataset_size": "cpu"}}})


# The digest of the tiny data set, rendered 37 samples per chunk, as the generator made it
# before chunks could be painted on threads (commit 2859eaa): every committed study ran on
# data from that code, so a change of these bytes must be deliberate.
TINY_DIGEST_37 = "061b1af367b1fc9ca226f8826310397b8f4a8243a81726e6244a9342307a83f4"


def _digest(train: dict, test: dict) -> str:
    import hashlib

    h = hashlib.sha256()
    for array in (train["images"], train["labels"], train["category"], test["images"], test["labels"]):
        h.update(np.ascontiguousarray(array).tobytes())
    return h.hexdigest()


@pytest.mark.parametrize("workers", [1, 3])
def test_the_bytes_do_not_depend_on_the_number_of_render_threads(monkeypatch, workers):
    monkeypatch.setattr(synth, "_CHUNK", 37)  # 11 train and 3 test chunks: threads finish out of order
    train, test, _ = build_dataset(tiny_params(), "unused", workers=workers)
    assert _digest(train, test) == TINY_DIGEST_37


def test_the_download_stage_refuses_a_bad_worker_count(tmp_path: Path):
    import json
    import subprocess
    import sys

    out = tmp_path / "data"
    proc = subprocess.run([sys.executable, str(ROOT / "stages/download.py"), "--params", json.dumps(tiny_params()),
                           "--out", str(out), "--workers", "0", "--log", str(tmp_path / "d.log")],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode != 0 and "--workers must be at least 1, got 0" in proc.stderr
    assert not out.exists()
