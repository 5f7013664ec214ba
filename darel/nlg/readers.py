"""Readers of the official E2E-NLG and WebNLG 2017 files, and their downloads.

Every reader checks what it reads and names the file and line (or entry) of anything it
cannot use. ``find_local`` locates an official file that a user copied below
``data/raw/`` (the quick profile's ``nlg.data.source: local``).

Everything below ``data/raw/`` may have been put there by someone else, so every read is
bounded (darel.io): only plain files, each within its limit (darel.io.ARCHIVE_LIMIT for
an archive, darel.io.ARCHIVE_MEMBER_LIMIT for a CSV, an XML file or an archive member),
zip members checked for their compression method and inflation before they are read.
The WebNLG download is pinned: a fixed commit of its repository, and the sha256 of the
2017 challenge folder's content, checked before anything is extracted.
"""

from __future__ import annotations

import csv
import hashlib
import io
import os
import sys
import urllib.request
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path, PurePosixPath
from typing import Mapping

from darel import io as dio
from darel.io import InputRefused, atomic_path
from darel.nlg.schemas import NLGExample, linearise_triples, parse_mr

# ---------------------------------------------------------------------------
# E2E-NLG


E2E_URL = "https://github.com/tuetschek/e2e-dataset/releases/download/v1.0.0/e2e-dataset.zip"
E2E_ARCHIVE_NAME = "e2e-dataset.zip"
# The release publishes no checksum; the row counts below (data rows, header excluded)
# are what the E2E challenge paper reports and are validated after extraction instead.
E2E_FILES = {"train": "trainset.csv", "dev": "devset.csv", "test": "testset_w_refs.csv"}
E2E_ROWS = {"train": 42061, "dev": 4672, "test": 4693}

def read_e2e_csv(path: str | os.PathLike, expected_rows: int | None = None) -> list[NLGExample]:
    """Read an official E2E CSV (columns ``mr,ref``), grouping rows by MR in first-seen
    order. With ``expected_rows`` the number of data rows is checked."""
    path = Path(path)
    groups: dict[str, list[str]] = {}
    rows = 0
    try:  # utf-8-sig: tolerate a byte-order mark before the header.
        text = dio.read_regular_bytes(path, dio.ARCHIVE_MEMBER_LIMIT, "E2E CSV file").decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text (byte {err.start})") from None
    with io.StringIO(text, newline="") as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None:
            raise ValueError(f"{path}: empty file, expected the header 'mr,ref'")
        columns = [column.strip().lower() for column in header]
        if "mr" not in columns or "ref" not in columns:
            raise ValueError(f"{path}:1: expected columns 'mr' and 'ref', got {header!r}")
        mr_col, ref_col = columns.index("mr"), columns.index("ref")
        for row in reader:
            line = reader.line_num
            if not row:
                continue
            if len(row) != len(columns):
                raise ValueError(f"{path}:{line}: expected {len(columns)} fields, got {len(row)}: {row!r}")
            mr, ref = row[mr_col].strip(), " ".join(row[ref_col].split())
            try:
                parse_mr(mr)
            except ValueError as err:
                raise ValueError(f"{path}:{line}: {err}") from None
            if not ref:
                raise ValueError(f"{path}:{line}: empty reference for MR {mr!r}")
            groups.setdefault(mr, []).append(ref)
            rows += 1
    if expected_rows is not None and rows != expected_rows:
        raise ValueError(f"{path}: expected {expected_rows} data rows, found {rows}")
    return [NLGExample(source=mr, references=tuple(refs)) for mr, refs in groups.items()]


