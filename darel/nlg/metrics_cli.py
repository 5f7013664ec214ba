"""``darel-nlg-metrics``: score generated text with the E2E NLG Challenge metric suite.

Usage::

    darel-nlg-metrics --refs REFS --hyp HYP [--variants] [--workers N] [--no-progress]

REFS is the E2E challenge plain-text format: one reference per line, the
instances separated by one empty line (a file without any empty line holds one
reference per instance, as the official scorer reads it).  HYP holds one output
per line; an empty line is an (empty) output.  Lines are stripped of
surrounding whitespace, as the official scorer does; a leading UTF-8 byte
order mark is ignored.

Prints one JSON object on stdout: BLEU, NIST, METEOR, ROUGE_L, CIDEr, TER (see
:mod:`darel.nlg.metrics` for scales), plus the paper-scale variant keys with
``--variants``.  A progress bar runs on stderr when stderr is a terminal.  Any input problem prints one message naming the file (and the
line where there is one) on stderr and exits with status 2, printing nothing
on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from darel.nlg.metrics import MetricError, score_all

__all__ = ["InputFileError", "read_refs", "read_hyps", "main"]


class InputFileError(MetricError):
    """A reference or hypothesis file that cannot be used."""


def _read_lines(path: str | os.PathLike) -> list[str]:
    """Decoded, stripped lines of a UTF-8 text file (line numbers start at 1)."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise InputFileError(f"{p}: file not found") from None
    except IsADirectoryError:
        raise InputFileError(f"{p}: is a directory, not a file") from None
    except OSError as exc:
        raise InputFileError(f"{p}: cannot read: {exc.strerror or exc}") from None
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        for number, raw in enumerate(data.split(b"\n"), start=1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InputFileError(
                    f"{p}: line {number}: not valid UTF-8 (byte 0x{raw[exc.start]:02x} at column "
                    f"{exc.start + 1})") from None
        raise InputFileError(f"{p}: not valid UTF-8") from None
    # str.splitlines breaks lines where Python's codecs line reader (used by the
    # official scorer) does.
    return [line.strip() for line in text.splitlines()]


def read_hyps(path: str | os.PathLike) -> list[str]:
    """One hypothesis per line; empty lines are kept as empty hypotheses."""
    lines = _read_lines(path)
    if not lines:
        raise InputFileError(f"{Path(path)}: hypothesis file is empty (no lines)")
    return lines


def read_refs(path: str | os.PathLike) -> list[list[str]]:
    """References grouped per instance (E2E multi-reference plain-text format).

    Empty lines separate instances; trailing empty lines are ignored.  A file
    with no empty line at all is read as one reference per instance, as the
    official scorer does.  Two consecutive empty lines (or an empty line
    before the first reference) would make an instance without references:
    that is an error naming the line.
    """
    p = Path(path)
    lines = _read_lines(p)
    while lines and not lines[-1]:
        lines.pop()
    if not lines:
        raise InputFileError(f"{p}: reference file has no references")
    if all(lines):
        return [[line] for line in lines]
    groups: list[list[str]] = [[]]
    for number, line in enumerate(lines, start=1):
        if line:
            groups[-1].append(line)
            continue
        if not groups[-1]:
            where = "before the first reference" if len(groups) == 1 else "after another empty line"
            raise InputFileError(
                f"{p}: line {number}: empty line {where} leaves instance {len(groups)} with no "
                f"references")
        groups.append([])
    return groups


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="darel-nlg-metrics",
        description="Score system outputs with the E2E NLG Challenge metrics "
                    "(BLEU, NIST, METEOR, ROUGE_L, CIDEr) plus TER; prints one JSON object.")
    ap.add_argument("--refs", required=True,
                    help="references: one per line, instances separated by an empty line")
    ap.add_argument("--hyp", required=True, help="system outputs: one per line")
    ap.add_argument("--variants", action="store_true",
                    help="also report the paper-scale variants (METEOR_nltk_exact_x100, "
                         "METEOR_sentavg_x100, NIST_nltk, NIST_sentavg)")
    ap.add_argument("--workers", type=int, default=1,
                    help="processes for TER (default 1; METEOR already runs beside it in Java)")
    ap.add_argument("--no-progress", action="store_true",
                    help="no progress bar (it is shown on stderr only when stderr is a terminal)")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        refs = read_refs(args.refs)
        hyps = read_hyps(args.hyp)
        if len(refs) != len(hyps):
            raise InputFileError(
                f"instance count mismatch: {args.refs} has {len(refs)} reference instances but "
                f"{args.hyp} has {len(hyps)} hypothesis lines")
        if args.workers < 1:
            raise MetricError(f"--workers must be a positive integer, got {args.workers}")
        scores = score_all(hyps, refs, variants=args.variants, workers=args.workers,
                           progress=False if args.no_progress else None)
    except MetricError as exc:
        print(f"darel-nlg-metrics: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(scores))
    return 0


if __name__ == "__main__":
    sys.exit(main())
