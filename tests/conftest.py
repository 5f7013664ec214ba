import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")


@pytest.fixture(autouse=True)
def _single_thread():
    import torch

    torch.set_num_threads(1)
    yield


def load_script(relative: str, name: str):
    """A bench or stage script of the repository (not a package module) imported under ``name``."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / relative)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def copy_worktree(dest: Path) -> Path:
    """Copy the repository as it stands (tracked and untracked-but-not-ignored files) to dest."""
    import shutil
    import subprocess

    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split()
    for name in files:
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    return dest


# The generated benchmark at a size a test generates in milliseconds and trains in seconds
# (fewer, smaller images than digits).
TINY_SYNTH = {"num_classes": 10, "n_train": 600, "n_test": 200, "image_size": 10, "classes_per_group": 2}


def shrink_generated_data(params: dict) -> dict:
    """Every size of the generated benchmark set to TINY_SYNTH (the tiny workflow runs)."""
    sizes = params.get("datasets", {}).get("synth", {}).get("sizes", {})
    for name in sizes:
        sizes[name] = dict(TINY_SYNTH)
    return params


def tiny_project(dest: Path, edit_params) -> Path:
    """copy_worktree(dest) with params.yaml passed through shrink_generated_data, then
    edit_params(dict) -> dict, committed as a fresh git repository (DVC needs one)."""
    import subprocess

    import yaml

    copy_worktree(dest)
    params_file = dest / "params.yaml"
    params = shrink_generated_data(yaml.safe_load(params_file.read_text()))
    params_file.write_text(yaml.safe_dump(edit_params(params), sort_keys=False))
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"],
                ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "tiny"]):
        subprocess.run(cmd, cwd=dest, check=True, capture_output=True)
    return dest


def one_budget_table1(params: dict, epochs: int = 2) -> dict:
    """Table 1 of one small model on the quick profile: its baseline and one budget, B(0.5, 0.55)
    (every kind of intermediate file; under a minute to build), ``epochs`` long with the
    learning rate's one step before the last."""
    params["profiles"]["quick"]["models"]["resnet18"] = {"width": 4, "epochs": epochs, "milestones": [epochs - 1],
                                                         "warmup_epochs": 1}
    params["profiles"]["quick"]["table1"] = {"resnet18": [[0.5, 0.55]]}
    params.pop("comparisons", None)
    return params


def built_one_budget_project(dest: Path) -> Path:
    """tiny_project(dest, one_budget_table1), its Table 1 built."""
    project = tiny_project(dest, one_budget_table1)
    run_in(project, str(Path(sys.executable).with_name("snakemake")), "--cores", "2", "results/table1.csv")
    return project


def built_project_fixtures(label: str):
    """Two fixtures for a test file: ``built`` (built_one_budget_project, once per file, in a
    folder named after ``label``) and ``project`` (a fresh copy of it per test, to damage).
    Bind them to those names in the test file: ``built, project = built_project_fixtures(...)``."""

    @pytest.fixture(scope="module")
    def built(tmp_path_factory):
        return built_one_budget_project(tmp_path_factory.mktemp(label) / "project")

    @pytest.fixture()
    def project(built, tmp_path):
        import shutil

        copy = tmp_path / "project"
        shutil.copytree(built, copy, symlinks=True)
        return copy

    return built, project


# The longest files, longest first (from `--durations` of a full run). `make test` spreads
# whole files over two workers (pytest-xdist, --dist loadfile, --no-loadscope-reorder), so
# a long file that started last would run alone at the end.
LONGEST_FIRST = ["test_nlg_workflow.py", "test_workflow.py", "test_readme.py", "test_faults.py"]


def pytest_collection_modifyitems(config, items):
    def rank(item):
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: the order within a file and among the others is kept


def run_in(cwd: Path, *cmd: str, check: bool = True, timeout: int = 3600, env: dict | None = None):
    """Run a command of the project's virtual environment in ``cwd`` (the timeout only
    catches a hang: a busy machine may run these many times slower); ``env`` adds variables."""
    import subprocess

    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "MLFLOW_DISABLE_TELEMETRY": "true",
           "PYTHONUNBUFFERED": "1", **(env or {})}
    proc = subprocess.run(list(cmd), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


# Two builds of the same cells (issue 32) differ only in these fields of the stage records:
# measurements of time, energy or memory (the cell records' darel.records.MEASUREMENTS and
# the stage records' own), and the hashes of records that hold such fields (seals, the
# sha256 of a record's input records, a checkpoint's fingerprint, the pinned calibration's
# origin). A dotted field is skipped when any part of its name is listed.
MEASURED_FIELDS = frozenset({
    "time_s", "wall_time_s", "cpu_beside_s", "cores_beside", "total_time_s", "epoch_time_s", "tokens_per_s", "feature_time_s",
    "energy", "duration_s", "energy_kwh", "cpu_energy_kwh", "ram_energy_kwh", "cpu_power_w", "ram_power_w",
    "codecarbon_cpu_power_w", "carbon_intensity_kg_per_kwh", "co2e_kg", "eq6_co2e_kg", "process_peak_rss_bytes",
})
HASHES_OF_MEASURED = frozenset({"record_seal", "sources_sha256", "adapter_sha256", "calibration_sha256", "inputs",
                                "fingerprint", "reused_from", "identity"})


def _flat(obj, prefix: tuple = ()) -> dict:
    if isinstance(obj, dict):
        out = {}
        for key, value in obj.items():
            out.update(_flat(value, (*prefix, str(key))))
        return out
    return {prefix: obj}


def build_differences(first: Path, second: Path, folders: list[str]) -> tuple[list[str], int]:
    """Every file the second build wrote under ``folders`` against the first build's file
    of the same path: JSON records and .npz archives field by field, skipping the fields
    above; every other file (weights, outputs, data, tokenizer) by its sha256. Returns the
    differences (file and field) and how many files were compared."""
    import hashlib
    import json

    import numpy as np

    from darel.records import MEASUREMENTS

    skipped = MEASURED_FIELDS | HASHES_OF_MEASURED | {name.split(".")[-1] for name in MEASUREMENTS}
    differences, compared = [], 0
    for folder in folders:
        for path in sorted((second / folder).rglob("*")):
            rel = path.relative_to(second)
            if not path.is_file() or path.suffix == ".log" or path.name.startswith(".") or "ckpt" in path.name:
                continue
            other = first / rel
            compared += 1
            if not other.is_file():
                differences.append(f"{rel}: not in the first build")
            elif path.suffix in (".json", ".npz"):
                if path.suffix == ".json":
                    a, b = _flat(json.loads(other.read_text())), _flat(json.loads(path.read_text()))
                else:
                    a, b = ({(k,): v for k, v in np.load(p, allow_pickle=False).items()} for p in (other, path))
                for key in sorted(set(a) | set(b)):
                    if skipped.isdisjoint(key) and not (key in a and key in b and np.array_equal(a[key], b[key])):
                        differences.append(f"{rel}: {'.'.join(key)}")
            elif hashlib.sha256(path.read_bytes()).digest() != hashlib.sha256(other.read_bytes()).digest():
                differences.append(f"{rel}: sha256")
    return differences, compared
