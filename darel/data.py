"""Image datasets in one on-disk format.

On disk a dataset is a folder holding ``train.npz`` and ``test.npz`` (``images``:
uint8 (N, H, W, C), ``labels``: int64 (N,)) and ``meta.json``. ``meta.json`` is
written last and records the sha256 of both array files, so its presence marks a
complete dataset and reading verifies that the arrays are the ones it describes.

Two sources produce that format:

* ``make_digits``: scikit-learn's bundled handwritten digits (real, tiny, needs no
  download), for quick profiles and tests;
* ``load_cifar100_archive``: the official CIFAR-100 python archive, fetched once
  with ``download_file`` (checked against its published size and MD5), read with every
  member and the whole inflated stream bounded;
* ``make_synth_dataset``: the generated benchmark of ``darel.synth`` (class-structured
  images with known per-sample categories; docs/data_card_synth.md). Its training split
  carries the per-sample columns ``category``, ``rare``, ``true_labels`` and
  ``duplicate_of`` beside ``images`` and ``labels``.

The arrays reach the device, and are augmented there, in darel.augment. Nothing here
imports torch at import time (the workflow's preflight reads and repairs data sets at
every Snakemake start).
"""

from __future__ import annotations

import hashlib
import http.client
import io
import math
import os
import pickle
import sys
import tarfile
import urllib.request
from pathlib import Path

import numpy as np

from darel import io as dio
from darel import grammar, provenance, synth
from darel.io import InputRefused, atomic_path, file_sha256, npz_bytes, write_bytes, write_npz

SPLITS = ("train", "test")
META_FILE = "meta.json"
# Per-sample columns a split may carry beside images and labels (the generated benchmark's).
SAMPLE_COLUMNS = synth.COLUMNS

CIFAR100_URL = "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"
CIFAR100_MD5 = "eb9058c3a382ffc7106e4002c42a8d85"
CIFAR100_SIZE = 169001437  # bytes of the published archive
CIFAR100_ARCHIVE_NAME = "cifar-100-python.tar.gz"
CIFAR100_COUNTS = (50000, 10000)
CIFAR100_NUM_CLASSES = 100
# The normalisation constants of the paper's protocol (docs/protocol.md).
CIFAR100_MEAN = (0.5071, 0.4865, 0.4409)
CIFAR100_STD = (0.2673, 0.2564, 0.2762)

_CHUNK_BYTES = 1 << 20


class IntegrityError(ValueError):
    """A file's size or checksum differs from the expected one."""


class DownloadError(RuntimeError):
    """A download failed on the network side (not an OSError: it is not about writing)."""


# ---------------------------------------------------------------------------
# Array checks and statistics


def validate_split(arrays: dict, split: str, num_classes: int | None = None) -> None:
    """Raise ValueError unless ``arrays`` is a well-formed split of the on-disk format."""
    if not isinstance(arrays, dict) or not {"images", "labels"} <= set(arrays) <= {"images", "labels", *SAMPLE_COLUMNS}:
        keys = sorted(arrays) if isinstance(arrays, dict) else type(arrays).__name__
        raise ValueError(f"{split}: expected the keys ['images', 'labels'] (and optionally {sorted(SAMPLE_COLUMNS)}), "
                         f"got {keys}")
    images, labels = arrays["images"], arrays["labels"]
    if not isinstance(images, np.ndarray) or images.dtype != np.uint8 or images.ndim != 4:
        desc = f"{images.dtype} {images.shape}" if isinstance(images, np.ndarray) else type(images).__name__
        raise ValueError(f"{split}: images must be a uint8 array (N, H, W, C), got {desc}")
    if not isinstance(labels, np.ndarray) or labels.dtype != np.int64 or labels.ndim != 1:
        desc = f"{labels.dtype} {labels.shape}" if isinstance(labels, np.ndarray) else type(labels).__name__
        raise ValueError(f"{split}: labels must be an int64 array (N,), got {desc}")
    if len(images) != len(labels):
        raise ValueError(f"{split}: {len(images)} images but {len(labels)} labels")
    if len(labels) and labels.min() < 0:
        raise ValueError(f"{split}: negative label {int(labels.min())}")
    if num_classes is not None and len(labels) and labels.max() >= num_classes:
        raise ValueError(f"{split}: label {int(labels.max())} out of range for num_classes={num_classes}")
    for name, dtype in SAMPLE_COLUMNS.items():
        column = arrays.get(name)
        if column is None:
            continue
        if not isinstance(column, np.ndarray) or column.dtype != dtype or column.shape != labels.shape:
            desc = f"{column.dtype} {column.shape}" if isinstance(column, np.ndarray) else type(column).__name__
            raise ValueError(f"{split}: {name} must be a {np.dtype(dtype).name} array of shape {labels.shape}, got {desc}")


