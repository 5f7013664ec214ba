"""docs/architecture.md names every module of the package and every stage, and nothing
that is not there."""

from __future__ import annotations

import ast
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


# ---- Floors: no module imports a module on a higher floor, and no import circle ----

FLOOR_ROW = re.compile(r"^\| `(darel/[\w/.]+)` \| (\d+) \|$", re.MULTILINE)
FLOOR_SENTENCE = re.compile(r"^\* Floor (\d+), ", re.MULTILINE)


def _floors() -> dict[str, int]:
    """The floor of every path row of docs/architecture.md's table (``darel/x.py`` or ``darel/x/``)."""
    rows = FLOOR_ROW.findall(DOC)
    assert rows, "docs/architecture.md has no floor table"
    floors = {}
    for path, floor in rows:
        assert path not in floors, f"docs/architecture.md gives {path} two floors"
        floors[path] = int(floor)
    return floors


def _modules() -> dict[str, str]:
    """Dotted name -> path relative to the root, for every module of the package."""
    modules = {}
    for path in sorted((ROOT / "darel").rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path.relative_to(ROOT).as_posix()
    return modules


def _imports(source: str, modules: dict[str, str]) -> list[tuple[int, str]]:
    """(line, module) of every darel import in ``source``: top-level, in functions, under
    TYPE_CHECKING, and importlib.import_module of a written-out name. ``from a import b``
    imports ``a.b`` when that is a module, else ``a``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.split(".")[0] == "darel"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "darel":
            for alias in node.names:
                inner = f"{node.module}.{alias.name}"
                found.append((node.lineno, inner if inner in modules else node.module))
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and node.args[0].value.split(".")[0] == "darel"):
            found.append((node.lineno, node.args[0].value))
    return found


def _row_of(path: str, floors: dict[str, int]) -> str | None:
    """The most specific row covering ``path``: its own, else the nearest folder's."""
    if path in floors:
        return path
    parts = path.split("/")
    for depth in range(len(parts) - 1, 0, -1):
        folder = "/".join(parts[:depth]) + "/"
        if folder in floors:
            return folder
    return None


def _graph() -> tuple[dict[str, str], dict[str, list[tuple[int, str]]]]:
    modules = _modules()
    edges = {name: [(line, target) for line, target in _imports((ROOT / path).read_text(encoding="utf-8"), modules)
                    if target in modules]
             for name, path in modules.items()}
    return modules, edges


def _circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one node, or a node importing itself (Tarjan)."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1 or node in edges.get(node, ()):
                groups.append(sorted(group))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return groups


def test_every_module_has_a_floor_and_every_floor_a_sentence():
    floors = _floors()
    missing = [path for path in _modules().values() if _row_of(path, floors) is None]
    assert not missing, f"no floor in docs/architecture.md for: {missing}"
    stale = [path for path in floors if not (ROOT / path.rstrip("/")).exists()]
    assert not stale, f"docs/architecture.md gives a floor to what is not in the package: {stale}"
    described = {int(floor) for floor in FLOOR_SENTENCE.findall(DOC)}
    assert set(floors.values()) <= described, f"floors without their sentence: {set(floors.values()) - described}"


def test_no_module_imports_from_a_higher_floor():
    floors = _floors()
    modules, edges = _graph()
    upward = []
    for name, path in modules.items():
        here = floors[_row_of(path, floors)]
        for line, target in edges[name]:
            there = floors[_row_of(modules[target], floors)]
            if there > here:
                upward.append(f"{path}:{line} (floor {here}) imports {target} (floor {there})")
    assert not upward, "upward imports:\n" + "\n".join(upward)


def test_no_import_circle():
    """Between modules, and between the rows of the floor table (a folder is one node there)."""
    floors = _floors()
    modules, edges = _graph()
    module_edges = {name: {target for _, target in found} for name, found in edges.items()}
    row_edges: dict[str, set[str]] = {}
    for name, targets in module_edges.items():
        row = _row_of(modules[name], floors)
        row_edges.setdefault(row, set()).update(
            _row_of(modules[t], floors) for t in targets if _row_of(modules[t], floors) != row)
    circles = [" -> ".join(group) for group in _circles(module_edges) + _circles(row_edges)]
    assert not circles, "import circles:\n" + "\n".join(circles)


# ---- Short functions ----

LONG_BECAUSE = "Long because"
MAX_LINES = 80


def _long_functions_in(source: str, where: str) -> list[str]:
    """``where:line name (n lines)`` of every function or method of ``source`` over MAX_LINES
    lines whose docstring has no line starting with LONG_BECAUSE."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        lines = node.end_lineno - node.lineno + 1
        doc = ast.get_docstring(node) or ""
        if lines > MAX_LINES and not any(line.strip().startswith(LONG_BECAUSE) for line in doc.splitlines()):
            found.append(f"{where}:{node.lineno} {node.name} ({lines} lines)")
    return found


def _long_functions() -> list[str]:
    return [line for path in sorted((ROOT / "darel").rglob("*.py"))
            for line in _long_functions_in(path.read_text(encoding="utf-8"), path.relative_to(ROOT).as_posix())]


def test_the_floor_and_length_checks_can_fail(tmp_path):
    """The parsers behind the tests, on made-up sources: an import inside a function or under
    TYPE_CHECKING is found, and so are a circle and a function one line too long (not one
    whose docstring says why)."""
    modules = {"darel.a": "darel/a.py", "darel.b": "darel/b.py", "darel.b.c": "darel/b/c.py"}
    source = "import os\nfrom darel.b import c\ndef f():\n    from darel import a\n    import darel.b\n" \
             "if TYPE_CHECKING:\n    from darel.a import thing\nimportlib.import_module('darel.b')\n"
    assert _imports(source, modules) == [(2, "darel.b.c"), (4, "darel.a"), (5, "darel.b"), (7, "darel.a"),
                                         (8, "darel.b")]
    assert _circles({"x": {"y"}, "y": {"z"}, "z": {"x"}, "w": {"x"}}) == [["x", "y", "z"]]
    assert _circles({"x": {"y"}, "y": set()}) == []
    assert _row_of("darel/b/c.py", {"darel/b/": 3, "darel/a.py": 0}) == "darel/b/"
    assert _row_of("darel/b/c.py", {"darel/b/": 3, "darel/b/c.py": 1}) == "darel/b/c.py"
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_LINES - 2))
    assert _long_functions_in(f'def short():\n    "Fine."\n{body}', "m.py") == []  # exactly MAX_LINES lines
    assert _long_functions_in(f'def long():\n    "Too long."\n{body}    return 0\n', "m.py") == [
        f"m.py:1 long ({MAX_LINES + 1} lines)"]
    method = f'class C:\n    def long(self):\n        "Does a lot.\\n{LONG_BECAUSE} of a reason."\n'
    assert _long_functions_in(method + body.replace("    ", "        ") + "        return 0\n", "m.py") == []


def test_no_function_is_over_80_lines_without_saying_why():
    long = _long_functions()
    assert not long, (f"functions over {MAX_LINES} lines without a docstring line starting "
                      f"{LONG_BECAUSE!r}:\n" + "\n".join(long))
