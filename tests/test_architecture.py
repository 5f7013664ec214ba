"""docs/architecture.md names every module of the package and every stage, and nothing
that is not there."""

from __future__ import annotations

import re

from tests.conftest import ROOT

# The text without its fenced diagram (whose ``` would pair the wrong backticks).
DOC = re.sub(r"^```.*?^```", "", (ROOT / "docs/architecture.md").read_text(encoding="utf-8"),
             flags=re.MULTILINE | re.DOTALL)
NAMED = set(re.findall(r"`([^`]+)`", DOC))


def _mentioned(module) -> bool:
    """``darel/x.py`` by its path; a module of a subpackage by its stem in backticks beside
    the path of a package it lies in (`darel/measure/`: `memory`, `timing`, ...)."""
    rel = module.relative_to(ROOT).as_posix()
    parents = ["/".join(module.relative_to(ROOT).parts[:depth]) + "/" for depth in range(2, len(module.parts))]
    return rel in NAMED or (module.stem in NAMED and any(parent in NAMED for parent in parents))


def test_the_module_map_names_every_module_and_stage():
    modules = sorted(p for p in (ROOT / "darel").rglob("*.py") if p.name != "__init__.py")
    missing = [p.relative_to(ROOT).as_posix() for p in modules if not _mentioned(p)]
    assert not missing, f"docs/architecture.md does not name: {missing}"
    stages = sorted(p.stem for p in (ROOT / "stages").glob("*.py"))
    paragraph = DOC[DOC.index("**Stages**"):DOC.index("**What runs**")]
    assert not [s for s in stages if f"`{s}`" not in paragraph], "stages missing from the Stages paragraph"


def test_every_path_the_module_map_names_exists():
    paths = [name for name in NAMED if re.fullmatch(r"(darel|stages|workflow|examples)/[\w/.*-]+", name)]
    assert len(paths) > 20
    missing = [p for p in paths if "*" not in p and not (ROOT / p.rstrip("/")).exists()]
    assert not missing, f"docs/architecture.md names what is not in the project: {missing}"
    stages = re.findall(r"`(\w+)`", DOC[DOC.index("**Stages**"):DOC.index("`darel/tools/`")])
    assert not [s for s in stages if not (ROOT / f"stages/{s}.py").exists()]
