"""Data-to-text records for E2E-NLG and WebNLG 2017, their official readers, and
synthetic stand-ins built from the real schemas.

A split is a list of ``NLGExample``: one example per distinct input (the linearised
meaning representation or triple set) holding *all* of its references, because the
E2E and WebNLG evaluations score one hypothesis per input against every reference.
Training expands a split into (source, one reference) pairs with ``training_pairs``.

The synthetic generators exist because models and data cannot be downloaded in the
offline test environment. They draw inputs from the real slot/predicate schemas and
realise each input with several independently templated English references, every one
of which mentions every input value. They are stand-ins for plumbing and timing, not
for the scores of the paper.
"""

from __future__ import annotations

import csv
import json
import os
import random
import re
import sys
import urllib.request
import xml.etree.ElementTree as ET
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from darel.io import atomic_path, write_text


@dataclass(frozen=True)
class NLGExample:
    """One input with every reference text written for it."""

    source: str
    references: tuple[str, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.source, str) or not self.source.strip():
            raise ValueError(f"NLGExample.source must be a non-empty string, got {self.source!r}")
        if not isinstance(self.references, tuple) or not self.references:
            raise ValueError(f"NLGExample.references must be a non-empty tuple, got {self.references!r}")
        for ref in self.references:
            if not isinstance(ref, str) or not ref.strip():
                raise ValueError(f"NLGExample for {self.source!r}: empty or non-string reference {ref!r}")


def training_pairs(examples: Iterable[NLGExample]) -> list[tuple[str, str]]:
    """Expand grouped examples to one (source, reference) pair per reference, in order."""
    return [(example.source, ref) for example in examples for ref in example.references]


# ---------------------------------------------------------------------------
# E2E-NLG: meaning representations


E2E_URL = "https://github.com/tuetschek/e2e-dataset/releases/download/v1.0.0/e2e-dataset.zip"
E2E_ARCHIVE_NAME = "e2e-dataset.zip"
# The release publishes no checksum; the row counts below (data rows, header excluded)
# are what the E2E challenge paper reports and are validated after extraction instead.
E2E_FILES = {"train": "trainset.csv", "dev": "devset.csv", "test": "testset_w_refs.csv"}
E2E_ROWS = {"train": 42061, "dev": 4672, "test": 4693}

# The eight slots in the order the official data writes them, with their real value
# sets. ``name`` and ``near`` are open (venue names); invented names stand in for them.
E2E_SLOT_ORDER = ("name", "eatType", "food", "priceRange", "customer rating", "area", "familyFriendly", "near")
E2E_VENUE_NAMES = (
    "The Copper Kettle", "The Wandering Fox", "Blue Heron", "The Olive Branch", "Saffron Court",
    "The Silver Birch", "Harbour Lights", "The Red Lantern", "Juniper House", "The Quiet Otter",
    "Maple Yard", "The Gilded Spoon", "Lotus Garden", "The Old Mill", "Bramble Corner",
    "The Brass Anchor", "Golden Pagoda", "The Velvet Plum", "Riverstone", "The Tin Whistle",
)
E2E_LANDMARK_NAMES = (
    "Clare Bridge", "The Corn Exchange", "Market Square", "St Anne's Church", "Kingfisher Park",
    "The Guildhall", "Cherry Lane Cinema", "The Ferry Terminal", "Northgate Station", "Hollow Oak Library",
    "The Bluebell Inn", "Castle Mound", "The Rowing Club", "Elmwood Theatre",
)
E2E_SLOTS: dict[str, tuple[str, ...]] = {
    "name": E2E_VENUE_NAMES,
    "eatType": ("coffee shop", "pub", "restaurant"),
    "food": ("Chinese", "English", "Fast food", "French", "Indian", "Italian", "Japanese"),
    "priceRange": ("cheap", "less than £20", "£20-25", "moderate", "high", "more than £30"),
    "customer rating": ("1 out of 5", "3 out of 5", "5 out of 5", "low", "average", "high"),
    "area": ("city centre", "riverside"),
    "familyFriendly": ("yes", "no"),
    "near": E2E_LANDMARK_NAMES,
}

