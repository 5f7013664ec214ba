"""Record types and formats of the data-to-text data (E2E-NLG and WebNLG 2017).

A split is a list of ``NLGExample``: one example per distinct input (the linearised
meaning representation or triple set) holding *all* of its references, because the
E2E and WebNLG evaluations score one hypothesis per input against every reference.
Training expands a split into (source, one reference) pairs with ``training_pairs``.

Here: the example record, the E2E meaning-representation syntax and slot order, the
WebNLG triple syntax and its linearisation, and the on-disk formats the stages write
(JSON Lines splits, the E2E challenge's multi-reference text file). The readers of the
official files are in ``darel.nlg.readers``, the synthetic stand-ins in
``darel.nlg.synthetic``.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from darel.io import write_text

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


# The eight slots in the order the official data writes them.
E2E_SLOT_ORDER = ("name", "eatType", "food", "priceRange", "customer rating", "area", "familyFriendly", "near")

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
# WebNLG: triples


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
    from darel import io

    path = Path(path)
    examples: list[NLGExample] = []
    try:  # bounded: a plain file within io.NLG_SPLIT_LIMIT, each line's nesting and numbers checked
        text = io.read_regular_bytes(path, io.NLG_SPLIT_LIMIT, "JSON Lines split").decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text (byte {err.start})") from None
    # Lines as a text-mode file gives them (a JSON string may hold U+2028: not a line break here).
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    for line_number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = io.safe_json_loads(line, f"{path}:{line_number}")
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