def _plain_download(url: str, dest: Path, progress: bool) -> None:
    """Stream ``url`` into ``dest`` through a temporary file (no checksum known), stopped
    past darel.io.ARCHIVE_LIMIT."""
    with atomic_path(dest) as tmp, urllib.request.urlopen(url, timeout=60) as response, open(tmp, "wb") as out:
        expected = response.headers.get("Content-Length")
        received = 0
        for chunk in iter(lambda: response.read(1 << 20), b""):
            received += len(chunk)
            if received > dio.ARCHIVE_LIMIT:
                raise ValueError(f"download of {url} exceeds {dio.human_size(dio.ARCHIVE_LIMIT)}; stopped")
            out.write(chunk)
        if expected is not None and received != int(expected):
            raise ValueError(f"download of {url} truncated: {received} of {expected} bytes")
        if progress:
            print(f"{dest.name}: {received} bytes", file=sys.stderr)


def _fetch_archive(url: str, archive: Path, md5: str | None, progress: bool) -> Path:
    """Download ``url`` to ``archive`` (MD5-checked by ``darel.data.download_file`` when
    ``md5`` is given, otherwise atomically and only when absent) and print its MD5 so a
    user can pin it."""
    if md5 is not None:
        from darel.data import download_file

        download_file(url, archive, md5, progress=progress)
    elif not os.path.lexists(archive):  # what is there is read bounded (a FIFO or a device: refused, unread)
        _plain_download(url, archive, progress)
    if progress:
        from darel.data import file_md5

        print(f"{archive}: md5 {file_md5(archive)}", file=sys.stderr)
    return archive


def download_e2e(dest: str | os.PathLike, md5: str | None = None, progress: bool = True) -> dict[str, Path]:
    """Fetch the official E2E release into ``dest`` and extract its three CSVs.

    The release has no published checksum. Given ``md5``, ``darel.data.download_file``
    verifies it; without, the archive is downloaded atomically and every extracted
    split is validated against the published row counts (``E2E_ROWS``). The archive's
    MD5 is printed so a user can pin it. Returns split -> CSV path.
    """
    dest = Path(dest)
    archive = _fetch_archive(E2E_URL, dest / E2E_ARCHIVE_NAME, md5, progress)

    paths: dict[str, Path] = {}
    with dio.open_regular(archive, dio.ARCHIVE_LIMIT, "downloaded archive") as handle, \
            zipfile.ZipFile(handle) as bundle:
        members = {Path(info.filename).name: info for info in bundle.infolist() if not info.is_dir()}
        for split, filename in E2E_FILES.items():
            if filename not in members:
                raise ValueError(f"{archive}: no member named {filename!r}")
            target = dest / filename
            with atomic_path(target) as tmp:
                tmp.write_bytes(dio.read_zip_member(bundle, members[filename], archive))
                read_e2e_csv(tmp, expected_rows=E2E_ROWS[split])
            paths[split] = target
    return paths


# ---------------------------------------------------------------------------
# WebNLG 2017


# The official repository's archive at one commit (not a branch, which moves). The commit
# is the one several published WebNLG pipelines pin; what is checked is the content.
WEBNLG2017_COMMIT = "587fa698bec705efbefe72a235a6019c2b9b8b6c"
WEBNLG2017_URL = (f"https://gitlab.com/shimorina/webnlg-dataset/-/archive/{WEBNLG2017_COMMIT}/"
                  f"webnlg-dataset-{WEBNLG2017_COMMIT}.zip")
WEBNLG2017_ARCHIVE_NAME = f"webnlg-dataset-{WEBNLG2017_COMMIT}.zip"
# Inside the archive: challenge data as released for the 2017 challenge.
WEBNLG2017_FOLDER = "webnlg_challenge_2017"
# sha256 of that folder's content (webnlg2017_content_sha256: 107 files, 13.4 MB), the same
# in two independent copies of the repository (2018 and 2025; git tree e006d6e2). The
# archive's own bytes are made by GitLab on request and are not pinned; its content is.
# None: the download is refused until a checked value is filled in.
WEBNLG2017_CONTENT_SHA256: str | None = "47adc1256bc24f74813255c2a54b930fcccb988312d3713e6b599feec157cbe8"
WEBNLG2017_SPLITS = {"train": "train", "dev": "dev", "test": "test/testdata_with_lex.xml"}
# Triple sets (entries) per split as documented for the challenge; the paper's "872
# validation samples" is the dev entry count.
WEBNLG2017_ENTRIES = {"train": 6940, "dev": 872, "test": 1862}