# One slot[value] item of an MR; values hold no brackets in the official data.
_MR_ITEM = re.compile(r"\s*([^\[\],]+?)\s*\[([^\[\]]*)\]\s*")


def parse_mr(mr: str) -> dict[str, str]:
    """Parse ``name[The Eagle], eatType[coffee shop]`` into an ordered slot -> value dict."""
    if not isinstance(mr, str) or not mr.strip():
        raise ValueError(f"empty meaning representation: {mr!r}")
    slots: dict[str, str] = {}
    pos = 0
    while True:
        match = _MR_ITEM.match(mr, pos)
        if match is None:
            raise ValueError(f"malformed meaning representation {mr!r}: expected slot[value] at character {pos}")
        slot, value = match.group(1), match.group(2).strip()
        if not value:
            raise ValueError(f"malformed meaning representation {mr!r}: slot {slot!r} has an empty value")
        if slot in slots:
            raise ValueError(f"malformed meaning representation {mr!r}: slot {slot!r} appears twice")
        slots[slot] = value
        pos = match.end()
        if pos == len(mr):
            return slots
        if mr[pos] != ",":
            raise ValueError(f"malformed meaning representation {mr!r}: expected ',' at character {pos}")
        pos += 1


def format_mr(slots: dict[str, str]) -> str:
    """Inverse of ``parse_mr``: ``slot[value]`` items joined by ', ' in the dict's order."""
    if not slots:
        raise ValueError("cannot format an empty meaning representation")
    for slot, value in slots.items():
        if any(ch in slot + value for ch in "[]") or "," in slot or not value.strip():
            raise ValueError(f"slot {slot!r} with value {value!r} cannot be written as slot[value]")
    return ", ".join(f"{slot}[{value}]" for slot, value in slots.items())


# ---------------------------------------------------------------------------
# E2E-NLG: synthetic stand-in


def _article(phrase: str) -> str:
    return "an" if phrase[:1].lower() in "aeiou" else "a"


def _food_noun(food: str) -> str:
    # "Fast food" is already a noun phrase; the cuisines are adjectives.
    return "fast food" if food.lower() == "fast food" else f"{food} food"


def _food_adjective(food: str) -> str:
    return "fast food" if food.lower() == "fast food" else food


def _join_phrases(phrases: Sequence[str]) -> str:
    if len(phrases) == 1:
        return phrases[0]
    return ", ".join(phrases[:-1]) + " and " + phrases[-1]


def _sentence(text: str) -> str:
    text = text.strip().rstrip(".")
    return text[0].upper() + text[1:] + "."


def _e2e_verb_phrase(slot: str, value: str, rng: random.Random) -> str:
    """A verb phrase (no subject) that states ``slot = value``, quoting the value."""
    numeric_rating = value[:1].isdigit()
    amount_price = "£" in value
    options: dict[str, list[str]] = {
        "food": [f"serves {_food_noun(value)}", f"offers {_food_noun(value)}", f"has {_food_noun(value)} on the menu"],
        "priceRange": [
            f"is in the {value} price range",
            f"has a {value} price range",
            f"has prices in the {value} range" if not amount_price else f"charges {value} per meal",
        ],
        "customer rating": (
            [f"has a customer rating of {value}", f"is rated {value} by customers", f"has been rated {value} by its guests"]
            if numeric_rating
            else [f"has a {value} customer rating", f"is rated {value} by customers", f"has an {value} rating" if value[0] in "aeiou" else f"has a {value} rating"]
        ),
        "area": [f"is located in the {value} area", f"is in the {value}", f"can be found in the {value} area"],
        "familyFriendly": (
            ["is family-friendly", "is family friendly", "welcomes families", "is a good choice for families"]
            if value == "yes"
            else ["is not family-friendly", "is not family friendly", "is not suitable for families", "does not welcome families"]
        ),
        "near": [f"is near {value}", f"is located near {value}", f"is close to {value}", f"can be found near {value}"],
    }
    if slot not in options:
        raise ValueError(f"no phrase for E2E slot {slot!r}")
    return rng.choice(options[slot])


