"""The GPU kit (darel/tools/gpu_kit.py): what it holds, how it is derived from
requirements.lock, and - installed offline into a fresh virtual environment that sees
only what the GPU image has - that a run finds everything it imports, writes MLflow's
SQLite store, measures energy with codecarbon and plans Table 1 with Snakemake."""

from __future__ import annotations

import csv
import io
import os
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

from darel.tools import gpu_kit
from tests.conftest import copy_worktree


def test_closure_follows_markers_and_extras():
    requires = {
        "app": ["lib>=1", "winonly; sys_platform == 'win32'", "old; python_version < '3.9'", "opt[x]"],
        "lib": [], "winonly": [], "old": [],
        "opt": ["plain", "extra-dep; extra == 'x'", "never; extra == 'y'"],
        "plain": [], "extra-dep": [], "never": [],
    }
    assert gpu_kit.closure(["App"], requires.__getitem__, "3.12") == {"app", "lib", "opt", "plain", "extra-dep"}


def test_the_kit_is_the_run_needs_less_what_the_image_has_at_the_locked_versions():
    lock = gpu_kit.read_lock()
    plan = gpu_kit.plan_kit(lock, gpu_kit.installed_requirements(), "3.12")
    kit = dict(pin.split("==") for pin in plan["kit"])
    names = {gpu_kit.canonical(n) for n in kit}
    assert {"snakemake", "mlflow-skinny", "sqlalchemy", "alembic", "codecarbon", "scikit-learn"} <= names
    image = {gpu_kit.canonical(p.split("==")[0]) for p in plan["image_assumed"]}
    assert {"torch", "transformers", "numpy", "pandas"} <= image and not names & image
    assert not names & {"dvc", "mlflow", "pyarrow", "pytest"}  # the full MLflow server, DVC, tests: not needed
    for name, version in kit.items():  # every version is requirements.lock's
        assert lock[gpu_kit.canonical(name)][1] == version, name
    spares = {gpu_kit.canonical(p.split("==")[0]) for p in plan["spares"]}
    assert spares <= image and not spares & {gpu_kit.canonical(n) for n in gpu_kit.IMAGE_HAS}


def test_thin_wheel_drops_files_and_their_record_lines(tmp_path):
    wheel = tmp_path / "pkg-1.0-py3-none-any.whl"
    files = {"pkg/__init__.py": b"x = 1\n", "pkg/solver/osx/cbc": b"\0" * 5000, "pkg/solver/linux/cbc": b"\1" * 10}
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for name, data in files.items():
        writer.writerow([name, gpu_kit._record_hash(data), len(data)])
    writer.writerow(["pkg-1.0.dist-info/RECORD", "", ""])
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        zf.writestr("pkg-1.0.dist-info/RECORD", record.getvalue())
    assert gpu_kit.thin_wheel(wheel, ("pkg/solver/osx/",)) > 0
    with zipfile.ZipFile(wheel) as zf:
        assert sorted(zf.namelist()) == ["pkg-1.0.dist-info/RECORD", "pkg/__init__.py", "pkg/solver/linux/cbc"]
        rows = list(csv.reader(io.StringIO(zf.read("pkg-1.0.dist-info/RECORD").decode())))
    assert [row[0] for row in rows] == ["pkg/__init__.py", "pkg/solver/linux/cbc", "pkg-1.0.dist-info/RECORD"]
    assert gpu_kit.thin_wheel(wheel, ("pkg/solver/osx/",)) == 0  # nothing left to drop


def test_the_import_scan_sees_function_level_imports():
    found = gpu_kit.third_party_imports()
    assert "sklearn.cluster" in found and "codecarbon" in found and "mlflow.tracking" in found
    assert not any(name.split(".")[0] in {"darel", "os", "json", "stages"} for name in found)


def _simulated_image(site: Path) -> None:
    """A folder of links to what the GPU image has (the closure of gpu_kit.IMAGE_HAS as
    this environment installed it), and nothing else."""
    table = {gpu_kit.canonical(d.metadata["Name"]): d for d in metadata.distributions()}
    site.mkdir()
    for name in gpu_kit.closure(gpu_kit.IMAGE_HAS, gpu_kit.installed_requirements(), "3.11"):
        dist = table[name]
        for top in {Path(f).parts[0] for f in dist.files or [] if Path(f).parts[0] != ".."}:
            source = Path(dist.locate_file(top))
            if source.exists() and not (site / top).exists():
                (site / top).symlink_to(source)


@pytest.mark.slow
def test_the_kit_installed_offline_beside_the_image_runs_the_workflow(tmp_path, request):
    """The kit's twin for this machine's Python, installed with the GPU script's pip
    command (no index) into a fresh virtual environment that sees the image's packages
    only: everything the code imports, MLflow's SQLite store, codecarbon and the smoke
    profile's dry run of Table 1 work there. The twin's wheels stay in pytest's cache
    folder (gpu_kit.build keeps the wheels whose version is still the pinned one)."""
    kit = Path(request.config.cache.mkdir("gpu-kit-twin"))
    manifest = gpu_kit.build(kit, f"{sys.version_info.major}.{sys.version_info.minor}", "native")
    assert (kit / "requirements.txt").read_text().count("==") == len(manifest["kit"])
    image = tmp_path / "image-site"
    _simulated_image(image)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python*/site-packages"))
    (site / "gpu-image.pth").write_text(f"{image}\n")
    python = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(python)]
    install = subprocess.run([*pip, "install", "-q", "--no-index", "--find-links", str(kit), "--find-links",
                              str(kit / "spares"), "-r", str(kit / "requirements.txt")], capture_output=True, text=True)
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    check = subprocess.run([*pip, "check"], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout[-3000:]

    tree = copy_worktree(tmp_path / "tree")
    env = {**os.environ, "PYTHONPATH": str(tree), "MLFLOW_DISABLE_TELEMETRY": "true",
           "PATH": f"{venv / 'bin'}:{os.environ['PATH']}"}
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    probe = subprocess.run([str(python), "-m", "darel.tools.gpu_kit", "--check", str(scratch)], cwd=tree, env=env,
                           capture_output=True, text=True, timeout=1800)
    assert probe.returncode == 0, probe.stdout[-3000:] + probe.stderr[-3000:]
    dry = subprocess.run([str(python), "-m", "snakemake", "-n", "results/table1.csv", "--config",
                          "params_file=.test/params.yaml"], cwd=tree, env=env, capture_output=True, text=True,
                         timeout=1800)
    assert dry.returncode == 0, dry.stdout[-3000:] + dry.stderr[-3000:]
    assert "table1" in dry.stdout and "This was a dry-run" in dry.stdout
