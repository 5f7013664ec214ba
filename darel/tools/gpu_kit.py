"""The GPU kit: the wheels a Table 1 run and the GPU benchmarks need that a lent GPU machine
lacks, downloaded here for that machine's Python, so they travel with the working tree.

The lent machine (docs: bench/README.md, "On a GPU") has Python 3.12 on x86-64 with torch,
transformers, peft, pandas, scipy, matplotlib, numpy, nvidia-ml-py and psutil installed,
and reaches no package index. What it lacks (Snakemake, MLflow's tracking client with its
SQLite store, codecarbon, ...) is derived here, not listed by hand:

* ``RUN_NEEDS``: the distributions a run imports that the image does not bring;
* ``IMAGE_HAS``: what the image brings;
* the kit is the dependency closure of ``RUN_NEEDS`` minus the closure of ``IMAGE_HAS``,
  both read from the installed metadata of the project's virtual environment (made from
  requirements.lock), markers evaluated for the target Python; every version is the
  one requirements.lock pins (one source of truth);
* the *spares* are the kit's dependencies that the image is only assumed to have (they
  are in the closure of ``IMAGE_HAS`` as requirements.lock resolves it, but the image was
  resolved on another day): their wheels travel too, and pip takes one only when the
  image lacks that package or has a version the kit cannot use.

Some wheels are thinned (``THIN``): PuLP bundles its CBC solver for six platforms, of
which only Linux x86-64 can run there; pycountry carries translations that codecarbon
never reads. A thinned wheel drops those files and their RECORD lines, nothing else.

``python -m darel.tools.gpu_kit --dest gpu-kit`` (``make gpu-kit``) writes the wheels,
``requirements.txt`` (the kit's pins: what the GPU script installs), ``manifest.json``
and prints the size report. ``--python-version 3.11 --platform-tags native`` makes the
same kit for this machine (the twin the tests install offline).
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Callable, Iterable, Mapping

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "requirements.lock"
TREE_LIMIT_BYTES = 64 * 2**20  # what travels to the GPU machine: working tree + carried paths
KIT_BUDGET_BYTES = 52 * 2**20  # the kit plus the project's tree must stay well inside that

# What the GPU image brings (the issue, and the package list seen on such a machine).
IMAGE_HAS = ("torch", "transformers", "peft", "pandas", "scipy", "matplotlib", "numpy", "nvidia-ml-py", "psutil",
             "accelerate", "huggingface-hub", "safetensors", "tokenizers")

# What a Table 1 run (and bench/gpu.py, bench/nlg.py) imports beyond the image.
RUN_NEEDS = (
    "snakemake",
    "mlflow-skinny",  # darel.tracking's MlflowClient; the skinny package holds the SQLite store's code
    "sqlalchemy",     # ... which needs these two for sqlite:///mlflow.db
    "alembic",
    "codecarbon",     # darel.measure.energy: the offline tracker (NVML energy on a GPU)
    "jsonschema",     # darel.config, darel.provenance
    "pyyaml",
    "tqdm",
    "scikit-learn",   # darel.ids (IDS + ADONIS row: k-means)
)

# Tables 2/3's metric suite finds pycocoevalcap (about 100 MB with its METEOR and SPICE jars,
# which need Java) by path, not by import: it is not in the kit, so the GPU machine builds
# Table 1 and runs the benchmarks, not Tables 2/3's scores.

# Files dropped from a wheel (path prefixes inside it).
THIN = {
    "pulp": ("pulp/solverdir/cbc/osx/", "pulp/solverdir/cbc/win/", "pulp/solverdir/cbc/linux/i32/",
             "pulp/solverdir/cbc/linux/arm64/"),
    "pycountry": ("pycountry/locales/",),
}

# manylinux tags a Python 3.12 x86-64 machine with a recent glibc accepts (pip matches
# each --platform exactly, so name the usual ones).
MANYLINUX = tuple(f"manylinux_2_{n}_x86_64" for n in (17, 24, 26, 27, 28, 31, 34, 35, 38, 39)) + (
    "manylinux2014_x86_64", "manylinux1_x86_64")

_SPLIT = re.compile(r"[-_.]+")


def canonical(name: str) -> str:
    return _SPLIT.sub("-", name).lower()


def read_lock(path: Path = LOCK) -> dict[str, tuple[str, str]]:
    """{canonical name: (name as written, version)} of requirements.lock."""
    pins = {}
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        if not sep:
            raise ValueError(f"{path}: not an exact pin: {raw!r}")
        pins[canonical(name)] = (name.strip(), version.strip())
    return pins


def marker_environment(python_version: str) -> dict[str, str]:
    """PEP 508 marker values of a CPython ``python_version`` on Linux x86-64."""
    return {"python_version": python_version, "python_full_version": f"{python_version}.0",
            "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
            "implementation_name": "cpython", "platform_python_implementation": "CPython",
            "platform_release": "", "platform_version": "", "implementation_version": f"{python_version}.0"}


def installed_requirements() -> Callable[[str], list[str]]:
    """``requires(name)``: the Requires-Dist lines of an installed distribution (this
    interpreter's environment: the project's virtual environment)."""
    from importlib import metadata

    table = {canonical(d.metadata["Name"]): d for d in metadata.distributions()}

    def requires(name: str) -> list[str]:
        dist = table.get(canonical(name))
        if dist is None:
            raise KeyError(f"{name} is not installed here (make .venv/.installed installs requirements.lock)")
        return list(dist.requires or [])

    return requires


def closure(roots: Iterable[str], requires: Callable[[str], list[str]], python_version: str) -> set[str]:
    """Canonical names of ``roots`` and everything they need on ``python_version``
    (extras followed where a requirement asks for them)."""
    from packaging.requirements import Requirement

    env = marker_environment(python_version)
    wanted: dict[str, set[str]] = {}
    stack = [(canonical(r), frozenset()) for r in roots]
    while stack:
        name, extras = stack.pop()
        known = wanted.get(name)
        if known is not None and extras <= known:
            continue
        wanted.setdefault(name, set()).update(extras)
        for line in requires(name):
            req = Requirement(line)
            if req.marker is not None and not any(req.marker.evaluate({**env, "extra": e})
                                                  for e in (sorted(extras) or [""])):
                continue
            stack.append((canonical(req.name), frozenset(req.extras)))
    return set(wanted)


def plan_kit(lock: Mapping[str, tuple[str, str]], requires: Callable[[str], list[str]],
             python_version: str = "3.12") -> dict:
    """The kit's pins and the spares' pins (``name==version`` from requirements.lock)."""
    image = closure(IMAGE_HAS, requires, python_version)
    needed = closure(RUN_NEEDS, requires, python_version)
    missing = sorted(n for n in needed if n not in lock)
    if missing:
        raise ValueError(f"requirements.lock pins none of {missing}: the kit's versions come from it")

    def pins(names: Iterable[str]) -> list[str]:
        return [f"{lock[n][0]}=={lock[n][1]}" for n in sorted(names)]

    kit = needed - image
    spares = (needed & image) - {canonical(n) for n in IMAGE_HAS}
    return {"python_version": python_version, "kit": pins(kit), "spares": pins(spares),
            "image_assumed": pins(image)}


# --- wheels ---------------------------------------------------------------------------------


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def thin_wheel(path: Path, prefixes: tuple[str, ...]) -> int:
    """Rewrite the wheel at ``path`` without the files under ``prefixes`` (and their
    RECORD lines); returns the bytes saved. The wheel's name and tags stay."""
    before = path.stat().st_size
    with zipfile.ZipFile(path) as src:
        entries = [(info, src.read(info)) for info in src.infolist()]
    record_name = next(info.filename for info, _ in entries if info.filename.endswith(".dist-info/RECORD"))
    kept = [(info, data) for info, data in entries if not info.filename.startswith(prefixes)]
    if len(kept) == len(entries):
        return 0
    keep_names = {info.filename for info, _ in kept}
    rows = [row for row in csv.reader(io.StringIO(dict((i.filename, d) for i, d in entries)[record_name].decode()))
            if row and row[0] in keep_names]
    record = io.StringIO()
    csv.writer(record, lineterminator="\n").writerows(rows)
    tmp = path.with_suffix(".thin")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as dst:
        for info, data in kept:
            dst.writestr(info, record.getvalue().encode() if info.filename == record_name else data)
    os.replace(tmp, path)
    return before - path.stat().st_size