def _e2e_reference(slots: dict[str, str], rng: random.Random) -> str:
    """One templated English reference that mentions every slot value of ``slots``."""
    name = slots["name"]
    noun = slots.get("eatType") or rng.choice(["venue", "place", "spot"])
    remaining = [slot for slot in E2E_SLOT_ORDER if slot in slots and slot not in ("name", "eatType")]

    food = slots.get("food")
    food_in_intro = food is not None and rng.random() < 0.7
    if food_in_intro:
        remaining.remove("food")
        described = f"{_food_adjective(food)} {noun}"
        intro = rng.choice(
            [
                f"{name} is {_article(described)} {described}",
                f"there is {_article(described)} {described} called {name}",
                f"{name} is {_article(noun)} {noun} that serves {_food_noun(food)}",
                f"{_article(noun)} {noun} named {name} offers {_food_noun(food)}",
            ]
        )
    else:
        intro = rng.choice(
            [f"{name} is {_article(noun)} {noun}", f"there is {_article(noun)} {noun} called {name}"]
        )

    # Sometimes fold the location into the opening sentence, in front or behind.
    if "area" in remaining and rng.random() < 0.4:
        remaining.remove("area")
        area = slots["area"]
        if rng.random() < 0.5:
            intro = f"located in the {area} area, {intro}"
        else:
            intro = f"{intro} in the {area} area"
    if "near" in remaining and rng.random() < 0.4:
        remaining.remove("near")
        intro = f"{intro} near {slots['near']}"

    sentences = [_sentence(intro)]
    rng.shuffle(remaining)
    while remaining:
        take = min(len(remaining), rng.randint(1, 3))
        group, remaining = remaining[:take], remaining[take:]
        subject = rng.choice(["it", f"the {noun}", name])
        phrases = [_e2e_verb_phrase(slot, slots[slot], rng) for slot in group]
        sentences.append(_sentence(f"{subject} {_join_phrases(phrases)}"))
    return " ".join(sentences)


def _distinct_references(make, count: int, minimum: int, rng: random.Random, what: str) -> tuple[str, ...]:
    """Up to ``count`` different outputs of ``make(rng)``, at least ``minimum`` (a
    one-triple input may have fewer wordings than asked for)."""
    refs: list[str] = []
    for _ in range(50 * count):
        ref = make(rng)
        if ref not in refs:
            refs.append(ref)
            if len(refs) == count:
                break
    if len(refs) < minimum:
        raise ValueError(f"could not realise {minimum} distinct references for {what}")
    return tuple(refs)


def _check_ref_range(refs_per_input: tuple[int, int], name: str) -> tuple[int, int]:
    low, high = refs_per_input
    if not (isinstance(low, int) and isinstance(high, int) and 1 <= low <= high):
        raise ValueError(f"{name} must be (low, high) with 1 <= low <= high, got {refs_per_input!r}")
    return low, high


def make_synthetic_e2e(n_mrs: int, refs_per_mr: tuple[int, int] = (2, 5), seed: int = 0) -> list[NLGExample]:
    """``n_mrs`` distinct E2E-style MRs, each with a random number in ``refs_per_mr``
    (inclusive) of differently templated references naming every slot value."""
    if not isinstance(n_mrs, int) or n_mrs < 1:
        raise ValueError(f"n_mrs must be a positive integer, got {n_mrs!r}")
    low, high = _check_ref_range(refs_per_mr, "refs_per_mr")
    rng = random.Random(seed)
    # How often each optional slot occurs; real MRs hold 3 to 8 slots.
    slot_probability = {
        "eatType": 0.8, "food": 0.7, "priceRange": 0.6, "customer rating": 0.6,
        "area": 0.7, "familyFriendly": 0.6, "near": 0.5,
    }
    examples: list[NLGExample] = []
    seen: set[str] = set()
    for _ in range(1000 * n_mrs):
        if len(examples) == n_mrs:
            break
        slots = {"name": rng.choice(E2E_VENUE_NAMES)}
        for slot in E2E_SLOT_ORDER[1:]:
            if rng.random() < slot_probability[slot]:
                slots[slot] = rng.choice(E2E_SLOTS[slot])
        if len(slots) < 3:
            continue
        mr = format_mr(slots)
        if mr in seen:
            continue
        seen.add(mr)
        count = rng.randint(low, high)
        refs = _distinct_references(lambda r: _e2e_reference(slots, r), count, low, rng, mr)
        examples.append(NLGExample(source=mr, references=refs))
    if len(examples) < n_mrs:
        raise ValueError(f"could only draw {len(examples)} distinct MRs, asked for n_mrs={n_mrs}")
    return examples