def channel_mean_std(images: np.ndarray) -> tuple[list[float], list[float]]:
    """Per-channel mean and (population) std of uint8 NHWC images scaled to [0, 1].

    Uses a 256-bin histogram per channel: exact, and no float copy of the whole set.
    """
    if images.dtype != np.uint8 or images.ndim != 4:
        raise ValueError(f"expected uint8 (N, H, W, C) images, got {images.dtype} {images.shape}")
    levels = np.arange(256, dtype=np.float64) / 255.0
    means, stds = [], []
    for channel in range(images.shape[3]):
        counts = np.bincount(images[..., channel].ravel(), minlength=256).astype(np.float64)
        total = counts.sum()
        mean = float((counts * levels).sum() / total)
        var = float((counts * (levels - mean) ** 2).sum() / total)
        means.append(mean)
        stds.append(math.sqrt(var))
    return means, stds


# ---------------------------------------------------------------------------
# scikit-learn digits (quick profile)


def make_digits(image_size: int = 16, test_fraction: float = 0.2, seed: int = 0) -> tuple[dict, dict, dict]:
    """scikit-learn's 1797 real 8x8 digits, resized, split stratified by class.

    Returns (train arrays, test arrays, meta); the sha256 entries of meta are added
    by ``write_dataset``.
    """
    import torch
    import torch.nn.functional as F
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    if not isinstance(image_size, int) or isinstance(image_size, bool) or image_size < 1:
        raise ValueError(f"image_size must be a positive integer, got {image_size!r}")
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must lie in (0, 1), got {test_fraction!r}")

    bunch = load_digits()
    # Values are 0..16; scale to the 0..255 range every other dataset uses.
    pixels = torch.from_numpy(bunch.images.astype(np.float32) * (255.0 / 16.0)).unsqueeze(1)
    if image_size != pixels.shape[-1]:
        pixels = F.interpolate(pixels, size=(image_size, image_size), mode="bilinear", align_corners=False)
    images = pixels.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).contiguous().numpy()
    labels = bunch.target.astype(np.int64)

    train_idx, test_idx = train_test_split(
        np.arange(len(labels)), test_size=test_fraction, random_state=seed, stratify=labels
    )
    # Sorted indices keep the split independent of the splitter's internal shuffling order.
    train_idx, test_idx = np.sort(train_idx), np.sort(test_idx)
    train = {"images": images[train_idx], "labels": labels[train_idx]}
    test = {"images": images[test_idx], "labels": labels[test_idx]}
    mean, std = channel_mean_std(train["images"])
    meta = {
        "name": "digits",
        "description": (
            "scikit-learn load_digits (1797 real 8x8 handwritten digits, values 0..16), "
            f"scaled to 0..255 and resized bilinearly to {image_size}x{image_size}; "
            f"stratified split, test fraction {test_fraction}, seed {seed}"
        ),
        "label": f"QUICK PROFILE: scikit-learn handwritten digits (real, tiny), resized to {image_size}x{image_size}",
        "num_classes": 10,
        "image_size": image_size,
        "channels": 1,
        "mean": mean,
        "std": std,
        "n_train": int(len(train_idx)),
        "n_test": int(len(test_idx)),
        "seed": seed,
        "test_fraction": test_fraction,
    }
    return train, test, meta


# ---------------------------------------------------------------------------
# The generated benchmark (darel.synth)

SYNTH_SHARES = ("label_noise", "near_duplicate", "hard", "rare_classes", "rare_size")
SYNTH_SIZE_KEYS = ("num_classes", "n_train", "n_test", "image_size", "classes_per_group")
SYNTH_SHAPE_KEYS = ("own_atoms", "colour_spread", "frequency", "envelope", "nuisance")


