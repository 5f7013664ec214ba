"""Every link, file path and section reference in the documentation resolves (issue 51).

Read: README.md, bench/README.md, every Markdown file under docs/, and the comments of
params.yaml (paths and section references only). Checked in each:

* Markdown links and images ``[text](target)`` that are not URLs (http, https, mailto):
  the target, without its ``#anchor``, exists relative to the Markdown file; an anchor
  names a heading of the file it points into (GitHub's slug: markup dropped, lowercase,
  punctuation other than '-' and '_' dropped, spaces to '-', '-1', '-2' ... for repeats).
* Repository paths, in inline code, in fenced blocks (each whitespace-separated word of a
  command) and in prose: a path starting with one of SOURCE_FOLDERS and a '/' exists
  relative to the repository root or to the Markdown file's folder (bench/README.md says
  ``results/...`` for bench/results/); a glob (``stages/*.py``) matches at least one file;
  a pytest node id (``tests/test_x.py::test_y``) names a test function defined in that
  file; in inline code, a bare file name with a source extension (``params.yaml``,
  ``Snakefile``, ``table1.smk``) is the name of some file of the repository, unless
  OTHER_PROJECTS_NAMES or BUILD_OUTPUT_NAMES lists it.
* Section references ``docs/studies.md, "Headline"``: the quoted name begins a heading
  of that file or the bold lead-in of one of its paragraphs or list items
  (``* **Compiled against eager, before training.**``).

Exempt, because they exist only after a build or only on the reader's machine: paths whose
first folder is one of BUILD_OUTPUT_FOLDERS (results/, runs/, data/, logs/, mlartifacts/,
...) unless they resolve beside the Markdown file, and files named in BUILD_OUTPUT_NAMES
(dvc.lock, mlflow.db, ...); paths with placeholders (``<profile>``, ``{train,test}``,
``...``, ``$VAR``, ``[--option]``), which name no single file. Paths outside the
repository (``~/.config/...``, ``/nfs/...``, URLs) are not read.

The test lists every failure in one assertion message, one ``file:line: target (why)``
each.
"""

from __future__ import annotations

import glob
import os
import re
from pathlib import Path

import pytest

from tests.conftest import ROOT

# Folders of the repository whose paths a document may name and that must then exist.
SOURCE_FOLDERS = ("darel", "stages", "workflow", "tests", "tests_ui", "bench", "docs", "profiles",
                  "examples", "studies", ".test", ".ci")
# Folders and files that a build, a run or the reader creates: named in the docs, absent
# from a clone.
BUILD_OUTPUT_FOLDERS = ("results", "runs", "data", "logs", "mlartifacts", "dvc_plots", ".snakemake",
                        ".venv", "gpu-kit")
BUILD_OUTPUT_NAMES = ("dvc.lock", "mlflow.db", "mlflow.db.lock",
                      "summary.md")  # what bench/gpu_session.sh writes into its output folder
OTHER_PROJECTS_NAMES = ("measure_scores.py",)  # the official E2E scorer's script
SOURCE_EXTENSIONS = ("py", "smk", "yaml", "yml", "toml", "lock", "sh", "md", "cfg", "ini")
TOP_LEVEL_NAMES = ("Snakefile", "Makefile")
PLACEHOLDER = re.compile(r"[<>{}$\[\]]|\.\.\.|…")