def e2e_value_mentions(slot: str, value: str) -> list[str]:
    """Lower-case strings a reference must contain to express ``slot = value``
    (the yes/no of familyFriendly is worded, not quoted)."""
    if slot == "familyFriendly":
        return ["famil", "not"] if value == "no" else ["famil"]
    if slot == "food":
        return [_food_adjective(value).lower()]
    return [value.lower()]


# ---------------------------------------------------------------------------
# E2E-NLG: official files


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


def parse_triple(text: str) -> tuple[str, str, str]:
    """``subject | predicate | object`` -> a 3-tuple of stripped parts."""
    parts = [part.strip() for part in text.split(" | ")]
    if len(parts) != 3 or not all(parts):
        raise ValueError(f"malformed triple {text!r}: expected 'subject | predicate | object'")
    return parts[0], parts[1], parts[2]


def entity_text(entity: str) -> str:
    """How a DBpedia-style entity reads in text: underscores to spaces, quotes dropped."""
    return entity.replace("_", " ").strip().strip('"').strip()


def linearise_triples(triples: Sequence[tuple[str, str, str] | str]) -> str:
    """``s : p : o | s : p : o`` with entities in their text form, as the GPT-2 LoRA
    recipe feeds WebNLG inputs. Triples may be 3-tuples or ``s | p | o`` strings."""
    if not triples:
        raise ValueError("cannot linearise an empty triple set")
    parts = []
    for triple in triples:
        subject, predicate, obj = parse_triple(triple) if isinstance(triple, str) else triple
        parts.append(f"{entity_text(subject)} : {predicate} : {entity_text(obj)}")
    return " | ".join(parts)


@dataclass(frozen=True)
class _Predicate:
    values: tuple[str, ...]
    verb_phrases: tuple[str, ...]  # with {o}; the subject is put in front
    sentences: tuple[str, ...]  # whole sentences with {s} and {o}


@dataclass(frozen=True)
class _Category:
    subjects: tuple[str, ...]
    pronoun: str  # how a later sentence refers back to the subject
    predicates: dict[str, _Predicate]