def _pip(*commands: list[str]) -> None:
    """Run ``pip`` with each argument list, all at once (downloads wait on the network far
    more than on the CPU); raise with the output of those that failed."""
    procs = [(args, subprocess.Popen([sys.executable, "-m", "pip", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)) for args in commands]
    failures = []
    for args, proc in procs:
        out, _ = proc.communicate()
        if proc.returncode != 0:
            lines = [line for line in out.splitlines() if "is ignored" not in line]
            failures.append(f"pip {' '.join(args[:3])} ... failed:\n" + "\n".join(lines[-20:]))
    if failures:
        raise RuntimeError("\n".join(failures))


def download(pins: list[str], dest: Path, python_version: str, platform_tags: str = "manylinux",
             parallel: int = 4) -> None:
    """Wheels of ``pins`` (exact, no dependencies) for CPython ``python_version`` on Linux
    x86-64 into ``dest``; a release published only as source is built into a wheel here,
    which must then be pure Python (any platform)."""
    dest.mkdir(parents=True, exist_ok=True)
    target = ["--python-version", python_version, "--implementation", "cp"]
    if platform_tags == "manylinux":
        target += [arg for tag in MANYLINUX for arg in ("--platform", tag)]
    # --no-deps: the pins are the whole closure already; --prefer-binary: a source release
    # only where no wheel exists.
    groups = [pins[i::parallel] for i in range(parallel) if pins[i::parallel]]
    _pip(*(["download", "-q", "--no-deps", "--prefer-binary", *target, "-d", str(dest), *group] for group in groups))
    sdists = sorted(p for p in dest.iterdir() if p.name.endswith((".tar.gz", ".zip")))
    if sdists:
        _pip(["wheel", "-q", "--no-deps", "-w", str(dest), *map(str, sdists)])
        for sdist in sdists:
            sdist.unlink()
    allowed = ("any", "manylinux") if platform_tags == "manylinux" else ("any", "manylinux", "linux_x86_64")
    for wheel in dest.glob("*.whl"):
        platform = wheel.name[:-4].split("-")[-1]
        if not platform.startswith(allowed):
            raise RuntimeError(f"{wheel.name}: not a wheel the target machine can install ({platform})")


def wheel_name(path: Path) -> str:
    return canonical(path.name.split("-", 1)[0])


def tree_bytes(root: Path = ROOT) -> int:
    """Bytes of the project's files that travel to the GPU machine (tracked and
    untracked-but-not-ignored)."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=root, capture_output=True,
                            check=True).stdout.decode().split("\0")
    return sum((root / name).stat().st_size for name in listed if name and (root / name).is_file())


def build(dest: Path, python_version: str = "3.12", platform_tags: str = "manylinux",
          lock_path: Path = LOCK) -> dict:
    """Download the kit and the spares into ``dest`` (kept: wheels already there with the
    pinned version), thin them, write requirements.txt and manifest.json; return the
    manifest."""
    from packaging.version import Version

    plan = plan_kit(read_lock(lock_path), installed_requirements(), python_version)
    dest = Path(dest)
    spares_dir = dest / "spares"
    wanted = {dest: plan["kit"], spares_dir: plan["spares"]}
    for folder, pins in wanted.items():
        folder.mkdir(parents=True, exist_ok=True)
        pinned = {canonical(p.split("==")[0]): Version(p.split("==")[1]) for p in pins}
        for wheel in folder.glob("*.whl"):  # a wheel of another version, or no longer needed, goes
            if pinned.get(wheel_name(wheel)) != Version(wheel.name.split("-")[1]):
                wheel.unlink()
        todo = [p for p in pins if canonical(p.split("==")[0]) not in
                {wheel_name(w) for w in folder.glob("*.whl")}]
        if todo:
            download(todo, folder, python_version, platform_tags)
    previous = dest / "manifest.json"  # a wheel thinned by an earlier build keeps its entry
    thinned = json.loads(previous.read_text()).get("thinned_bytes_saved", {}) if previous.exists() else {}
    thinned = {name: saved for name, saved in thinned.items()
               if (dest / name).exists() or (spares_dir / name).exists()}
    for wheel in [*dest.glob("*.whl"), *spares_dir.glob("*.whl")]:
        prefixes = THIN.get(wheel_name(wheel))
        if prefixes:
            saved = thin_wheel(wheel, prefixes)
            if saved:
                thinned[wheel.name] = saved
    (dest / "requirements.txt").write_text(
        "# The GPU kit's pins (darel/tools/gpu_kit.py, from requirements.lock); installed with\n"
        "#   python3 -m pip install --no-index --find-links gpu-kit --find-links gpu-kit/spares -r gpu-kit/requirements.txt\n"
        + "\n".join(plan["kit"]) + "\n")
    sizes = {p.name: p.stat().st_size for p in [*dest.glob("*.whl"), *spares_dir.glob("*.whl")]}
    manifest = {**plan, "platforms": platform_tags, "thinned_bytes_saved": thinned, "wheel_bytes": sizes,
                "kit_bytes": sum(sizes.values()), "tree_bytes": tree_bytes()}
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


def size_report(manifest: dict, dest: Path) -> str:
    mib = 2**20
    sizes = manifest["wheel_bytes"]
    spares = {Path(p).name for p in (dest / "spares").glob("*.whl")}
    largest = sorted(sizes.items(), key=lambda kv: -kv[1])[:8]
    total = manifest["kit_bytes"] + manifest["tree_bytes"]
    lines = [
        f"GPU kit for CPython {manifest['python_version']} ({manifest['platforms']}) in {dest}:",
        f"  {len(manifest['kit'])} kit wheels + {len(manifest['spares'])} spares: "
        f"{manifest['kit_bytes'] / mib:.1f} MiB (spares {sum(sizes[n] for n in spares) / mib:.1f} MiB)",
        "  largest: " + ", ".join(f"{name.split('-')[0]} {size / mib:.1f}" for name, size in largest),
        "  thinned: " + (", ".join(f"{name.split('-')[0]} -{saved / mib:.1f} MiB"
                                   for name, saved in manifest["thinned_bytes_saved"].items()) or "nothing"),
        f"  with the project's tree ({manifest['tree_bytes'] / mib:.1f} MiB): {total / mib:.1f} MiB of the "
        f"{TREE_LIMIT_BYTES / mib:.0f} MiB that may travel ({100 * total / TREE_LIMIT_BYTES:.0f} %)",
    ]
    if total > KIT_BUDGET_BYTES:
        lines.append(f"  OVER the kit's budget of {KIT_BUDGET_BYTES / mib:.0f} MiB")
    return "\n".join(lines)


# --- checking an environment ------------------------------------------------------------------

# The code whose imports a run on the GPU machine needs: the package, the stages, the GPU benchmarks.
SCANNED = ("darel", "stages", "bench/gpu.py", "bench/nlg.py")
# ...less the MLflow browser app (`make mlflow-ui`: flask and MLflow's server), which a run never
# starts; the lent machine has no one to browse it (its store comes back and opens here).
NOT_ON_THE_GPU = ("darel/tools/mlflow_app.py", "darel/tools/mlflow_ui.py")
LOCAL = {"darel", "stages", "bench", "tests", "__future__"}


def third_party_imports(root: Path = ROOT, scanned: Iterable[str] = SCANNED) -> dict[str, list[str]]:
    """{dotted module: [files importing it]} for every import of a module that is neither
    the standard library's nor the project's, function-level imports included."""
    import ast

    found: dict[str, list[str]] = {}
    files = []
    for part in scanned:
        path = root / part
        files.extend(sorted(path.rglob("*.py")) if path.is_dir() else [path])
    for path in files:
        if str(path.relative_to(root)) in NOT_ON_THE_GPU:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in LOCAL or top in sys.stdlib_module_names:
                    continue
                found.setdefault(name, []).append(str(path.relative_to(root)))
    return found


def check_environment(scratch: Path) -> list[str]:
    """What a run on this interpreter would miss: every third-party module the code
    imports is imported, an MLflow run is written to an SQLite
    store in ``scratch`` through darel.tracking, and codecarbon's offline tracker
    measures half a second through darel.measure. Returns the problems (empty: fine)."""
    import importlib
    import time

    problems = []
    for module, users in sorted(third_party_imports().items()):
        try:
            importlib.import_module(module)
        except Exception as err:  # noqa: BLE001 - reported, whatever it is
            problems.append(f"import {module} (used by {users[0]}): {type(err).__name__}: {err}")
    try:
        from darel import tracking

        uri = f"sqlite:///{Path(scratch) / 'kit-check.db'}"
        run_id = tracking.start_cell_run(uri, "gpu-kit-check", "kit-check", {"check": 1}, {})
        if not run_id:
            problems.append("MLflow: no run id from the SQLite store")
    except Exception as err:  # noqa: BLE001
        problems.append(f"MLflow on SQLite: {type(err).__name__}: {err}")
    try:
        from darel.measure import EnergyTracker

        tracker = EnergyTracker("USA", measure_power_secs=0.25)
        tracker.start()
        time.sleep(0.5)
        source = tracker.stop()["energy_source"]
        if source.startswith("unavailable"):
            problems.append(f"codecarbon: {source}")
    except Exception as err:  # noqa: BLE001
        problems.append(f"codecarbon: {type(err).__name__}: {err}")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dest", default="gpu-kit")
    ap.add_argument("--python-version", default="3.12")
    ap.add_argument("--platform-tags", choices=("manylinux", "native"), default="manylinux",
                    help="manylinux: the GPU machine's tags; native: this machine's (the test's twin)")
    ap.add_argument("--plan", action="store_true", help="print the pins only, download nothing")
    ap.add_argument("--check", metavar="SCRATCH", help="check this interpreter instead (imports, MLflow on "
                                                         "SQLite, codecarbon); writes only under SCRATCH")
    args = ap.parse_args(argv)
    if args.check:
        problems = check_environment(Path(args.check))
        print("\n".join(problems) if problems else "gpu kit check: every import, MLflow on SQLite and codecarbon work")
        return 1 if problems else 0
    if args.plan:
        print(json.dumps(plan_kit(read_lock(), installed_requirements(), args.python_version), indent=2))
        return 0
    dest = Path(args.dest)
    manifest = build(dest, args.python_version, args.platform_tags)
    print(size_report(manifest, dest))
    return 1 if manifest["kit_bytes"] + manifest["tree_bytes"] > KIT_BUDGET_BYTES else 0


if __name__ == "__main__":
    sys.exit(main())
