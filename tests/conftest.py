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


def tiny_project(dest: Path, edit_params) -> Path:
    """copy_worktree(dest) with params.yaml passed through edit_params(dict) -> dict, committed
    as a fresh git repository (DVC needs one)."""
    import subprocess

    import yaml

    copy_worktree(dest)
    params_file = dest / "params.yaml"
    params_file.write_text(yaml.safe_dump(edit_params(yaml.safe_load(params_file.read_text())), sort_keys=False))
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"],
                ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "tiny"]):
        subprocess.run(cmd, cwd=dest, check=True, capture_output=True)
    return dest


# The longest files, longest first (from `--durations` of a full run). `make test` spreads
# whole files over two workers (pytest-xdist, --dist loadfile, --no-loadscope-reorder), so
# a long file that started last would run alone at the end.
LONGEST_FIRST = ["test_nlg_workflow.py", "test_workflow.py", "test_readme.py", "test_faults.py"]


def pytest_collection_modifyitems(config, items):
    def rank(item):
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: the order within a file and among the others is kept