# A small slice of WebNLG 2017's seen categories and predicates, with DBpedia-style
# entities. The objects are drawn independently per triple set, so the "facts" are
# invented; only the vocabulary and shape follow the real data.
WEBNLG_SCHEMA: dict[str, _Category] = {
    "Airport": _Category(
        ("Aarhus_Airport", "Abilene_Regional_Airport", "Alderney_Airport", "Amsterdam_Airport_Schiphol",
         "Antwerp_International_Airport", "Atlantic_City_International_Airport"),
        "the airport",
        {
            "cityServed": _Predicate(
                ("Aarhus", "Abilene,_Texas", "Alderney", "Amsterdam", "Antwerp", "Atlantic_City,_New_Jersey"),
                ("serves the city of {o}", "serves {o}"),
                ("The city of {o} is served by {s}.", "{s} is the airport of {o}."),
            ),
            "runwayLength": _Predicate(
                ("2776.0", "2194.0", "877.0", "3800.0", "1600.0", "3453.0"),
                ("has a runway length of {o}", "has a runway that is {o} long"),
                ("The runway length of {s} is {o}.",),
            ),
            "elevationAboveTheSeaLevel": _Predicate(
                ("25.0", "546", "88.0", "-3.3528", "23", "12.0"),
                ("is {o} metres above sea level", "has an elevation of {o} above sea level"),
                ("The elevation of {s} above sea level is {o} metres.",),
            ),
            "location": _Predicate(
                ("Tirstrup", "Taylor_County,_Texas", "Haarlemmermeer", "Deurne,_Belgium", "Egg_Harbor_Township,_New_Jersey"),
                ("is located in {o}", "is in {o}"),
                ("{s} can be found in {o}.",),
            ),
            "operatingOrganisation": _Predicate(
                ("Aktieselskab", "City_of_Abilene", "States_of_Guernsey", "Schiphol_Group"),
                ("is operated by {o}", "is run by {o}"),
                ("{o} operates {s}.",),
            ),
        },
    ),
    "Astronaut": _Category(
        ("Alan_Shepard", "Buzz_Aldrin", "Elliot_See", "William_Anders", "Alan_Bean"),
        "he",
        {
            "birthPlace": _Predicate(
                ("New_Hampshire", "Glen_Ridge,_New_Jersey", "Dallas", "British_Hong_Kong", "Wheeler,_Texas"),
                ("was born in {o}",),
                ("The birthplace of {s} is {o}.", "{s} was a native of {o}."),
            ),
            "birthDate": _Predicate(
                ("1923-11-18", "1930-01-20", "1927-07-23", "1933-10-17", "1932-03-15"),
                ("was born on {o}",),
                ("{s}'s date of birth is {o}.",),
            ),
            "mission": _Predicate(
                ("Apollo_14", "Apollo_11", "Apollo_8", "Apollo_12", "Gemini_10"),
                ("was a crew member of {o}", "took part in the {o} mission"),
                ("{s} flew on {o}.",),
            ),
            "almaMater": _Predicate(
                ("Dartmouth_College", "Massachusetts_Institute_of_Technology", "University_of_Texas_at_Austin",
                 "Air_Force_Institute_of_Technology"),
                ("graduated from {o}", "studied at {o}"),
                ("{s}'s alma mater is {o}.",),
            ),
            "occupation": _Predicate(
                ("Test_pilot", "Fighter_pilot"),
                ("worked as a {o}", "served as a {o}"),
                ("{s} had a career as a {o}.",),
            ),
        },
    ),
    "Building": _Category(
        ("103_Colmore_Row", "200_Public_Square", "3Arena", "Adare_Manor", "Asilomar_Conference_Grounds"),
        "the building",
        {
            "location": _Predicate(
                ("Birmingham", "Cleveland", "Dublin", "Adare", "Pacific_Grove,_California"),
                ("is located in {o}", "stands in {o}"),
                ("{s} is situated in {o}.",),
            ),
            "architect": _Predicate(
                ("John_Madin", "Philip_Charles_Hardwick", "Julia_Morgan", "HOK_SV"),
                ("was designed by {o}",),
                ("{o} was the architect of {s}.",),
            ),
            "floorCount": _Predicate(
                ("23", "45", "4", "12"),
                ("has {o} floors",),
                ("{s} has a floor count of {o}.",),
            ),
            "completionDate": _Predicate(
                ("1976", "1985", "2008", "1862", "1913"),
                ("was completed in {o}",),
                ("The construction of {s} was finished in {o}.",),
            ),
        },
    ),
    "City": _Category(
        ("Albany,_Georgia", "Amarillo,_Texas", "Anderson,_Indiana", "Atlanta", "Auburn,_Alabama"),
        "the city",
        {
            "country": _Predicate(("United_States",), ("is in the {o}",), ("{s} is a city in the {o}.",)),
            "isPartOf": _Predicate(
                ("Dougherty_County,_Georgia", "Potter_County,_Texas", "Madison_County,_Indiana",
                 "Fulton_County,_Georgia", "Lee_County,_Alabama"),
                ("is part of {o}", "lies in {o}"),
                ("{s} is part of {o}.",),
            ),
            "populationTotal": _Predicate(
                ("77434", "190695", "56129", "420003", "53380"),
                ("has a population of {o}", "is home to {o} people"),
                ("The population of {s} is {o}.",),
            ),
            "areaTotal": _Predicate(
                ("144.7", "233.9", "107.4", "347.1"),
                ("covers a total area of {o} square kilometres",),
                ("The total area of {s} is {o} square kilometres.",),
            ),
        },
    ),
    "Food": _Category(
        ("Ajoblanco", "Arrabbiata_sauce", "Bakso", "Bandeja_paisa", "Baked_Alaska", "Bionico"),
        "the dish",
        {
            "country": _Predicate(
                ("Spain", "Italy", "Indonesia", "Colombia", "United_States", "Mexico"),
                ("comes from {o}", "is a dish from {o}"),
                ("{s} originates from {o}.",),
            ),
            "ingredient": _Predicate(
                ("Garlic", "Tomato", "Noodle", "Avocado", "Meringue", "Granola"),
                ("contains {o}", "is made with {o}"),
                ("{o} is an ingredient of {s}.",),
            ),
            "region": _Predicate(
                ("Andalusia", "Rome", "Paisa_Region", "Guadalajara", "Java"),
                ("is a regional dish of {o}",),
                ("{s} comes from the region of {o}.",),
            ),
            "course": _Predicate(
                ("Dessert", "Main_course", "Entree"),
                ("is served as a {o}",),
                ("{s} is eaten as a {o}.",),
            ),
        },
    ),
    "Monument": _Category(
        ("11th_Mississippi_Infantry_Monument", "Baku_Turkish_Martyrs'_Memorial", "Atatürk_Monument"),
        "the monument",
        {
            "location": _Predicate(
                ("Adams_County,_Pennsylvania", "Baku", "Izmir", "Gettysburg,_Pennsylvania"),
                ("is located in {o}", "stands in {o}"),
                ("{s} can be found in {o}.",),
            ),
            "established": _Predicate(
                ("2000", "1932", "1990"), ("was established in {o}",), ("{s} was erected in {o}.",)
            ),
            "designer": _Predicate(
                ("Pietro_Canonica", "Hüseyin_Bütüner_and_Hilmi_Güner"),
                ("was designed by {o}",),
                ("{o} designed {s}.",),
            ),
            "material": _Predicate(
                ("Bronze", "Red_granite_and_white_marble"), ("is made of {o}",), ("{s} is built from {o}.",)
            ),
        },
    ),
    "University": _Category(
        ("Acharya_Institute_of_Technology", "Aarhus_University", "AWH_Engineering_College",
         "Accademia_di_Architettura_di_Mendrisio", "1_Decembrie_1918_University"),
        "the university",
        {
            "city": _Predicate(
                ("Bangalore", "Aarhus", "Kuttikkattoor", "Mendrisio", "Alba_Iulia"),
                ("is located in the city of {o}", "is based in {o}"),
                ("{s} is in {o}.",),
            ),
            "country": _Predicate(
                ("India", "Denmark", "Switzerland", "Romania"),
                ("is in {o}",),
                ("The country of {s} is {o}.",),
            ),
            "numberOfStudents": _Predicate(
                ("700", "16000", "600", "1000"), ("has {o} students",), ("{o} students attend {s}.",)
            ),
            "established": _Predicate(
                ("2000", "1928", "1996", "1991"),
                ("was established in {o}", "was founded in {o}"),
                ("{s} was founded in {o}.",),
            ),
            "academicStaffSize": _Predicate(
                ("737", "250", "100"), ("has an academic staff of {o}",), ("{s} employs {o} academic staff.",)
            ),
        },
    ),
    "WrittenWork": _Category(
        ("A_Fortress_of_Grey_Ice", "A_Glastonbury_Romance", "A_Long_Long_Way", "Aenir",
         "Alcatraz_Versus_the_Evil_Librarians"),
        "the book",
        {
            "author": _Predicate(
                ("J._V._Jones", "John_Cowper_Powys", "Sebastian_Barry", "Garth_Nix", "Brandon_Sanderson"),
                ("was written by {o}",),
                ("{o} is the author of {s}.", "{o} wrote {s}."),
            ),
            "publisher": _Predicate(
                ("Tor_Books", "Macmillan_Publishers", "Viking_Press", "Scholastic_Press"),
                ("was published by {o}",),
                ("{o} published {s}.",),
            ),
            "literaryGenre": _Predicate(
                ("Fantasy_literature", "Novel", "Science_fiction", "Alternate_history"),
                ("is a work of {o}", "belongs to the genre of {o}"),
                ("The genre of {s} is {o}.",),
            ),
            "numberOfPages": _Predicate(
                ("672", "1174", "292", "249", "320"), ("has {o} pages", "is {o} pages long"), ("{s} runs to {o} pages.",)
            ),
        },
    ),
}