def synth_label(params: dict) -> str:
    """The label every output of the benchmark carries: generated, its size and shares."""
    return (f"{grammar.GENERATED_DATA}: synth benchmark, {params['size']} size ({params['num_classes']} classes, "
            f"{params['n_train']} train / {params['n_test']} test, {params['image_size']}x{params['image_size']}x3; "
            f"{params['label_noise']:.0%} label noise, {params['near_duplicate']:.0%} near-duplicates, "
            f"{params['hard']:.0%} hard; not a real data set)")


def make_synth_dataset(params: dict, workers: int = 1) -> tuple[dict, dict, dict]:
    """(train, test, meta) of the generated benchmark from its parameter slice
    (config.dataset_params: the shares, the chosen size's entries, the seed)."""
    train, test, facts = synth.make_synth(
        **{key: params[key] for key in SYNTH_SHARES + SYNTH_SIZE_KEYS + SYNTH_SHAPE_KEYS}, seed=params["seed"],
        workers=workers)
    mean, std = channel_mean_std(train["images"])
    meta = {
        "name": "synth",
        "description": ("generated by darel.synth (docs/data_card_synth.md): per-class prototypes of smooth "
                        "gratings, blobs and colour fields seen through random shifts, scales, rotations, "
                        "contrast, clutter and noise; known per-sample categories in train.npz"),
        "label": synth_label(params),
        "generated": True,
        "size": params["size"],
        "num_classes": params["num_classes"],
        "image_size": params["image_size"],
        "channels": 3,
        "mean": mean,
        "std": std,
        "n_train": int(len(train["labels"])),
        "n_test": int(len(test["labels"])),
        "seed": params["seed"],
        "shares": {key: params[key] for key in SYNTH_SHARES},
        **facts,
    }
    return train, test, meta


# ---------------------------------------------------------------------------
# Downloads and CIFAR-100


