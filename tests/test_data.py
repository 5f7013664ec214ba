from __future__ import annotations

import hashlib
import io
import json
import math
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from darel.augment import DeviceAugment, to_tensors
from darel.data import (
    CIFAR100_MD5,
    CIFAR100_URL,
    IntegrityError,
    channel_mean_std,
    download_file,
    load_cifar100_archive,
    make_digits,
    read_dataset,
    write_dataset,
)


@pytest.fixture(scope="module")
def digits() -> tuple[dict, dict, dict]:
    return make_digits(image_size=16, test_fraction=0.2, seed=0)


# --- digits -------------------------------------------------------------------


def test_make_digits_shapes_and_dtypes(digits) -> None:
    train, test, meta = digits
    assert train["images"].shape[1:] == (16, 16, 1) and train["images"].dtype == np.uint8
    assert train["labels"].dtype == np.int64 and test["labels"].dtype == np.int64
    assert len(train["labels"]) + len(test["labels"]) == 1797
    assert meta["n_train"] == len(train["labels"]) and meta["n_test"] == len(test["labels"])
    assert meta["num_classes"] == 10 and meta["channels"] == 1 and meta["image_size"] == 16
    assert "QUICK PROFILE" in meta["label"]
    assert train["images"].max() > 200  # scaled to the 0..255 range
    assert len(meta["mean"]) == len(meta["std"]) == 1 and 0 < meta["mean"][0] < 1


def test_make_digits_is_stratified(digits) -> None:
    train, test, _ = digits
    train_share = np.bincount(train["labels"], minlength=10) / len(train["labels"])
    test_share = np.bincount(test["labels"], minlength=10) / len(test["labels"])
    np.testing.assert_allclose(train_share, test_share, atol=0.01)
    assert len(test["labels"]) == pytest.approx(0.2 * 1797, abs=1)


def test_make_digits_is_deterministic(digits) -> None:
    train, test, _ = digits
    again_train, again_test, _ = make_digits(image_size=16, test_fraction=0.2, seed=0)
    np.testing.assert_array_equal(train["images"], again_train["images"])
    np.testing.assert_array_equal(test["labels"], again_test["labels"])
    other_train, _, _ = make_digits(image_size=16, test_fraction=0.2, seed=1)
    assert not np.array_equal(train["labels"], other_train["labels"])


def test_make_digits_native_size() -> None:
    train, _, _ = make_digits(image_size=8)
    assert train["images"].shape[1:] == (8, 8, 1)


