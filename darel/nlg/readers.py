"""Readers of the official E2E-NLG and WebNLG 2017 files, and their downloads.

Every reader checks what it reads and names the file and line (or entry) of anything it
cannot use. ``find_local`` locates an official file that a user copied below
``data/raw/`` (the quick profile's ``nlg.data.source: local``).
"""

from __future__ import annotations

import csv
import os
import sys
import urllib.request
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

from darel.io import atomic_path
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
    # utf-8-sig: tolerate a byte-order mark before the header.
    with open(path, encoding="utf-8-sig", newline="") as handle:
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
    """Stream ``url`` into ``dest`` through a temporary file (no checksum known)."""
    with atomic_path(dest) as tmp, urllib.request.urlopen(url, timeout=60) as response, open(tmp, "wb") as out:
        expected = response.headers.get("Content-Length")
        received = 0
        for chunk in iter(lambda: response.read(1 << 20), b""):
            out.write(chunk)
            received += len(chunk)
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
    elif not archive.exists():
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
    with zipfile.ZipFile(archive) as bundle:
        members = {Path(info.filename).name: info for info in bundle.infolist() if not info.is_dir()}
        for split, filename in E2E_FILES.items():
            if filename not in members:
                raise ValueError(f"{archive}: no member named {filename!r}")
            target = dest / filename
            with atomic_path(target) as tmp:
                tmp.write_bytes(bundle.read(members[filename]))
                read_e2e_csv(tmp, expected_rows=E2E_ROWS[split])
            paths[split] = target
    return paths


# ---------------------------------------------------------------------------
# WebNLG 2017


WEBNLG2017_URL = "https://gitlab.com/shimorina/webnlg-dataset/-/archive/master/webnlg-dataset-master.zip"
# Inside the archive: challenge data as released for the 2017 challenge.
WEBNLG2017_ARCHIVE_NAME = "webnlg-dataset-master.zip"
WEBNLG2017_FOLDER = "webnlg_challenge_2017"
WEBNLG2017_SPLITS = {"train": "train", "dev": "dev", "test": "test/testdata_with_lex.xml"}
# Triple sets (entries) per split as documented for the challenge; the paper's "872
# validation samples" is the dev entry count.
WEBNLG2017_ENTRIES = {"train": 6940, "dev": 872, "test": 1862}


def _extract_webnlg2017(archive: Path, dest: Path) -> Path:
    """Copy the archive's ``.../webnlg_challenge_2017/**`` files below ``dest``."""
    root = dest / WEBNLG2017_FOLDER
    extracted = 0
    with zipfile.ZipFile(archive) as bundle:
        for info in bundle.infolist():
            parts = Path(info.filename).parts
            if info.is_dir() or WEBNLG2017_FOLDER not in parts:
                continue
            relative = parts[parts.index(WEBNLG2017_FOLDER) + 1 :]
            if not relative or any(part in ("..", "") or part.startswith("/") for part in relative):
                raise ValueError(f"{archive}: unsafe member path {info.filename!r}")
            with atomic_path(root.joinpath(*relative)) as tmp:
                tmp.write_bytes(bundle.read(info))
            extracted += 1
    if not extracted:
        raise ValueError(f"{archive}: no files below a {WEBNLG2017_FOLDER!r} folder")
    return root


def download_webnlg(dest: str | os.PathLike, md5: str | None = None, progress: bool = True) -> Path:
    """Fetch the WebNLG repository archive into ``dest`` and extract its 2017
    challenge folder; returns that folder (``WEBNLG2017_SPLITS`` are relative to it).

    The archive is a snapshot of a branch, so no checksum can be pinned in advance;
    pass ``md5`` to pin the one you have, and check the entry counts
    (``WEBNLG2017_ENTRIES``) when reading the splits.
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
    elif path.is_file():
        files = [path]
    else:
        raise ValueError(f"{path}: no such file or folder")
    examples: list[NLGExample] = []
    for file in files:
        try:
            root = ET.parse(file).getroot()
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