def file_md5(path: str | os.PathLike, limit: int = dio.ARCHIVE_LIMIT, kind: str = "downloaded archive") -> str:
    """MD5 of a plain file of at most ``limit`` bytes (darel.io.open_regular: a FIFO or a
    device is refused, never read)."""
    digest = hashlib.md5()
    with dio.open_regular(path, limit, kind) as handle:
        for chunk in iter(lambda: handle.read(_CHUNK_BYTES), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _cached_download_ok(dest: Path, md5: str, size: int | None, limit: int) -> bool:
    """Whether ``dest`` already holds the download: a plain file of the published size
    (when known, else at most ``limit``) with that MD5. Something other than a plain
    file there (a FIFO, a device, a folder) is refused in one line (InputRefused), never
    read and never replaced."""
    try:
        info = os.stat(dest)
    except FileNotFoundError:
        return False
    other = dio.non_plain_kind(info.st_mode)
    if other is not None:
        raise InputRefused(dest, f"is {other}, not a plain file (a download is only kept in a plain file)")
    if (info.st_size != size) if size is not None else (info.st_size > limit):
        return False  # the wrong size: not read, downloaded again
    return file_md5(dest, limit) == md5


def download_file(url: str, dest: str | os.PathLike, md5: str, progress: bool = True, size: int | None = None,
                  limit: int = dio.ARCHIVE_LIMIT) -> Path:
    """Fetch ``url`` to ``dest`` unless ``dest`` already holds a file with that MD5 (and
    ``size``, the published size in bytes, when known: a file of another size is not
    read). A FIFO, a device or a folder at ``dest`` is refused (InputRefused), never read.

    The data streams into a temporary file beside ``dest``, stopped once it exceeds
    ``size`` (else ``limit``); only after its size (against Content-Length, when the
    server sends one, and ``size``) and its MD5 check out is it renamed into place, so
    ``dest`` never holds a partial or corrupt download.
    """
    dest = Path(dest)
    md5 = md5.lower()
    cap = size if size is not None else limit
    if _cached_download_ok(dest, md5, size, limit):
        return dest
    if os.path.lexists(dest) and progress:
        print(f"{dest} has the wrong size or MD5; downloading it again", file=sys.stderr)

    with atomic_path(dest) as tmp:
        digest = hashlib.md5()
        received = 0
        try:
            response = urllib.request.urlopen(url, timeout=60)
        except (OSError, http.client.HTTPException) as err:  # URLError, timeouts, refused connections
            raise DownloadError(f"{type(err).__name__}: {getattr(err, 'reason', err)}") from None
        with response, open(tmp, "wb") as out:
            length_header = response.headers.get("Content-Length")
            expected_size = int(length_header) if length_header else None
            next_report = 0.0
            while True:
                try:
                    chunk = response.read(_CHUNK_BYTES)
                except (OSError, http.client.HTTPException) as err:
                    raise DownloadError(f"connection lost after {received} bytes ({type(err).__name__}: {err})") \
                        from None
                if not chunk:
                    break
                received += len(chunk)
                if received > cap:
                    raise IntegrityError(f"download of {url} exceeds {cap} bytes ("
                                         f"{'its published size' if size is not None else 'the limit'}); stopped")
                out.write(chunk)
                digest.update(chunk)
                if progress and expected_size and received / expected_size >= next_report:
                    print(f"\r{dest.name}: {100 * received / expected_size:5.1f} %", end="", file=sys.stderr)
                    next_report += 0.05
        if progress:
            print(f"\r{dest.name}: {received} bytes", file=sys.stderr)
        if expected_size is not None and received != expected_size:
            raise IntegrityError(
                f"download of {url} truncated: received {received} bytes, Content-Length {expected_size}"
            )
        if size is not None and received != size:
            raise IntegrityError(f"download of {url} has {received} bytes, not its published {size}")
        actual = digest.hexdigest()
        if actual != md5:
            raise IntegrityError(f"MD5 mismatch for {url}: expected {md5}, got {actual}")
    return dest


class _Inflated:
    """A binary stream that refuses (InputRefused) to deliver more than ``limit`` bytes:
    what a compressed archive inflates to is bounded while it is read, not after."""

    def __init__(self, stream, limit: int, path: Path) -> None:
        self.stream, self.limit, self.path, self.seen = stream, limit, path, 0

    def read(self, size: int = -1) -> bytes:
        data = self.stream.read(self.limit + 1 - self.seen if size is None or size < 0 else size)
        self.seen += len(data)
        if self.seen > self.limit:
            raise InputRefused(self.path, f"inflates to more than {dio.human_size(self.limit)} (CIFAR-100's archive "
                                          "inflates to about 180 MB)")
        return data


def _decompressed(handle):
    """``handle`` (an open archive) decompressed by its magic bytes: gzip, bzip2, xz or none."""
    import bz2
    import gzip
    import lzma

    magic = handle.read(6)
    handle.seek(0)
    if magic.startswith(b"\x1f\x8b"):
        return gzip.GzipFile(fileobj=handle, mode="rb")
    if magic.startswith(b"BZh"):
        return bz2.BZ2File(handle, mode="rb")
    if magic.startswith(b"\xfd7zXZ\x00"):
        return lzma.LZMAFile(handle, mode="rb")
    return handle


def _archive_batches(tar_path: str | os.PathLike, names: tuple[str, ...]) -> dict[str, bytes]:
    """The bytes of the files ``names`` (by base name) of a tar archive, read as a stream
    with every member bounded (dio.CIFAR_MEMBER_LIMIT) and the whole inflated archive too
    (dio.CIFAR_INFLATED_LIMIT): an archive that inflates without end stops in one line."""
    import lzma
    import zlib

    path = Path(tar_path)
    found: dict[str, bytes] = {}
    with dio.open_regular(path, dio.ARCHIVE_LIMIT, "CIFAR-100 archive") as handle:
        stream = _Inflated(_decompressed(handle), dio.CIFAR_INFLATED_LIMIT, path)
        try:
            with tarfile.open(fileobj=stream, mode="r|") as archive:
                for member in archive:
                    name = Path(member.name).name
                    if not member.isfile() or name not in names or name in found:
                        continue
                    if member.size > dio.CIFAR_MEMBER_LIMIT:
                        raise InputRefused(path, f"member {member.name!r} is {dio.human_size(member.size)}, more "
                                                 f"than a CIFAR-100 batch may be "
                                                 f"({dio.human_size(dio.CIFAR_MEMBER_LIMIT)})")
                    extracted = archive.extractfile(member)
                    assert extracted is not None  # regular files always have a stream
                    found[name] = extracted.read()
                    if len(found) == len(names):
                        break
        except (tarfile.TarError, EOFError, OSError, zlib.error, lzma.LZMAError) as err:
            raise ValueError(f"{path}: not a readable tar archive ({type(err).__name__}: {str(err)[:120]})") from None
    missing = [name for name in names if name not in found]
    if missing:
        raise ValueError(f"{path}: no file named {missing[0]!r} in the archive")
    return found


# What a CIFAR batch pickle may build: numpy arrays and their dtypes (and the bytes helper
# protocol-2 pickles written by Python 3 use). Nothing else is ever constructed.
_CIFAR_PICKLE_GLOBALS = {
    ("numpy", "ndarray"), ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),
    ("_codecs", "encode"),
}


