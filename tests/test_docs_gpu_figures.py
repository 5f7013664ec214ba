"""Every GPU throughput or time figure in the documentation links its committed record (issue 52, item 4).

Read: README.md, bench/README.md and every Markdown file under docs/. A document is cut
into blocks at blank lines (a paragraph, a list, a table, a fenced block). A block states a
GPU figure when it has a number followed by images/s, tokens/s, outputs/s or GPU-hours and
it or its section's heading names a GPU (H100, H200, GPU, CUDA). Such a block must hold a Markdown link to a file of a
session's folder, ``bench/results/gpu_<date>/...``, or its section's heading line must; and
every such link must name a file that exists and that git tracks (a committed record).

A figure whose session left no record (one H100, 2026-11-25) has no file to link, so the
test refuses it: it is withdrawn from the docs, or replaced by a recorded one with its link.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FIGURE = re.compile(r"\d[\d,.]*\s*(?:images/s|tokens/s|outputs/s|GPU[- ]hours?)\b")
NAMES_A_GPU = re.compile(r"\b(?:H100|H200|GPUs?|CUDA|cuda)\b")
LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*([^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
RECORD = re.compile(r"^bench/results/gpu_\d{4}-\d{2}-\d{2}[a-z]?/[^/]+")
HEADING = re.compile(r"^#{1,6}\s")
FENCE = re.compile(r"^\s*```")


def documents(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", root / "bench/README.md", *sorted((root / "docs").rglob("*.md"))]


def blocks(text: str) -> list[tuple[int, str, str]]:
    """(first line number, block text, the heading line of its section) for each block."""
    out: list[tuple[int, str, str]] = []
    heading, start, lines, in_fence = "", 0, [], False

    def close() -> None:
        if lines:
            out.append((start, "\n".join(lines), heading))
            lines.clear()

    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            if not in_fence:
                close()
                start = number
            in_fence = not in_fence
            lines.append(line)
            if not in_fence:
                close()
            continue
        if in_fence:
            lines.append(line)
        elif not line.strip():
            close()
        elif HEADING.match(line):
            close()
            heading = line
        else:
            if not lines:
                start = number
            lines.append(line)
    close()
    return out


def record_links(text: str, md: Path, root: Path) -> list[str]:
    """The links of ``text`` that point into a GPU session's folder, relative to the root."""
    found = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        path = os.path.relpath(os.path.normpath(md.parent / target.split("#", 1)[0]), root)
        if RECORD.match(Path(path).as_posix()):
            found.append(Path(path).as_posix())
    return found


def _tracked(root: Path) -> set[str] | None:
    try:
        listed = subprocess.run(["git", "ls-files", "bench/results"], cwd=root, capture_output=True,
                                text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None  # not a git checkout: existence alone is checked
    return set(listed.splitlines())


def problems(md: Path, root: Path = ROOT, text: str | None = None, tracked: set[str] | None = None) -> list[str]:
    text = md.read_text(encoding="utf-8") if text is None else text
    where = Path(os.path.relpath(md, root)).as_posix()
    found = []
    for line, block, heading in blocks(text):
        figures = FIGURE.findall(block)
        if not figures or not (NAMES_A_GPU.search(block) or NAMES_A_GPU.search(heading)):
            continue
        links = record_links(block, md, root) + record_links(heading, md, root)
        if not links:
            shown = ", ".join(" ".join(f.split()) for f in figures)
            found.append(f"{where}:{line}: GPU figure without a record link ({shown})")
        for path in links:
            if not (root / path).is_file():
                found.append(f"{where}:{line}: linked record {path} does not exist")
            elif tracked is not None and path not in tracked:
                found.append(f"{where}:{line}: linked record {path} is not committed")
    return found


def test_every_gpu_figure_of_the_docs_links_a_committed_record():
    tracked = _tracked(ROOT)
    found = [p for md in documents() for p in problems(md, tracked=tracked)]
    assert not found, "\n".join(found)


def test_the_docs_do_state_recorded_gpu_figures():
    # The check reads something: the recorded figures kept in bench/README.md are seen and linked.
    text = (ROOT / "bench/README.md").read_text(encoding="utf-8")
    stated = [b for _, b, _ in blocks(text) if FIGURE.search(b) and NAMES_A_GPU.search(b)]
    assert len(stated) >= 3
    assert all(record_links(b, ROOT / "bench/README.md", ROOT) for b in stated)


OLD_SENTENCE = """\
## On a GPU (one H100, 2026-11-25)

kernels one by one from Python. The 2026-11-25 figures say why this is the lever: ResNet18 at
32 px ran at 10,075 images/s, ResNet18-HC at 224 px (2.6x the arithmetic per image) at 8,017,
so the small model's step is bounded by launching, not by the card.
"""

OLD_TABLE = """\
## On a GPU (one H100, 2026-11-25)

**`python bench/gpu.py --device cuda`** (50,000 synthetic CIFAR-shaped images, batch 128):

| | ResNet18 (32 px) | ResNet18-HC (dual, 224 px) |
|---|---|---|
| training step | 10,075 images/s | 8,017 images/s |
"""

OLD_ESTIMATE = """\
* **paper**: Estimated from the projected 200-epoch baselines measured on one H100 (944 s
  for ResNet18; bench/README.md, "On a GPU"): about 3.6 GPU-hours of training per seed, **about 11
  GPU-hours** for the three seeds.
"""


def test_the_withdrawn_figures_of_2026_11_25_are_refused():
    md = ROOT / "bench/README.md"
    for old, figure in ((OLD_SENTENCE, "10,075 images/s"), (OLD_TABLE, "10,075 images/s"),
                        (OLD_ESTIMATE, "11 GPU-hours")):
        found = problems(md, text=old)
        assert len(found) == 1 and figure in found[0], found
    assert problems(ROOT / "docs/profiles.md", text=OLD_ESTIMATE)[0].startswith("docs/profiles.md:1:")


def test_a_figure_with_its_record_link_passes_and_a_missing_record_fails():
    md = ROOT / "bench/README.md"
    linked = OLD_SENTENCE.replace("by the card.", "by the card ([record](results/gpu_2026-11-28/gpu_bench.txt)).")
    assert problems(md, text=linked) == []
    in_heading = "## On one H100 ([record](results/gpu_2026-11-28/README.md))\n\nA step at 31,180 images/s.\n"
    assert problems(md, text=in_heading) == []
    missing = OLD_SENTENCE.replace("by the card.", "by the card ([record](results/gpu_2026-11-25/gpu_bench.txt)).")
    found = problems(md, text=missing)
    assert len(found) == 1 and "does not exist" in found[0], found
    not_a_record = OLD_SENTENCE.replace("by the card.", "by the card ([sessions](results/gpu_sessions.md)).")
    assert "without a record link" in problems(md, text=not_a_record)[0]
    untracked = problems(md, text=linked, tracked=set())
    assert len(untracked) == 1 and "not committed" in untracked[0], untracked


def test_cpu_figures_and_gpu_prose_without_figures_are_not_gpu_figures():
    md = ROOT / "bench/README.md"
    cpu = "| tiny GPT-2 on 2 CPU cores | 19,600 tokens/s | 29.6 outputs/s |\n"
    prose = "Timings need a GPU: run with --device cuda.\n\nOn a CPU: 27.3 outputs/s.\n"
    assert problems(md, text=cpu) == [] and problems(md, text=prose) == []