def _webnlg_reference(category: str, triples: Sequence[tuple[str, str, str]], rng: random.Random) -> str:
    """A multi-sentence templated reference mentioning every object of ``triples``
    (all share one subject)."""
    schema = WEBNLG_SCHEMA[category]
    subject = entity_text(triples[0][0])
    order = list(triples)
    rng.shuffle(order)
    sentences: list[str] = []
    while order:
        take = min(len(order), rng.randint(1, 2))
        group, order = order[:take], order[take:]
        if take == 1 and rng.random() < 0.4:
            _, predicate, obj = group[0]
            template = rng.choice(schema.predicates[predicate].sentences)
            sentences.append(_sentence(template.format(s=subject, o=entity_text(obj))))
            continue
        who = subject if not sentences or rng.random() < 0.3 else schema.pronoun
        phrases = [
            rng.choice(schema.predicates[predicate].verb_phrases).format(o=entity_text(obj))
            for _, predicate, obj in group
        ]
        sentences.append(_sentence(f"{who} {_join_phrases(phrases)}"))
    return " ".join(sentences)


def make_synthetic_webnlg(
    n_sets: int, seed: int = 0, refs_per_set: tuple[int, int] = (2, 3)
) -> list[NLGExample]:
    """``n_sets`` distinct 1-4-triple sets from ``WEBNLG_SCHEMA`` (one subject each),
    with a random number in ``refs_per_set`` (inclusive) of distinct references; a
    single triple with only two wordings in the schema may get two."""
    if not isinstance(n_sets, int) or n_sets < 1:
        raise ValueError(f"n_sets must be a positive integer, got {n_sets!r}")
    low, high = _check_ref_range(refs_per_set, "refs_per_set")
    rng = random.Random(seed)
    categories = sorted(WEBNLG_SCHEMA)
    examples: list[NLGExample] = []
    seen: set[str] = set()
    for _ in range(1000 * n_sets):
        if len(examples) == n_sets:
            break
        category = rng.choice(categories)
        schema = WEBNLG_SCHEMA[category]
        subject = rng.choice(schema.subjects)
        predicates = rng.sample(sorted(schema.predicates), rng.randint(1, min(4, len(schema.predicates))))
        triples = [(subject, p, rng.choice(schema.predicates[p].values)) for p in predicates]
        source = linearise_triples(triples)
        if source in seen:
            continue
        seen.add(source)
        count = rng.randint(low, high)
        refs = _distinct_references(
            lambda r: _webnlg_reference(category, triples, r), count, min(low, 2), rng, source
        )
        examples.append(NLGExample(source=source, references=refs))
    if len(examples) < n_sets:
        raise ValueError(f"could only draw {len(examples)} distinct triple sets, asked for n_sets={n_sets}")
    return examples


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
# On-disk formats