def webnlg2017_content_sha256(files: Mapping[str, bytes]) -> str:
    """sha256 over one line per file, sorted: its path below the 2017 folder, a tab, the
    sha256 of its bytes, a newline. The content of the folder, whoever packed it."""
    lines = sorted(f"{name}\t{hashlib.sha256(content).hexdigest()}\n" for name, content in files.items())
    return hashlib.sha256("".join(lines).encode("utf-8")).hexdigest()


def _webnlg2017_files(archive: Path) -> dict[str, bytes]:
    """The archive's ``.../webnlg_challenge_2017/**`` files (path below that folder ->
    bytes), every member bounded (darel.io.read_zip_member) and all of them together
    within darel.io.WEBNLG_FOLDER_LIMIT."""
    files: dict[str, bytes] = {}
    total = 0
    with dio.open_regular(archive, dio.ARCHIVE_LIMIT, "downloaded archive") as handle, \
            zipfile.ZipFile(handle) as bundle:
        for info in bundle.infolist():
            parts = PurePosixPath(info.filename).parts
            if info.is_dir() or WEBNLG2017_FOLDER not in parts:
                continue
            relative = parts[parts.index(WEBNLG2017_FOLDER) + 1 :]
            if not relative or any(part in ("..", "") or part.startswith("/") or "\\" in part for part in relative):
                raise ValueError(f"{archive}: unsafe member path {info.filename!r}")
            total += info.file_size
            if total > dio.WEBNLG_FOLDER_LIMIT:
                raise InputRefused(archive, f"its {WEBNLG2017_FOLDER} folder inflates to more than "
                                            f"{dio.human_size(dio.WEBNLG_FOLDER_LIMIT)} (the release: 13.4 MB)")
            files["/".join(relative)] = dio.read_zip_member(bundle, info, archive)
    if not files:
        raise ValueError(f"{archive}: no files below a {WEBNLG2017_FOLDER!r} folder")
    return files


def _extract_webnlg2017(archive: Path, dest: Path) -> Path:
    """Copy the archive's ``.../webnlg_challenge_2017/**`` files below ``dest``, once their
    content is the pinned one (WEBNLG2017_CONTENT_SHA256); nothing is written otherwise."""
    from darel.data import DataUnavailable, IntegrityError

    if WEBNLG2017_CONTENT_SHA256 is None:
        raise DataUnavailable(f"the WebNLG download is not pinned (darel.nlg.readers.WEBNLG2017_CONTENT_SHA256 is "
                              f"None): {archive} is not used until a checked sha256 is filled in")
    files = _webnlg2017_files(archive)
    found = webnlg2017_content_sha256(files)
    if found != WEBNLG2017_CONTENT_SHA256:
        raise IntegrityError(f"{archive}: its {WEBNLG2017_FOLDER} folder has content sha256 {found[:16]}..., not the "
                             f"pinned {WEBNLG2017_CONTENT_SHA256[:16]}...; nothing was extracted (move it away and run "
                             "again)")
    root = dest / WEBNLG2017_FOLDER
    for name, content in sorted(files.items()):
        with atomic_path(root.joinpath(*name.split("/"))) as tmp:
            tmp.write_bytes(content)
    return root


def download_webnlg(dest: str | os.PathLike, md5: str | None = None, progress: bool = True) -> Path:
    """Fetch the WebNLG repository archive (at ``WEBNLG2017_COMMIT``) into ``dest`` and
    extract its 2017 challenge folder, once its content has the pinned sha256
    (``WEBNLG2017_CONTENT_SHA256``); returns that folder (``WEBNLG2017_SPLITS`` are
    relative to it). ``md5``: the archive's own MD5, checked as well when given.
    """
    dest = Path(dest)
    return _extract_webnlg2017(_fetch_archive(WEBNLG2017_URL, dest / WEBNLG2017_ARCHIVE_NAME, md5, progress), dest)