_FOLDERS = "|".join(re.escape(f) for f in SOURCE_FOLDERS + BUILD_OUTPUT_FOLDERS)
# A path as a whole word of inline code or of a command (placeholders allowed, filtered later).
CODE_PATH = re.compile(rf"^(?:\./)?(?:{_FOLDERS})/\S*$")
# A path in prose: plain characters only, ending on a letter, digit or '/' (not on a full stop).
PROSE_PATH = re.compile(rf"(?<![\w/.~-])(?:{_FOLDERS})/[\w./*-]*[\w/*]")
BARE_FILE = re.compile(rf"^[A-Za-z0-9][\w.-]*\.(?:{'|'.join(SOURCE_EXTENSIONS)})$|^(?:{'|'.join(TOP_LEVEL_NAMES)})$")
LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*([^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
SECTION_REFERENCE = re.compile(r"([\w./-]+\.md)`?\)?,\s+\"([^\"]{1,160})\"")
FENCE = re.compile(r"^[ \t]*```[^\n]*\n.*?^[ \t]*```[ \t]*$", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"(?<!`)`([^`]+?)`(?!`)")
URL = re.compile(r"^(?:https?|mailto|ftp):", re.IGNORECASE)


def documents(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", root / "bench/README.md", *sorted((root / "docs").rglob("*.md")),
            root / "params.yaml"]


def yaml_comments(text: str) -> str:
    """The comments of a YAML file, everything else blanked (offsets and lines kept)."""
    return "\n".join(re.sub(r"^(.*?)((?:^|\s)#.*)?$", lambda m: " " * len(m.group(1)) + (m.group(2) or ""), line)
                     for line in text.split("\n"))


# ---- reading a Markdown file ----------------------------------------------------------

def _blank(match: re.Match) -> str:
    """The matched text with every character but its newlines turned into spaces, so that
    offsets, and with them line numbers, stay those of the file."""
    return re.sub(r"[^\n]", " ", match.group())


def _line(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def heading_texts(text: str) -> list[str]:
    """The text of every ATX heading outside fenced blocks, as written (markup kept)."""
    prose = FENCE.sub(_blank, text)
    return [m.group(1) for m in re.finditer(r"^#{1,6}[ \t]+(.*?)[ \t#]*$", prose, flags=re.MULTILINE)]


def bold_lead_ins(text: str) -> list[str]:
    """The bold text that opens a paragraph or a list item: a named part of a section."""
    prose = FENCE.sub(_blank, text)
    return re.findall(r"^[ \t]*(?:[*+-][ \t]+)?\*\*([^*\n]+)\*\*", prose, flags=re.MULTILINE)


def _plain(heading: str) -> str:
    """A heading's visible text: code marks and emphasis dropped, link texts kept, white
    space as one space."""
    heading = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    return " ".join(re.sub(r"[`*]", "", heading).split())


def slug(heading: str) -> str:
    """GitHub's anchor of a heading (before the '-1', '-2' of repeats)."""
    text = _plain(heading).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    result = set()
    for heading in heading_texts(text):
        base = slug(heading)
        count = seen.get(base, 0)
        result.add(base if count == 0 else f"{base}-{count}")
        seen[base] = count + 1
    return result


# ---- what must exist -------------------------------------------------------------------

def _repository_file_names(root: Path) -> set[str]:
    names = set()
    for folder, subfolders, files in os.walk(root):
        here = Path(folder)
        subfolders[:] = [d for d in subfolders
                         if not (here == root and d in BUILD_OUTPUT_FOLDERS) and d not in (".git", "__pycache__")
                         and not (d.startswith(".") and d not in SOURCE_FOLDERS)]
        names.update(files)
    return names


def _path_problem(path: str, md: Path, root: Path) -> str | None:
    """Why a repository path named in `md` does not resolve, or None when it does or is exempt."""
    if PLACEHOLDER.search(path):
        return None
    path = path[2:] if path.startswith("./") else path
    file_part, _, test_name = path.partition("::")
    if not test_name:
        file_part = file_part.split(":", 1)[0]  # `studies/dvc.yaml:study_table1` names a stage
    bases = (root, md.parent)
    if any(ch in file_part for ch in "*?"):
        if any(glob.glob(str(base / file_part), recursive=True) for base in bases):
            return None
        found = None
    else:
        found = next((base / file_part for base in bases if (base / file_part).exists()), None)
    if found is None:
        if file_part.split("/", 1)[0] in BUILD_OUTPUT_FOLDERS or Path(file_part).name in BUILD_OUTPUT_NAMES:
            return None
        return "no such file or folder"
    if test_name and not re.search(rf"^(?:async )?def {re.escape(test_name)}\(", found.read_text(encoding="utf-8"),
                                   flags=re.MULTILINE):
        return f"{found.relative_to(root)} defines no {test_name}"
    return None


def _link_problem(target: str, md: Path, root: Path) -> str | None:
    if URL.match(target):
        return None
    file_part, _, anchor = target.partition("#")
    linked = (md.parent / file_part) if file_part else md
    if not linked.exists():
        return "no such file or folder"
    if anchor and linked.suffix == ".md" and anchor not in anchors(linked.read_text(encoding="utf-8")):
        return f"no heading of {linked.resolve().relative_to(root.resolve())} has the anchor #{anchor}"
    return None


def _code_words(code: str) -> list[str]:
    """The words of a code span or command that may be paths, stripped of quotes and of
    punctuation around them."""
    return [word.strip("'\"(),;") for word in code.split()]


def problems(md: Path, root: Path = ROOT) -> list[str]:
    """One 'file:line: target (why)' for every link, path or section reference of `md`
    that does not resolve (of a YAML file: of its comments)."""
    text = md.read_text(encoding="utf-8")
    if md.suffix in (".yaml", ".yml"):
        text = yaml_comments(text)
    name = md.relative_to(root)
    found: list[tuple[int, str, str]] = []

    def check(offset: int, target: str, why: str | None) -> None:
        if why:
            found.append((_line(text, offset), target, why))

    # Fenced blocks: every word of a command.
    for block in FENCE.finditer(text):
        for match in re.finditer(r"\S+", block.group()):
            word = _code_words(match.group())[0]
            if CODE_PATH.match(word):
                check(block.start() + match.start(), word, _path_problem(word, md, root))
    prose = FENCE.sub(_blank, text)

    # Inline code: whole paths, the words of commands, bare source file names.
    file_names = _repository_file_names(root)
    for span in INLINE_CODE.finditer(prose):
        for word in _code_words(span.group(1)):
            if CODE_PATH.match(word):
                check(span.start(), word, _path_problem(word, md, root))
            elif BARE_FILE.match(word) and word not in BUILD_OUTPUT_NAMES + OTHER_PROJECTS_NAMES:
                if word not in file_names:
                    check(span.start(), word, "no file of the repository has this name")

    # Links (outside code) and paths in prose.
    prose = INLINE_CODE.sub(_blank, prose)
    for link in LINK.finditer(prose):
        check(link.start(1), link.group(1), _link_problem(link.group(1), md, root))
    prose = LINK.sub(lambda m: m.group().replace(m.group(1), " " * len(m.group(1))), prose)
    for path in PROSE_PATH.finditer(prose):
        check(path.start(), path.group(), _path_problem(path.group(), md, root))

    # Section references: `file.md, "Heading"` (the quoted name may carry code marks).
    for ref in SECTION_REFERENCE.finditer(FENCE.sub(_blank, text)):
        file_name, section = ref.groups()
        referenced = next((base / file_name for base in (root, md.parent) if (base / file_name).is_file()), None)
        if referenced is None:
            continue  # a missing file is reported as a path or a link above
        wanted = _plain(section)
        referenced_text = referenced.read_text(encoding="utf-8")
        names = heading_texts(referenced_text) + bold_lead_ins(referenced_text)
        if not any(re.match(rf"{re.escape(wanted)}(?!\w)", _plain(name)) for name in names):
            check(ref.start(2), f'{file_name}, "{wanted}"', "no heading or bold lead-in begins with this name")

    return [f"{name}:{line}: {target} ({why})" for line, target, why in sorted(set(found))]


# ---- the tests -------------------------------------------------------------------------

def test_every_link_path_and_section_reference_of_the_docs_resolves():
    failures = [problem for md in documents() for problem in problems(md)]
    assert not failures, f"{len(failures)} links or paths in the docs do not resolve:\n" + "\n".join(failures)


def test_the_documents_read_are_the_readme_bench_and_all_of_docs():
    names = {str(md.relative_to(ROOT)) for md in documents()}
    assert {"README.md", "bench/README.md", "docs/studies.md", "docs/architecture.md"} <= names
    assert any(name.startswith("docs/studies/") for name in names)  # recursive


def test_slugs_follow_githubs_rule():
    assert slug("How long it takes") == "how-long-it-takes"
    assert slug("On a GPU (one H100, 2026-11-25)") == "on-a-gpu-one-h100-2026-11-25"
    assert (slug("Beam search's key/value cache (issue 52, item 5): `python bench/beam_cache.py`")
            == "beam-searchs-keyvalue-cache-issue-52-item-5-python-benchbeam_cachepy")
    assert anchors("# A\n## A\n```sh\n# not a heading\n```\n### a\n") == {"a", "a-1", "a-2"}


def linked_pages(md: Path) -> set[Path]:
    """The files the Markdown links of `md` point to (outside code), resolved."""
    prose = INLINE_CODE.sub(_blank, FENCE.sub(_blank, md.read_text(encoding="utf-8")))
    return {(md.parent / target.partition("#")[0]).resolve()
            for target in LINK.findall(prose) if not URL.match(target) and not target.startswith("#")}


def unlisted_study_pages(root: Path = ROOT) -> list[str]:
    """The pages under docs/studies/ that the index docs/studies.md does not link: every
    study, pilot and declaration has a page and a row in the index (issue 51). The verdict
    files the study stage writes there (`*_verdicts.md`) are a study page's files, linked
    from it."""
    linked = linked_pages(root / "docs/studies.md")
    return [str(page.relative_to(root)) for page in sorted((root / "docs/studies").glob("*.md"))
            if not page.name.endswith("_verdicts.md") and page.resolve() not in linked]


def test_the_studies_index_links_every_study_page():
    assert unlisted_study_pages() == []
    pages = [page for page in (ROOT / "docs/studies").glob("*.md") if not page.name.endswith("_verdicts.md")]
    assert len(pages) >= 6  # the five quick studies and the fit-regime declaration at least


def test_every_verdict_file_is_linked_from_a_study_page():
    pages = [page for page in (ROOT / "docs/studies").glob("*.md") if not page.name.endswith("_verdicts.md")]
    linked = set().union(*(linked_pages(page) for page in pages))
    unlinked = [verdicts.name for verdicts in sorted((ROOT / "docs/studies").glob("*_verdicts.md"))
                if verdicts.resolve() not in linked]
    assert unlinked == []


def test_an_unlisted_study_page_is_named(project):
    (project / "docs/studies").mkdir()
    for name in ("a.md", "b.md", "a_verdicts.md"):
        (project / "docs/studies" / name).write_text("# page\n")
    (project / "docs/studies.md").write_text("# Studies\n\n[a](studies/a.md#page), `[b](studies/b.md)`\n")
    assert unlisted_study_pages(project) == ["docs/studies/b.md"]
    (project / "docs/studies.md").write_text("# Studies\n\n[a](studies/a.md) [b](studies/b.md)\n")
    assert unlisted_study_pages(project) == []


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A tiny repository: a package module, a test file, a docs folder and a bench README."""
    (tmp_path / "darel").mkdir()
    (tmp_path / "darel/budget.py").write_text("x = 1\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests/test_budget.py").write_text("def test_plan():\n    pass\n")
    (tmp_path / "params.yaml").write_text("profile: quick\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs/guide.md").write_text("# Guide\n\n## Power and seeds (issue 9)\n\n"
                                            "* **Compiled against eager, before training.** text\n")
    (tmp_path / "bench/results").mkdir(parents=True)
    (tmp_path / "bench/results/run.md").write_text("figures\n")
    return tmp_path


def _problems_of(project: Path, text: str, where: str = "README.md") -> list[str]:
    md = project / where
    md.write_text(text)
    return problems(md, root=project)


def test_what_resolves_or_is_exempt_is_no_problem(project):
    text = """# Title

[guide](docs/guide.md), [its section](docs/guide.md#power-and-seeds-issue-9), [here](#title),
[site](https://example.org/x), `darel/budget.py`, `darel/`, `darel/*.py`, `params.yaml`,
`tests/test_budget.py::test_plan`, `python -m pytest tests/test_budget.py`,
`results/table1.csv`, `runs/<profile>/x.pt`, `data/{train,test}.npz`, `darel/.../x.py`,
`dvc.lock`, `studies/dvc.lock`, (docs/guide.md, "Power and seeds"), darel/budget.py in prose,
docs/guide.md, "Compiled against
eager".

```sh
python darel/budget.py --out results/x.csv
```
"""
    assert _problems_of(project, text) == []
    # bench/README.md names bench/results/ as results/: resolved beside the file.
    assert _problems_of(project, "[run](results/run.md) and results/run.md\n", "bench/README.md") == []
    # Of params.yaml only the comments are read.
    assert _problems_of(project, "a: docs/gone.md  # b (docs/guide.md, \"Power and seeds\")\n", "params.yaml") == []


def test_every_broken_link_path_and_reference_is_listed_with_its_line(project):
    text = """# Title

[gone](docs/gpu.md) and [bad anchor](docs/guide.md#power) and [here](#no-such-heading)
`darel/budgets.py` `stages/*.py` `tests/test_budget.py::test_gone` `Makefile`
`python bench/gpu.py --quick` (docs/guide.md, "Power and seed counts"), prose bench/README.md.

```sh
python examples/own_loop.py --tiny
```
"""
    assert _problems_of(project, text) == [
        "README.md:3: #no-such-heading (no heading of README.md has the anchor #no-such-heading)",
        "README.md:3: docs/gpu.md (no such file or folder)",
        "README.md:3: docs/guide.md#power (no heading of docs/guide.md has the anchor #power)",
        "README.md:4: Makefile (no file of the repository has this name)",
        "README.md:4: darel/budgets.py (no such file or folder)",
        "README.md:4: stages/*.py (no such file or folder)",
        "README.md:4: tests/test_budget.py::test_gone (tests/test_budget.py defines no test_gone)",
        'README.md:5: bench/README.md (no such file or folder)',
        'README.md:5: bench/gpu.py (no such file or folder)',
        'README.md:5: docs/guide.md, "Power and seed counts" (no heading or bold lead-in begins with this name)',
        "README.md:8: examples/own_loop.py (no such file or folder)",
    ]
    assert _problems_of(project, "# docs/guide.md\nmodel: resnet  # its card: docs/gpu.md\n", "params.yaml") == [
        "params.yaml:2: docs/gpu.md (no such file or folder)"]
