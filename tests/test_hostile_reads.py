"""Every read of a file in a shared folder is bounded (issue 48, item 6 and the JSON half
of item 7): a FIFO, a device, a sparse file of gigabytes, an .npy header that asks for
terabytes, a zip member that inflates a thousandfold, JSON nested 100,000 deep or holding
a 5,000-digit number each end in one line naming the planted file, within seconds, and
the planted file is left where it was. Unit tests: seconds, no Snakemake."""

from __future__ import annotations

import hashlib
import io as _io
import os
import tarfile
import threading
import zipfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from darel import data, io, preflight, provenance
from darel.nlg import readers, schemas

HANG_GUARD_S = 120  # only catches a hang: every case below answers in well under a second
SPARSE = 8 << 30  # a sparse 8 GiB file: created at once, takes no disk


def _unblock(path: Path) -> None:
    """Give a reader blocked on the FIFO ``path`` its end of file (a failed test must not hang)."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass


def guarded(call, *args, fifo: Path | None = None, **kwargs) -> dict:
    """``call``'s outcome ({"value": ...} or {"error": ...}), run in a thread: a call still
    running after HANG_GUARD_S fails the test instead of hanging it."""
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["value"] = call(*args, **kwargs)
        except BaseException as err:  # noqa: BLE001 - handed to the test
            outcome["error"] = err

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(HANG_GUARD_S)
    if worker.is_alive():
        if fifo is not None:
            _unblock(fifo)
        pytest.fail(f"{getattr(call, '__name__', call)} still reading after {HANG_GUARD_S} s")
    return outcome


def refused(call, *args, fifo: Path | None = None, **kwargs) -> BaseException:
    """The exception ``call`` raises (``guarded``)."""
    outcome = guarded(call, *args, fifo=fifo, **kwargs)
    name = getattr(call, "__name__", call)
    assert "error" in outcome, f"{name} returned {str(outcome.get('value'))[:200]} instead of refusing"
    return outcome["error"]


def one_line(err: BaseException, *names: str) -> str:
    message = str(err)
    assert "\n" not in message and len(message) < 400, message
    for name in names:
        assert name in message, (name, message)
    return message


@pytest.fixture()
def folder(tmp_path, monkeypatch):
    """A project as the working folder, with the runs folder of one cell."""
    monkeypatch.chdir(tmp_path)
    cell = tmp_path / "runs" / "x"
    cell.mkdir(parents=True)
    return cell


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _sparse(path: Path) -> Path:
    with open(path, "wb"):
        pass
    os.truncate(path, SPARSE)
    return path


# ---- a FIFO, a device ------------------------------------------------------------------------------

def test_a_fifo_in_place_of_a_record_is_refused_at_once(folder):
    fifo = _fifo(folder / "train.json")
    err = refused(provenance.read_record, fifo, fifo=fifo)
    assert isinstance(err, provenance.ArtifactError)
    one_line(err, str(fifo), "FIFO")
    for call in (io.read_json, io.file_sha256, provenance.read_npz_checked, schemas.read_split):
        one_line(refused(call, fifo, fifo=fifo), str(fifo), "FIFO")
    assert fifo.is_fifo()  # left where it was


def test_a_fifo_in_place_of_an_official_file_is_refused_at_once(tmp_path):
    csv, xml = _fifo(tmp_path / "trainset.csv"), _fifo(tmp_path / "train.xml")
    one_line(refused(readers.read_e2e_csv, csv, fifo=csv), str(csv), "FIFO")
    one_line(refused(readers.read_webnlg_xml, xml, fifo=xml), str(xml), "FIFO")
    archive = _fifo(tmp_path / readers.E2E_ARCHIVE_NAME)
    one_line(refused(readers.download_e2e, tmp_path, progress=False, fifo=archive), str(archive), "FIFO")
    assert csv.is_fifo() and xml.is_fifo() and archive.is_fifo()


def test_a_device_is_never_read_as_a_record_or_an_archive(tmp_path, monkeypatch):
    # Whoever can write a shared folder cannot make a device, but can link to one.
    link = tmp_path / "eval.json"
    link.symlink_to("/dev/zero")
    for call, target in ((provenance.read_record, link), (io.read_json, Path("/dev/zero")),
                         (io.file_sha256, Path("/dev/zero")), (provenance.read_npz_checked, link)):
        one_line(refused(call, target), str(target), "character device")
    monkeypatch.setattr(data.urllib.request, "urlopen", lambda *a, **k: pytest.fail("no download expected"))
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / data.CIFAR100_ARCHIVE_NAME).symlink_to("/dev/zero")
    err = refused(data.fetch_cifar100, raw, progress=False)
    assert isinstance(err, data.DataUnavailable)
    one_line(err, data.CIFAR100_ARCHIVE_NAME, "character device")
    assert (raw / data.CIFAR100_ARCHIVE_NAME).is_symlink()  # not replaced


def test_the_preflight_names_a_fifo_in_place_of_the_cifar_archive_and_downloads_nothing(tmp_path, monkeypatch,
                                                                                           capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(data.urllib.request, "urlopen", lambda *a, **k: pytest.fail("no download expected"))
    raw = tmp_path / "data" / "raw"
    raw.mkdir(parents=True)
    fifo = _fifo(raw / data.CIFAR100_ARCHIVE_NAME)
    cfg = {"profile": "paper", "seed": 0, "profiles": {"paper": {"dataset": "cifar100"}}, "datasets": {"cifar100": {}}}
    workflow = SimpleNamespace(output_settings=SimpleNamespace(dryrun=False))
    layout = SimpleNamespace(data=str(tmp_path / "data" / "paper"))
    err = refused(preflight.announce_raw_inputs, cfg, layout, workflow, raw=str(raw), fifo=fifo)
    assert isinstance(err, SystemExit)
    one_line(err.code, str(fifo), "FIFO")
    assert "missing input" not in capsys.readouterr().err and fifo.is_fifo()


# ---- gigabytes -------------------------------------------------------------------------------------

def test_a_sparse_file_of_gigabytes_is_refused_by_its_size_before_it_is_read(folder, tmp_path, monkeypatch):
    record = _sparse(folder / "train.json")
    err = refused(provenance.read_record, record)
    one_line(err, str(record), "8.0 GiB", "16.0 MiB")
    array = _sparse(folder / "losses.npz")
    one_line(refused(provenance.read_npz_checked, array), str(array), "8.0 GiB")
    one_line(refused(schemas.read_split, _sparse(folder / "train.jsonl")), "train.jsonl", "8.0 GiB")
    one_line(refused(readers.read_e2e_csv, _sparse(tmp_path / "devset.csv")), "devset.csv", "8.0 GiB")
    webnlg = _sparse(tmp_path / readers.WEBNLG2017_ARCHIVE_NAME)
    one_line(refused(readers.download_webnlg, tmp_path, progress=False), str(webnlg), "8.0 GiB")
    monkeypatch.setattr(data.urllib.request, "urlopen", lambda *a, **k: pytest.fail("no download expected"))
    for planted in (record, array, webnlg):
        assert planted.stat().st_size == SPARSE  # left as it was


def test_a_data_set_array_file_that_is_sparse_or_a_fifo_is_damaged_and_never_read(tmp_path):
    train, test, meta = _tiny_dataset()
    data.write_dataset(tmp_path, train, test, meta)
    _sparse(tmp_path / "train.npz")
    (tmp_path / "test.npz").unlink()
    fifo = _fifo(tmp_path / "test.npz")
    assert guarded(data.damaged_files, tmp_path, fifo=fifo) == {"value": ["train.npz", "test.npz"]}
    err = refused(data.read_dataset, tmp_path, fifo=fifo)
    assert isinstance(err, data.IntegrityError)
    one_line(err, str(tmp_path / "train.npz"), "8.0 GiB", "2.0 GiB")
    (tmp_path / "train.npz").unlink()
    data.write_dataset(tmp_path / "again", train, test, meta)
    (tmp_path / "train.npz").write_bytes((tmp_path / "again" / "train.npz").read_bytes())
    one_line(refused(data.read_dataset, tmp_path, fifo=fifo), str(fifo), "FIFO")
    assert fifo.is_fifo()


def test_a_sparse_cifar_archive_is_not_read(tmp_path, monkeypatch):
    import urllib.error

    def offline(*args, **kwargs):
        raise urllib.error.URLError("offline")

    monkeypatch.setattr(data.urllib.request, "urlopen", offline)
    archive = _sparse(tmp_path / data.CIFAR100_ARCHIVE_NAME)
    # Not the published size: not read (hashing 8 GiB would take a minute), downloaded again.
    err = refused(data.fetch_cifar100, tmp_path, progress=False)
    one_line(err, "could not download CIFAR-100", "offline")
    assert archive.stat().st_size == SPARSE  # the failed download replaced nothing


def test_a_download_longer_than_its_published_size_is_stopped(tmp_path):
    source = tmp_path / "source.bin"
    source.write_bytes(b"x" * 5000)
    md5 = hashlib.md5(source.read_bytes()).hexdigest()
    dest = tmp_path / "cache" / "file.bin"
    with pytest.raises(data.IntegrityError, match="exceeds 4000 bytes"):
        data.download_file(source.as_uri(), dest, md5, progress=False, size=4000)
    assert not dest.exists()
    assert data.download_file(source.as_uri(), dest, md5, progress=False, size=5000) == dest


# ---- array headers ---------------------------------------------------------------------------------

def _npz_with_header(shape: tuple, descr: str = "<f8", payload: bytes = b"\0" * 16, name: str = "loss") -> bytes:
    member = _io.BytesIO()
    np.lib.format.write_array_header_1_0(member, {"descr": descr, "fortran_order": False, "shape": shape})
    member.write(payload)
    out = _io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr(f"{name}.npy", member.getvalue())
    return out.getvalue()


def test_an_npy_header_asking_for_a_trillion_values_is_refused_before_numpy_allocates(folder):
    path = folder / "losses.npz"
    path.write_bytes(_npz_with_header((10 ** 12,)))
    err = refused(provenance.read_npz_checked, path)
    assert isinstance(err, provenance.ArtifactError)
    one_line(err, str(path), "'loss'", "(1000000000000,)")
    # Within the limit but more than the member holds: refused too, nothing allocated.
    path.write_bytes(_npz_with_header((1000,)))
    one_line(refused(provenance.read_npz_checked, path), "asks for float64 (1000,) (8000 bytes)", "holds 16")
    path.write_bytes(_npz_with_header((-2, -1)))
    one_line(refused(provenance.read_npz_checked, path), "negative side")
    path.write_bytes(_npz_with_header((2,), descr="|O"))
    one_line(refused(provenance.read_npz_checked, path), "Python objects")
    path.write_bytes(_npz_with_header((2,)))  # a well-formed header: read
    assert io.read_npz(path)["loss"].tolist() == [0.0, 0.0]


def _tiny_dataset(n_train: int = 6, n_test: int = 4) -> tuple[dict, dict, dict]:
    rng = np.random.default_rng(0)

    def split(n: int) -> dict:
        return {"images": rng.integers(0, 256, (n, 4, 4, 3), dtype=np.uint8),
                "labels": rng.integers(0, 3, n).astype(np.int64)}

    meta = {"name": "tiny", "num_classes": 3, "image_size": 4, "channels": 3}
    return split(n_train), split(n_test), meta


def test_a_data_set_array_whose_shape_is_not_the_recorded_one_is_refused_before_loading(tmp_path):
    train, test, meta = _tiny_dataset()
    data.write_dataset(tmp_path, train, test, meta)
    data.read_dataset(tmp_path)
    # A train.npz with one image more, and a meta.json that vouches for its bytes.
    io.write_npz(tmp_path / "train.npz", images=np.zeros((7, 4, 4, 3), np.uint8), labels=np.zeros(7, np.int64))
    record = provenance.read_record(tmp_path / "meta.json")
    record["sha256"]["train.npz"] = io.file_sha256(tmp_path / "train.npz")
    provenance.write_record(tmp_path / "meta.json", record)
    err = refused(data.read_dataset, tmp_path)
    assert isinstance(err, data.IntegrityError)
    one_line(err, "train.npz", "'images' is uint8 (7, 4, 4, 3), expected uint8 (6, 4, 4, 3)")


# ---- archives that inflate ---------------------------------------------------------------------------

def _deflated(name: str, size: int) -> bytes:
    """A zip holding ``size`` zero bytes as one deflated member, written in chunks."""
    out = _io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive, archive.open(name, "w") as member:
        chunk = b"\0" * (1 << 20)
        for start in range(0, size, len(chunk)):
            member.write(chunk[: size - start])
    return out.getvalue()


def test_a_zip_member_that_inflates_a_thousandfold_is_refused_unread(folder, tmp_path, monkeypatch):
    bomb = _deflated("loss.npy", 2 << 20)  # 2 MiB of zeros in ~2 KB
    path = folder / "losses.npz"
    path.write_bytes(bomb)
    one_line(refused(provenance.read_npz_checked, path), str(path), "'loss.npy' inflates", "at most 100-fold")
    e2e = tmp_path / readers.E2E_ARCHIVE_NAME
    e2e.write_bytes(_deflated("e2e-dataset/trainset.csv", 2 << 20))
    one_line(refused(readers.download_e2e, tmp_path, progress=False), str(e2e), "trainset.csv", "at most 100-fold")
    assert not (tmp_path / "trainset.csv").exists()  # nothing extracted
    # Past its size limit (lowered here: the real one is 64 MiB), whatever the ratio.
    monkeypatch.setattr(io, "ARCHIVE_MEMBER_LIMIT", 1 << 20)
    monkeypatch.setattr(io, "ZIP_RATIO_LIMIT", 10 ** 6)
    one_line(refused(readers.download_e2e, tmp_path, progress=False), "inflates to 2.0 MiB, more than the 1.0 MiB")


def test_a_zip_member_compressed_without_a_bound_is_refused(tmp_path):
    archive = tmp_path / readers.E2E_ARCHIVE_NAME
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_BZIP2) as bundle:
        bundle.writestr("e2e-dataset/trainset.csv", "mr,ref\n")
    one_line(refused(readers.download_e2e, tmp_path, progress=False), "compression method 12")


def test_a_cifar_archive_that_inflates_past_its_limit_stops_while_it_is_read(tmp_path, monkeypatch):
    path = tmp_path / "cifar.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        info = tarfile.TarInfo("cifar-100-python/file.txt~")
        info.size = 3 << 20
        archive.addfile(info, _io.BytesIO(b"\0" * info.size))
    monkeypatch.setattr(io, "CIFAR_INFLATED_LIMIT", 1 << 20)  # the real one: 512 MiB
    err = refused(data.load_cifar100_archive, path, expected_counts=None)
    one_line(err, str(path), "inflates to more than 1.0 MiB")
    monkeypatch.setattr(io, "CIFAR_INFLATED_LIMIT", 64 << 20)
    monkeypatch.setattr(io, "CIFAR_MEMBER_LIMIT", 1 << 20)
    with tarfile.open(path, "w:gz") as archive:
        info = tarfile.TarInfo("cifar-100-python/train")
        info.size = 2 << 20
        archive.addfile(info, _io.BytesIO(b"\0" * info.size))
    one_line(refused(data.load_cifar100_archive, path, expected_counts=None), "'cifar-100-python/train' is 2.0 MiB")


def test_the_webnlg_download_is_pinned_to_a_commit_and_its_content(tmp_path, monkeypatch):
    assert readers.WEBNLG2017_COMMIT in readers.WEBNLG2017_URL and "master" not in readers.WEBNLG2017_URL
    assert len(readers.WEBNLG2017_COMMIT) == 40 and len(readers.WEBNLG2017_CONTENT_SHA256) == 64
    archive = tmp_path / readers.WEBNLG2017_ARCHIVE_NAME
    with zipfile.ZipFile(archive, "w") as bundle:
        bundle.writestr("x/webnlg_challenge_2017/dev/a.xml", "<benchmark/>")
    err = refused(readers.download_webnlg, tmp_path, progress=False)
    assert isinstance(err, data.IntegrityError)
    one_line(err, str(archive), "not the pinned", "nothing was extracted")
    assert not (tmp_path / readers.WEBNLG2017_FOLDER).exists()
    monkeypatch.setattr(readers, "WEBNLG2017_CONTENT_SHA256", None)
    err = refused(readers.download_webnlg, tmp_path, progress=False)
    assert isinstance(err, data.DataUnavailable)
    one_line(err, "not pinned", "WEBNLG2017_CONTENT_SHA256")


# ---- JSON built to break the parser ----------------------------------------------------------------

def test_json_nested_100000_deep_is_refused_in_one_line(folder):
    path = folder / "eval.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    err = refused(provenance.read_record, path)
    assert isinstance(err, provenance.ArtifactError)
    one_line(err, str(path), "nested more than 64 levels")
    one_line(refused(io.read_json, path), str(path), "nested more than 64 levels")
    split = folder / "train.jsonl"
    split.write_text('{"source": "a", "references": ["b"]}\n' + '{"source": ' + "[" * 100_000 + "\n")
    one_line(refused(schemas.read_split, split), f"{split}:2", "nested more than 64 levels")


def test_json_brackets_inside_strings_do_not_count_as_nesting():
    text = '{"a": "' + "[{" * 5000 + '\\" ]", "b": [[1, {"c": -2.5e-3}]]}'
    assert io.json_depth(text) == 4  # the object, two lists, the inner object
    assert io.safe_json_loads(text, "x.json")["b"] == [[1, {"c": -0.0025}]]


def test_a_5000_digit_number_is_refused_in_one_line(folder):
    path = folder / "eval.json"
    for number in ("7" * 5000, "1." + "5" * 5000, "1e" + "9" * 5000):
        path.write_text('{"top1": ' + number + "}")
        err = refused(provenance.read_record, path)
        assert isinstance(err, provenance.ArtifactError)
        one_line(err, str(path), "characters (at most 100 are read)")
    path.write_text('{"top1": ' + "7" * 100 + "}")  # at the limit: read (then refused for its missing seal)
    one_line(refused(provenance.read_record, path), "carries no")