class _ArraysOnlyUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) not in _CIFAR_PICKLE_GLOBALS:
            raise pickle.UnpicklingError(f"refused to build {module}.{name}: a CIFAR batch holds only arrays, "
                                         "lists, numbers and bytes")
        return super().find_class(module, name)


def _decode_cifar_batch(raw: bytes, split: str) -> dict:
    # The batches are Python pickles (the archive's format). The archive's MD5 is checked
    # before this point, and the unpickler builds nothing but arrays: a swapped archive
    # cannot run code.
    try:
        batch = _ArraysOnlyUnpickler(io.BytesIO(raw), encoding="bytes").load()
    except pickle.UnpicklingError as err:
        raise ValueError(f"CIFAR-100 {split}: {err}") from None
    data = np.asarray(batch[b"data"], dtype=np.uint8)
    labels = np.asarray(batch[b"fine_labels"], dtype=np.int64)
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise ValueError(f"CIFAR-100 {split}: expected data of shape (N, 3072), got {data.shape}")
    # Rows are channel-major (all red, then green, then blue, each 32x32 row-major).
    images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1).copy()
    return {"images": images, "labels": labels}


def load_cifar100_archive(
    tar_path: str | os.PathLike, expected_counts: tuple[int, int] | None = CIFAR100_COUNTS
) -> tuple[dict, dict, dict]:
    """Read the ``train`` and ``test`` batches of the CIFAR-100 python archive.

    ``expected_counts`` = (n_train, n_test) to validate; None skips the check.
    """
    batches = _archive_batches(tar_path, SPLITS)
    splits = {split: _decode_cifar_batch(batches.pop(split), split) for split in SPLITS}
    if expected_counts is not None:
        actual = tuple(len(splits[s]["labels"]) for s in SPLITS)
        if actual != tuple(expected_counts):
            raise ValueError(f"CIFAR-100 (train, test) counts {actual}, expected {tuple(expected_counts)}")
    for split in SPLITS:
        validate_split(splits[split], split, CIFAR100_NUM_CLASSES)

    train, test = splits["train"], splits["test"]
    measured_mean, measured_std = channel_mean_std(train["images"])
    meta = {
        "name": "cifar100",
        "description": "CIFAR-100 (official python archive), fine labels, 32x32 RGB",
        "label": "real CIFAR-100",
        "source": CIFAR100_URL,
        "source_md5": CIFAR100_MD5,
        "num_classes": CIFAR100_NUM_CLASSES,
        "image_size": 32,
        "channels": 3,
        # The protocol's published constants; the measured values are kept beside them.
        "mean": list(CIFAR100_MEAN),
        "std": list(CIFAR100_STD),
        "measured_mean": measured_mean,
        "measured_std": measured_std,
        "n_train": int(len(train["labels"])),
        "n_test": int(len(test["labels"])),
    }
    return train, test, meta


# ---------------------------------------------------------------------------
# On-disk format


def _ordered(arrays: dict) -> dict:
    """A split's arrays in the one order they are written (the bytes depend on it)."""
    return {name: arrays[name] for name in ("images", "labels", *SAMPLE_COLUMNS) if name in arrays}


def _meta_record(meta: dict, checksums: dict[str, str], n_train: int, n_test: int) -> dict:
    return {**meta, "n_train": int(n_train), "n_test": int(n_test), "sha256": checksums}