def write_split(path: str | os.PathLike, examples: Sequence[NLGExample]) -> None:
    """JSON Lines, one ``{"source", "references"}`` object per example, written atomically."""
    lines = [
        json.dumps({"source": example.source, "references": list(example.references)}, ensure_ascii=False)
        for example in examples
    ]
    write_text(path, "".join(line + "\n" for line in lines))


def read_split(path: str | os.PathLike) -> list[NLGExample]:
    path = Path(path)
    examples: list[NLGExample] = []
    with open(path, encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{line_number}: invalid JSON: {err}") from None
            if not isinstance(record, dict) or set(record) != {"source", "references"}:
                raise ValueError(f"{path}:{line_number}: expected keys ['references', 'source'], got {record!r}")
            refs = record["references"]
            if not isinstance(refs, list):
                raise ValueError(f"{path}:{line_number}: references must be a list, got {refs!r}")
            try:
                examples.append(NLGExample(source=record["source"], references=tuple(refs)))
            except ValueError as err:
                raise ValueError(f"{path}:{line_number}: {err}") from None
    return examples


def write_e2e_refs(path: str | os.PathLike, examples: Sequence[NLGExample]) -> None:
    """The E2E challenge's multi-reference text format: each instance's references one
    per line, instances separated by one empty line (order = ``examples`` order)."""
    blocks = []
    for index, example in enumerate(examples):
        for ref in example.references:
            if "\n" in ref or "\r" in ref:
                raise ValueError(f"example {index}: reference {ref!r} contains a line break")
        blocks.append("\n".join(ref.strip() for ref in example.references))
    write_text(path, "\n\n".join(blocks) + "\n" if blocks else "")