def _lex_text(lex: ET.Element) -> str:
    # 2017 challenge files hold the text directly in <lex>; later releases nest <text>.
    text_node = lex.find("text")
    raw = text_node.text if text_node is not None else lex.text
    return " ".join((raw or "").split())


def read_webnlg_xml(path: str | os.PathLike, expected_entries: int | None = None) -> list[NLGExample]:
    """Read WebNLG challenge XML: one file, or every ``*.xml`` below a folder (sorted).

    Each ``<entry>`` becomes one example: its ``modifiedtripleset/mtriple`` triples,
    linearised, and the English ``<lex>`` texts as references. An entry without any
    reference is an error (the test file without lexicalisations is not readable here).
    """
    path = Path(path)
    if path.is_dir():
        files = sorted(path.rglob("*.xml"))
        if not files:
            raise ValueError(f"{path}: no .xml files below this folder")
    elif os.path.lexists(path):
        files = [path]  # a FIFO or a device is refused unread below
    else:
        raise ValueError(f"{path}: no such file or folder")
    examples: list[NLGExample] = []
    for file in files:
        content = dio.read_regular_bytes(file, dio.ARCHIVE_MEMBER_LIMIT, "WebNLG XML file")
        try:  # expat refuses entity expansion that amplifies (billion laughs); nothing external is fetched
            root = ET.fromstring(content)
        except ET.ParseError as err:
            raise ValueError(f"{file}: invalid XML: {err}") from None
        for entry in root.iter("entry"):
            where = f"{file}: entry eid={entry.get('eid', '?')}"
            triples = [
                " ".join((node.text or "").split()) for node in entry.findall("modifiedtripleset/mtriple")
            ]
            if not triples:
                raise ValueError(f"{where}: no modifiedtripleset/mtriple")
            try:
                source = linearise_triples(triples)
            except ValueError as err:
                raise ValueError(f"{where}: {err}") from None
            refs = tuple(
                text
                for lex in entry.findall("lex")
                if lex.get("lang", "en") == "en" and (text := _lex_text(lex))
            )
            if not refs:
                raise ValueError(f"{where}: no English <lex> reference")
            examples.append(NLGExample(source=source, references=refs))
    if expected_entries is not None and len(examples) != expected_entries:
        raise ValueError(f"{path}: expected {expected_entries} entries, found {len(examples)}")
    return examples


# ---------------------------------------------------------------------------
# Copies of the official files that a user put below data/raw


def local_split_paths(dataset: str, raw: str | os.PathLike) -> dict[str, Path]:
    """Where the official files of ``dataset`` ("e2e" or "webnlg") are expected below
    ``raw`` (the layout the downloads write): split -> file or folder. Raises naming
    every missing one."""
    raw = Path(raw)
    if dataset == "e2e":
        paths = {split: raw / "e2e" / name for split, name in E2E_FILES.items()}
    elif dataset == "webnlg":
        root = raw / "webnlg" / WEBNLG2017_FOLDER
        paths = {split: root / rel for split, rel in WEBNLG2017_SPLITS.items()}
    else:
        raise ValueError(f"unknown NLG data set {dataset!r}; expected 'e2e' or 'webnlg'")
    missing = [str(path) for path in paths.values() if not path.exists()]
    if missing:
        raise ValueError(f"nlg.data.source is local but the official {dataset} files are not all there: "
                         f"missing {', '.join(missing)} (copy the release there, or use source: synthetic)")
    return paths


def read_local(dataset: str, raw: str | os.PathLike) -> dict[str, list[NLGExample]]:
    """Every split of the official files of ``dataset`` below ``raw`` (row/entry counts
    are not checked: a user's copy may be a part of the release)."""
    paths = local_split_paths(dataset, raw)
    if dataset == "e2e":
        return {split: read_e2e_csv(path) for split, path in paths.items()}
    return {split: read_webnlg_xml(path) for split, path in paths.items()}