def write_dataset(folder: str | os.PathLike, train: dict, test: dict, meta: dict) -> dict:
    """Write both splits and ``meta.json`` (last: sealed, with the arrays' checksums);
    return the meta written."""
    folder = Path(folder)
    num_classes = meta.get("num_classes")
    if not isinstance(num_classes, int) or num_classes < 1:
        raise ValueError(f"meta['num_classes'] must be a positive integer, got {num_classes!r}")
    arrays = {"train": train, "test": test}
    for split in SPLITS:
        validate_split(arrays[split], split, num_classes)
    shapes = {arrays[s]["images"].shape[1:] for s in SPLITS}
    if len(shapes) != 1:
        raise ValueError(f"train and test images differ in (H, W, C): {sorted(shapes)}")

    # A stale meta.json must not vouch for new array files while they are replaced.
    (folder / META_FILE).unlink(missing_ok=True)
    checksums = {}
    for split in SPLITS:
        path = folder / f"{split}.npz"
        write_npz(path, **_ordered(arrays[split]))
        checksums[path.name] = file_sha256(path)
    return provenance.write_record(folder / META_FILE,
                                   _meta_record(meta, checksums, len(train["labels"]), len(test["labels"])))


class DataUnavailable(RuntimeError):
    """The data cannot be produced here (no network, no local copy); the message says how."""


def fetch_cifar100(raw: str | os.PathLike, progress: bool = True) -> Path:
    """The CIFAR-100 archive in ``raw`` (downloaded once, MD5-checked); without network, an
    error naming the URL, the file name, its MD5 and where to put a copy."""
    archive = Path(raw) / CIFAR100_ARCHIVE_NAME
    try:
        return download_file(CIFAR100_URL, archive, CIFAR100_MD5, progress=progress, size=CIFAR100_SIZE)
    except InputRefused as err:
        raise DataUnavailable(str(err)) from None
    except (DownloadError, IntegrityError) as err:
        raise DataUnavailable(
            f"could not download CIFAR-100 from {CIFAR100_URL} ({err}). Without network, put the file "
            f"{CIFAR100_ARCHIVE_NAME} (MD5 {CIFAR100_MD5}) into {Path(raw).resolve()}/ and run again"
        ) from None


def build_dataset(params: dict, raw: str | os.PathLike, progress: bool = True,
                  workers: int = 1) -> tuple[dict, dict, dict]:
    """(train, test, meta) of a data set's parameter slice (config.dataset_params).
    ``workers``: threads that render a generated data set (the same bytes for any number)."""
    name = params["dataset"]
    if name == "digits":
        return make_digits(image_size=params["image_size"], test_fraction=params["test_fraction"],
                           seed=params["seed"])
    if name == "cifar100":
        return load_cifar100_archive(fetch_cifar100(raw, progress))
    if name == "synth":
        return make_synth_dataset(params, workers)
    raise ValueError(f"unknown dataset {name!r}")


def _array_file_sha256(path: Path) -> str | None:
    """sha256 of a data set's array file; None when it is missing, not a plain file or
    larger than one may be (darel.io.DATASET_NPZ): damaged, and never read."""
    try:
        return file_sha256(path, dio.DATASET_NPZ.file_bytes, dio.DATASET_NPZ.kind)
    except (FileNotFoundError, InputRefused):
        return None


def damaged_files(folder: str | os.PathLike) -> list[str]:
    """The files of a written data set that cannot be trusted: ``meta.json`` when it is
    missing, unreadable or no longer matches its seal, an array file whose sha256 differs
    from meta.json's record (or that is missing, not a plain file or too large: never
    read). An absent or empty folder (a data set not built yet) has none."""
    folder = Path(folder)
    present = [name for name in (META_FILE, *(f"{s}.npz" for s in SPLITS)) if (folder / name).exists()]
    if not present:
        return []
    try:
        recorded = provenance.read_record(folder / META_FILE).get("sha256", {})
    except provenance.ArtifactError:
        return [META_FILE] + [f"{s}.npz" for s in SPLITS]  # nothing vouches for the arrays either
    return [name for name in (f"{s}.npz" for s in SPLITS)
            if recorded.get(name) is None or _array_file_sha256(folder / name) != recorded[name]]