@pytest.mark.parametrize("kwargs", [{"image_size": 0}, {"test_fraction": 1.0}, {"test_fraction": 0}])
def test_make_digits_rejects_bad_arguments(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        make_digits(**kwargs)


def test_channel_mean_std_matches_numpy() -> None:
    images = np.random.default_rng(0).integers(0, 256, size=(5, 4, 4, 3), dtype=np.uint8)
    mean, std = channel_mean_std(images)
    unit = images.astype(np.float64) / 255
    np.testing.assert_allclose(mean, unit.mean(axis=(0, 1, 2)))
    np.testing.assert_allclose(std, unit.std(axis=(0, 1, 2)))


# --- on-disk format -------------------------------------------------------------


def test_write_read_round_trip(tmp_path: Path, digits) -> None:
    train, test, meta = digits
    written = write_dataset(tmp_path / "ds", train, test, meta)
    assert set(written["sha256"]) == {"train.npz", "test.npz"}
    read_train, read_test, read_meta = read_dataset(tmp_path / "ds")
    np.testing.assert_array_equal(read_train["images"], train["images"])
    np.testing.assert_array_equal(read_test["labels"], test["labels"])
    assert read_meta == json.loads(json.dumps(written))
    assert sorted(p.name for p in (tmp_path / "ds").iterdir()) == ["meta.json", "test.npz", "train.npz"]


def test_tampered_file_is_rejected(tmp_path: Path, digits) -> None:
    train, test, meta = digits
    write_dataset(tmp_path, train, test, meta)
    tampered = dict(test)
    tampered["labels"] = (test["labels"] + 1) % 10
    np.savez(tmp_path / "test.npz", **tampered)
    with pytest.raises(IntegrityError, match="test.npz"):
        read_dataset(tmp_path)


def test_write_rejects_bad_arrays(tmp_path: Path, digits) -> None:
    train, test, meta = digits
    bad = {"images": train["images"].astype(np.float32), "labels": train["labels"]}
    with pytest.raises(ValueError, match="uint8"):
        write_dataset(tmp_path, bad, test, meta)
    with pytest.raises(ValueError, match="num_classes"):
        write_dataset(tmp_path, train, test, {**meta, "num_classes": 5})


def test_to_tensors(digits) -> None:
    train, _, _ = digits
    images, labels = to_tensors(train, "cpu")
    assert images.dtype == torch.uint8 and images.shape == (len(labels), 1, 16, 16)
    assert labels.dtype == torch.int64
    np.testing.assert_array_equal(images[3, 0].numpy(), train["images"][3, :, :, 0])


# --- downloads ------------------------------------------------------------------


def test_cifar_constants() -> None:
    assert CIFAR100_URL == "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"
    assert CIFAR100_MD5 == "eb9058c3a382ffc7106e4002c42a8d85"


def _source(tmp_path: Path) -> tuple[Path, str]:
    source = tmp_path / "source.bin"
    source.write_bytes(bytes(range(256)) * 50)
    return source, hashlib.md5(source.read_bytes()).hexdigest()


def test_download_success_and_cache(tmp_path: Path) -> None:
    source, md5 = _source(tmp_path)
    dest = tmp_path / "cache" / "file.bin"
    assert download_file(source.as_uri(), dest, md5, progress=False) == dest
    assert dest.read_bytes() == source.read_bytes()
    source.unlink()  # a second call must not touch the URL
    assert download_file(source.as_uri(), dest, md5, progress=False) == dest
    assert [p.name for p in dest.parent.iterdir()] == ["file.bin"]


def test_download_md5_mismatch_leaves_nothing(tmp_path: Path) -> None:
    source, md5 = _source(tmp_path)
    dest = tmp_path / "cache" / "file.bin"
    wrong = "0" * 32
    with pytest.raises(IntegrityError, match=f"expected {wrong}, got {md5}"):
        download_file(source.as_uri(), dest, wrong, progress=False)
    assert not dest.exists()
    assert list(dest.parent.iterdir()) == []


def test_download_replaces_corrupt_cache(tmp_path: Path) -> None:
    source, md5 = _source(tmp_path)
    dest = tmp_path / "file.bin"
    dest.write_bytes(b"corrupt")
    download_file(source.as_uri(), dest, md5, progress=False)
    assert dest.read_bytes() == source.read_bytes()


# --- CIFAR-100 archive ------------------------------------------------------------


def _cifar_batch(n: int, seed: int) -> tuple[dict, np.ndarray]:
    rng = np.random.default_rng(seed)
    chw = rng.integers(0, 256, size=(n, 3, 32, 32), dtype=np.uint8)
    labels = rng.integers(0, 100, size=n)
    batch = {
        b"filenames": [f"img{i}.png".encode() for i in range(n)],
        b"batch_label": b"synthetic",
        b"fine_labels": labels.tolist(),
        b"coarse_labels": (labels // 5).tolist(),
        b"data": chw.reshape(n, 3072),
    }
    return batch, chw


def _write_fake_archive(path: Path, n_train: int, n_test: int) -> dict:
    truth = {}
    with tarfile.open(path, "w:gz") as archive:
        for split, n, seed in (("train", n_train, 1), ("test", n_test, 2)):
            batch, chw = _cifar_batch(n, seed)
            truth[split] = (chw, np.asarray(batch[b"fine_labels"]))
            payload = pickle.dumps(batch, protocol=2)  # the official batches are protocol-2 pickles
            info = tarfile.TarInfo(f"cifar-100-python/{split}")
            info.size = len(payload)
            archive.addfile(info, io.BytesIO(payload))
        meta_payload = pickle.dumps({b"fine_label_names": [b"x"] * 100})
        info = tarfile.TarInfo("cifar-100-python/meta")
        info.size = len(meta_payload)
        archive.addfile(info, io.BytesIO(meta_payload))
    return truth


def test_load_cifar100_archive(tmp_path: Path) -> None:
    path = tmp_path / "cifar.tar.gz"
    truth = _write_fake_archive(path, n_train=6, n_test=4)
    train, test, meta = load_cifar100_archive(path, expected_counts=(6, 4))
    assert train["images"].shape == (6, 32, 32, 3) and train["images"].dtype == np.uint8
    assert test["labels"].dtype == np.int64
    chw, labels = truth["train"]
    np.testing.assert_array_equal(train["images"][2, 5, 7], chw[2, :, 5, 7])  # CHW -> HWC
    np.testing.assert_array_equal(train["labels"], labels)
    np.testing.assert_array_equal(test["labels"], truth["test"][1])
    assert meta["label"] == "real CIFAR-100" and meta["num_classes"] == 100
    assert meta["mean"] == [0.5071, 0.4865, 0.4409] and meta["std"] == [0.2673, 0.2564, 0.2762]
    assert meta["n_train"] == 6 and meta["n_test"] == 4
    write_dataset(tmp_path / "ds", train, test, meta)
    assert read_dataset(tmp_path / "ds")[2]["sha256"]


def test_a_cifar_batch_that_asks_for_code_is_refused_unrun(tmp_path: Path) -> None:
    """The batches are pickles; the reader builds nothing but arrays, so a swapped archive
    whose batch would call os.system raises instead of running it."""
    import os

    marker = tmp_path / "code-ran"

    class RunsCode:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    payload = pickle.dumps({b"data": RunsCode(), b"fine_labels": [1]}, protocol=2)
    path = tmp_path / "cifar.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        for split in ("train", "test"):
            info = tarfile.TarInfo(f"cifar-100-python/{split}")
            info.size = len(payload)
            archive.addfile(info, io.BytesIO(payload))
    with pytest.raises(ValueError, match="refused to build (posix|os).system"):
        load_cifar100_archive(path, expected_counts=None)
    assert not marker.exists()


def test_load_cifar100_archive_validates_counts(tmp_path: Path) -> None:
    path = tmp_path / "cifar.tar.gz"
    _write_fake_archive(path, n_train=3, n_test=2)
    with pytest.raises(ValueError, match="50000"):
        load_cifar100_archive(path)
    train, _, _ = load_cifar100_archive(path, expected_counts=None)
    assert len(train["labels"]) == 3


# --- DeviceAugment --------------------------------------------------------------

MEAN = (0.5, 0.4, 0.3)
STD = (0.25, 0.2, 0.3)


def _images(n: int = 8, size: int = 12, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 3, size, size), generator=gen, dtype=torch.uint8)


def _unit(images: torch.Tensor) -> torch.Tensor:
    return images.float() / 255


def test_normalise() -> None:
    images = _images()
    out = DeviceAugment(0, False, 0.0, MEAN, STD).normalise(images)
    expected = (_unit(images) - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)
    torch.testing.assert_close(out, expected)
    assert out.dtype == torch.float32


def test_no_augmentation_equals_normalisation() -> None:
    images = _images()
    augment = DeviceAugment(0, False, 0.0, MEAN, STD)
    out = augment(images, torch.Generator().manual_seed(0))
    assert torch.equal(out, augment.normalise(images))
    # The affine path with identity matrices agrees as well.
    theta = augment.sample_affine(len(images), 12, 12, torch.Generator())
    torch.testing.assert_close(augment.apply_affine(_unit(images), theta), _unit(images), atol=1e-5, rtol=0)


def _shift(image: torch.Tensor, dy: int, dx: int) -> torch.Tensor:
    """out[y, x] = image[y + dy, x + dx], zero outside."""
    _, h, w = image.shape
    out = torch.zeros_like(image)
    ys, xs = slice(max(0, -dy), min(h, h - dy)), slice(max(0, -dx), min(w, w - dx))
    yi, xi = slice(max(0, dy), min(h, h + dy)), slice(max(0, dx), min(w, w + dx))
    out[:, ys, xs] = image[:, yi, xi]
    return out


def test_pad_only_is_an_integer_shift() -> None:
    images = _images(n=16)
    pad = 3
    augment = DeviceAugment(pad, False, 0.0, (0.0,) * 3, (1.0,) * 3)
    out = augment(images, torch.Generator().manual_seed(5))
    shifts_seen = set()
    for i in range(len(images)):
        matches = [
            (dy, dx)
            for dy in range(-pad, pad + 1)
            for dx in range(-pad, pad + 1)
            if torch.allclose(out[i], _shift(_unit(images[i]), dy, dx), atol=1e-4)
        ]
        assert len(matches) == 1, f"sample {i} is not an integer shift"
        shifts_seen.add(matches[0])
    assert len(shifts_seen) > 1


def test_pad_shift_matches_generator_draws() -> None:
    # One sample checked against the shift read from the sampled matrix.
    images = _images(n=4, size=10)
    augment = DeviceAugment(4, False, 0.0, (0.0,) * 3, (1.0,) * 3)
    theta = augment.sample_affine(4, 10, 10, torch.Generator().manual_seed(11))
    out = augment(images, torch.Generator().manual_seed(11))
    dx, dy = (theta[1, :, 2] * 10 / 2).round().int().tolist()
    torch.testing.assert_close(out[1], _shift(_unit(images[1]), dy, dx), atol=1e-4, rtol=0)


def test_flip_only_mirrors() -> None:
    images = _images(n=32)
    augment = DeviceAugment(0, True, 0.0, (0.0,) * 3, (1.0,) * 3)
    out = augment(images, torch.Generator().manual_seed(3))
    n_flipped = 0
    for i in range(len(images)):
        plain, mirrored = _unit(images[i]), torch.flip(_unit(images[i]), dims=[-1])
        is_plain = torch.allclose(out[i], plain, atol=1e-4)
        is_mirrored = torch.allclose(out[i], mirrored, atol=1e-4)
        assert is_plain != is_mirrored
        n_flipped += is_mirrored
    assert 0 < n_flipped < len(images)


def test_rotation_keeps_centre_and_blackens_corners() -> None:
    images = torch.full((64, 3, 15, 15), 200, dtype=torch.uint8)
    augment = DeviceAugment(0, False, 30.0, (0.0,) * 3, (1.0,) * 3)
    out = augment(images, torch.Generator().manual_seed(0))
    torch.testing.assert_close(out[:, :, 7, 7], torch.full((64, 3), 200 / 255))
    # Some rotations are large enough to pull in zeros at the corners.
    assert (out[:, :, 0, 0] < 0.5).any()


def test_same_seed_same_output() -> None:
    images = _images()
    augment = DeviceAugment(4, True, 15.0, MEAN, STD)
    first = augment(images, torch.Generator().manual_seed(42))
    second = augment(images, torch.Generator().manual_seed(42))
    third = augment(images, torch.Generator().manual_seed(43))
    assert torch.equal(first, second)
    assert not torch.equal(first, third)
    assert first.shape == images.shape and first.dtype == torch.float32


@pytest.mark.parametrize(
    "args",
    [(-1, False, 0.0, MEAN, STD), (0, False, 200.0, MEAN, STD), (0, False, 0.0, MEAN, (1.0, 0.0, 1.0)),
     (0, False, 0.0, MEAN, (1.0,))],
)
def test_augment_rejects_bad_arguments(args) -> None:
    with pytest.raises(ValueError):
        DeviceAugment(*args)


def test_augment_rejects_float_images() -> None:
    augment = DeviceAugment(0, False, 0.0, MEAN, STD)
    with pytest.raises(ValueError, match="uint8"):
        augment.normalise(torch.zeros(1, 3, 4, 4))


def _matrix_product_theta(augment: DeviceAugment, n: int, height: int, width: int,
                          generator: torch.Generator) -> torch.Tensor:
    """The affine matrices built as explicit 3x3 products (the earlier formulation):
    to_normalised @ shift @ mirror @ rotation @ to_pixels, draws in the same order."""
    matrix = torch.eye(3).repeat(n, 1, 1)
    if augment.max_rotation_deg > 0:
        angles = (torch.rand(n, generator=generator) * 2 - 1) * math.radians(augment.max_rotation_deg)
        matrix[:, 0, 0], matrix[:, 0, 1] = torch.cos(angles), -torch.sin(angles)
        matrix[:, 1, 0], matrix[:, 1, 1] = torch.sin(angles), torch.cos(angles)
    if augment.hflip:
        mirror = torch.eye(3).repeat(n, 1, 1)
        mirror[:, 0, 0] = torch.where(torch.rand(n, generator=generator) < 0.5, -1.0, 1.0)
        matrix = mirror @ matrix
    if augment.pad > 0:
        shift = torch.eye(3).repeat(n, 1, 1)
        shift[:, :2, 2] = torch.randint(-augment.pad, augment.pad + 1, (n, 2), generator=generator).float()
        matrix = shift @ matrix
    to_pixels = torch.diag(torch.tensor([width / 2.0, height / 2.0, 1.0]))
    to_normalised = torch.diag(torch.tensor([2.0 / width, 2.0 / height, 1.0]))
    return (to_normalised @ matrix @ to_pixels)[:, :2, :]


@pytest.mark.parametrize("pad,hflip,rotation", [(0, True, 0.0), (4, False, 0.0), (0, False, 15.0), (4, True, 15.0),
                                                (2, True, 180.0)])
@pytest.mark.parametrize("height,width", [(32, 32), (12, 20)])
def test_entrywise_matrices_equal_the_matrix_products_bit_for_bit(pad, hflip, rotation, height, width) -> None:
    augment = DeviceAugment(pad, hflip, rotation, MEAN, STD)
    gen = torch.Generator().manual_seed(1)
    images = torch.randint(0, 256, (64, 3, height, width), dtype=torch.uint8, generator=gen)
    for seed in range(3):  # the first call fills the constant cache, the later ones use it
        theta = augment.sample_affine(64, height, width, torch.Generator().manual_seed(seed))
        expected = _matrix_product_theta(augment, 64, height, width, torch.Generator().manual_seed(seed))
        assert torch.equal(theta, expected)
        unit = augment.apply_affine(images.float() / 255.0, expected)
        reference = (unit - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)
        assert torch.equal(augment(images, torch.Generator().manual_seed(seed)), reference)


@pytest.mark.parametrize("pad,hflip,rotation", [(0, True, 0.0), (4, False, 0.0), (0, False, 15.0), (4, True, 15.0)])
def test_draws_then_arithmetic_give_the_augmented_images(pad, hflip, rotation) -> None:
    """draw() takes the augmentation's random numbers in the order rotation, flip, shift
    (checked against the draws written out), and from_draws() turns them, without a
    generator, into the images of the 3x3 matrix-product formulation: the split a compiled
    graph needs (bench/gpu.py's graphs_full), and __call__ is the two together."""
    augment = DeviceAugment(pad, hflip, rotation, MEAN, STD)
    n = 16
    images = torch.randint(0, 256, (n, 3, 12, 12), dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
    draws = augment.draw(n, torch.Generator().manual_seed(9))
    written_out, expected_draws = torch.Generator().manual_seed(9), {}
    if rotation:
        expected_draws["rotation"] = torch.rand(n, generator=written_out)
    if hflip:
        expected_draws["flip"] = torch.rand(n, generator=written_out)
    if pad:
        expected_draws["shift"] = torch.randint(-pad, pad + 1, (n, 2), generator=written_out)
    assert draws.keys() == expected_draws.keys()
    assert all(torch.equal(draws[key], expected_draws[key]) for key in draws)
    theta = _matrix_product_theta(augment, n, 12, 12, torch.Generator().manual_seed(9))
    unit = augment.apply_affine(images.float() / 255.0, theta)
    reference = (unit - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)
    global_state = torch.get_rng_state()
    assert torch.equal(augment.from_draws(images, draws), reference)
    assert torch.equal(torch.get_rng_state(), global_state)  # no draw of its own
    called = torch.Generator().manual_seed(9)
    assert torch.equal(augment(images, called), reference)
    assert torch.equal(called.get_state(), written_out.get_state())  # __call__ draws exactly these


def test_bad_images_are_refused_before_any_draw() -> None:
    augment = DeviceAugment(4, True, 15.0, MEAN, STD)
    gen = torch.Generator().manual_seed(1)
    state = gen.get_state()
    for bad in (torch.zeros(2, 3, 8, 8), torch.zeros(3, 8, 8, dtype=torch.uint8),
                torch.zeros(2, 1, 8, 8, dtype=torch.uint8)):
        with pytest.raises(ValueError, match="expected uint8|channels"):
            augment(bad, gen)
    assert torch.equal(gen.get_state(), state)
    identity = DeviceAugment(0, False, 0.0, MEAN, STD)  # no augmentation: no generator needed
    images = torch.zeros(2, 3, 8, 8, dtype=torch.uint8)
    assert torch.equal(identity(images, None), identity.normalise(images))


def test_augment_builds_no_constant_tensors_per_batch() -> None:
    """After the first batch, a batch creates no tensor from host data (on a GPU each such
    torch.tensor(list, device=...) is a blocking copy)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.names: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(str(func))
            return func(*args, **(kwargs or {}))

    augment = DeviceAugment(4, True, 15.0, MEAN, STD)
    images = _images()
    augment(images, torch.Generator().manual_seed(0))
    augment.normalise(images)
    with Ops() as ops:
        augment(images, torch.Generator().manual_seed(1))
        augment.normalise(images)
    assert ops.names and not [name for name in ops.names if "lift_fresh" in name]


# --- recovery: a damaged data file, an offline paper profile ----------------------


def _digits_params() -> dict:
    return {"dataset": "digits", "seed": 0, "image_size": 16, "test_fraction": 0.2}


def test_a_damaged_array_file_is_recreated_byte_for_byte_with_its_old_mtime(tmp_path: Path) -> None:
    from darel.data import build_dataset, repair_dataset

    train, test, meta = build_dataset(_digits_params(), tmp_path / "raw")
    write_dataset(tmp_path, train, test, meta)
    assert repair_dataset(tmp_path, _digits_params(), tmp_path / "raw") == []  # nothing damaged, nothing done
    good = (tmp_path / "train.npz").read_bytes()
    stamp = (tmp_path / "meta.json").stat().st_mtime
    with open(tmp_path / "train.npz", "r+b") as handle:
        handle.truncate(2000)
    assert repair_dataset(tmp_path, _digits_params(), tmp_path / "raw") == ["train.npz"]
    assert (tmp_path / "train.npz").read_bytes() == good
    assert (tmp_path / "train.npz").stat().st_mtime == stamp  # a workflow sees nothing new
    read_dataset(tmp_path)  # the checksums hold again


@pytest.mark.parametrize("damage", ["deleted", "empty", "edited"])
def test_a_damaged_or_missing_meta_json_is_recreated_identical(tmp_path: Path, damage: str) -> None:
    """meta.json is one of the data stage's outputs like the arrays: deleted, emptied or
    edited, it is re-created with the same bytes and an old mtime (a dry run writes nothing)."""
    import os

    from darel.data import build_dataset, damaged_files, repair_dataset

    train, test, meta = build_dataset(_digits_params(), tmp_path / "raw")
    write_dataset(tmp_path, train, test, meta)
    good = (tmp_path / "meta.json").read_bytes()
    os.utime(tmp_path / "train.npz", (1_000_000, 1_000_000))
    os.utime(tmp_path / "test.npz", (1_000_000, 1_000_000))
    if damage == "deleted":
        (tmp_path / "meta.json").unlink()
    elif damage == "empty":
        (tmp_path / "meta.json").write_bytes(b"")
    else:
        (tmp_path / "meta.json").write_text(good.decode().replace('"n_test": 360', '"n_test": 361'))
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    assert damaged_files(tmp_path)[0] == "meta.json"
    assert repair_dataset(tmp_path, _digits_params(), tmp_path / "raw", dry_run=True) == ["meta.json"]
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before  # the dry run wrote nothing
    assert repair_dataset(tmp_path, _digits_params(), tmp_path / "raw") == ["meta.json"]
    assert (tmp_path / "meta.json").read_bytes() == good
    assert (tmp_path / "meta.json").stat().st_mtime == 1_000_000
    assert damaged_files(tmp_path) == [] and read_dataset(tmp_path)[2]["n_test"] == 360


def test_a_data_set_that_cannot_be_recreated_names_the_command_that_rebuilds_it(tmp_path: Path) -> None:
    from darel.data import DataUnavailable, build_dataset, repair_dataset

    train, test, meta = build_dataset(_digits_params(), tmp_path / "raw")
    write_dataset(tmp_path, train, test, meta)
    (tmp_path / "test.npz").write_bytes(b"garbage")
    other = {**_digits_params(), "seed": 1}  # settings that no longer give the recorded bytes
    with pytest.raises(DataUnavailable, match=r"test\.npz.*snakemake --forcerun download"):
        repair_dataset(tmp_path, other, tmp_path / "raw")
    assert (tmp_path / "test.npz").read_bytes() == b"garbage"  # not replaced by different data


def test_offline_cifar100_names_url_file_md5_and_the_folder(tmp_path: Path, monkeypatch) -> None:
    import urllib.error

    from darel import data

    def offline(*args, **kwargs):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    # The real download path: a network failure is not an error writing the file.
    monkeypatch.setattr(data.urllib.request, "urlopen", offline)
    with pytest.raises(data.DataUnavailable) as err:
        data.fetch_cifar100(tmp_path / "raw", progress=False)
    message = str(err.value)
    assert message.startswith("could not download CIFAR-100") and "cannot write" not in message
    assert "\n" not in message and "name resolution" in message
    for part in (CIFAR100_URL, "cifar-100-python.tar.gz", CIFAR100_MD5, str((tmp_path / "raw").resolve())):
        assert part in message, part
    assert not list((tmp_path / "raw").glob("*"))  # no partial or temporary file left


def test_a_cached_download_of_the_wrong_size_is_not_read_but_fetched_again(tmp_path: Path, monkeypatch) -> None:
    from darel import data

    source, md5 = _source(tmp_path)
    dest = tmp_path / "file.bin"
    dest.write_bytes(b"\0" * 100)
    monkeypatch.setattr(data, "file_md5", lambda *a, **k: pytest.fail("a file of the wrong size is not read"))
    download_file(source.as_uri(), dest, md5, progress=False, size=source.stat().st_size)
    assert dest.read_bytes() == source.read_bytes()
    assert data.CIFAR100_SIZE == 169001437  # the published archive's size, checked before its MD5