def repair_dataset(folder: str | os.PathLike, params: dict, raw: str | os.PathLike, *,
                   dry_run: bool = False) -> list[str]:
    """Re-create the damaged files of a data set (darel.data.damaged_files) with the same
    bytes the data stage wrote, and give them back an old modification time (meta.json's,
    else the newest intact file's), so a workflow sees nothing new and re-runs nothing.
    An error names the command that rebuilds the data set when the bytes cannot be
    re-created here (other settings, no network). ``dry_run``: check, rebuild in memory,
    write nothing. Returns the names of the files repaired (or to repair)."""
    folder = Path(folder)
    damaged = damaged_files(folder)
    if not damaged:
        return []
    rebuild = (f"the data set in {folder} is damaged ({', '.join(damaged)}) and cannot be re-created byte for byte "
               f"here; rebuild it with `snakemake --forcerun download` (this re-runs everything that depends on it)")
    try:
        train, test, meta = build_dataset(params, raw, progress=False)
    except (DataUnavailable, ValueError) as err:
        raise DataUnavailable(f"{rebuild}: {err}") from None
    contents = {f"{s}.npz": npz_bytes(**_ordered(a)) for s, a in (("train", train), ("test", test))}
    checksums = {name: hashlib.sha256(content).hexdigest() for name, content in contents.items()}
    meta_path = folder / META_FILE
    if META_FILE in damaged:
        # The arrays on disk must be the ones this build gives (else meta.json cannot vouch for them).
        intact = [name for name in checksums if _array_file_sha256(folder / name) == checksums[name]]
        damaged = [META_FILE] + [name for name in checksums if name not in intact]
        recorded = checksums
    else:
        recorded = provenance.read_record(meta_path)["sha256"]
        if any(checksums[name] != recorded.get(name) for name in damaged):
            raise DataUnavailable(rebuild)
    if dry_run:
        return damaged
    survivors = [folder / n for n in (META_FILE, *checksums) if n not in damaged and (folder / n).is_file()]
    stamp = max((p.stat().st_mtime for p in survivors), default=None)
    for name in damaged:
        if name == META_FILE:
            continue
        write_bytes(folder / name, contents[name])
    if META_FILE in damaged:
        provenance.write_record(meta_path, _meta_record(meta, recorded, len(train["labels"]), len(test["labels"])))
    for name in damaged:
        if stamp is not None:
            os.utime(folder / name, (stamp, stamp))
    return damaged


def _expected_arrays(meta: dict, split: str, meta_path: Path) -> dict[str, tuple]:
    """The dtype and shape of each array a split may hold, from its meta.json: checked
    against the array headers before numpy allocates anything (darel.io.check_npz_headers)."""
    sizes = {key: meta.get(key) for key in (f"n_{split}", "image_size", "channels")}
    bad = [key for key, value in sizes.items() if not isinstance(value, int) or isinstance(value, bool) or value < 0]
    if bad:
        raise IntegrityError(f"{meta_path}: field {bad[0]} = {sizes[bad[0]]!r} is not a count (written by an older "
                             "version? snakemake --forcerun download)")
    n, side, channels = sizes.values()
    return {"images": (np.uint8, (n, side, side, channels)), "labels": (np.int64, (n,)),
            **{name: (dtype, (n,)) for name, dtype in SAMPLE_COLUMNS.items()}}


def read_dataset(folder: str | os.PathLike) -> tuple[dict, dict, dict]:
    """Read a dataset folder, checking meta.json's seal and every array file against its
    sha256. Each array file is read once (a plain file within darel.io.DATASET_NPZ), and
    its arrays' headers must ask for the shapes meta.json records before any is loaded."""
    folder = Path(folder)
    meta_path = folder / META_FILE
    if not meta_path.exists():
        raise ValueError(f"{folder} is not a dataset folder: {META_FILE} missing")
    meta = provenance.read_record(meta_path)
    arrays = {}
    for split in SPLITS:
        path = folder / f"{split}.npz"
        expected = meta.get("sha256", {}).get(path.name)
        if expected is None:
            raise ValueError(f"{meta_path} records no sha256 for {path.name}")
        try:
            content = dio.read_regular_bytes(path, dio.DATASET_NPZ.file_bytes, dio.DATASET_NPZ.kind)
        except InputRefused as err:
            raise IntegrityError(str(err)) from None
        actual = hashlib.sha256(content).hexdigest()
        if actual != expected:
            raise IntegrityError(f"{path}: sha256 {actual} does not match {expected} recorded in {meta_path}; the "
                                 "next `snakemake` run re-creates it where it can (else: snakemake --forcerun "
                                 "download)")
        try:
            arrays[split] = dio.load_npz(content, path, dio.DATASET_NPZ, _expected_arrays(meta, split, meta_path))
        except InputRefused as err:
            raise IntegrityError(str(err)) from None
        validate_split(arrays[split], split, meta.get("num_classes"))
    return arrays["train"], arrays["test"], meta
