"""torch.compile's cache is the project's (issue 52 item 1): a compiled job compiles each
graph once per machine, not once per job where /tmp is private to each job."""

from __future__ import annotations

import os
import subprocess
import sys

import torch

from darel import runtime


def test_the_runtime_points_the_compile_cache_into_the_project_unless_the_user_did(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    runtime.configure_runtime(torch.device("cpu"), 1, take_turn=False)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / runtime.COMPILE_CACHE)
    assert not (tmp_path / runtime.COMPILE_CACHE).exists()  # made by torch's first compilation, not before
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/shared/cache")
    runtime.configure_runtime(torch.device("cpu"), 1, take_turn=False)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/shared/cache"


def test_the_preflight_checks_the_cache_folder_for_links_out(tmp_path):
    """The cache lies under runs/, a folder the preflight refuses links out of."""
    from darel import preflight

    assert runtime.COMPILE_CACHE.split("/")[0] in preflight.WRITTEN_FOLDERS
    (tmp_path / "runs").mkdir()
    outside = tmp_path.parent / f"{tmp_path.name}-elsewhere"
    outside.mkdir()
    (tmp_path / runtime.COMPILE_CACHE).symlink_to(outside)
    try:
        preflight.check_links(root=tmp_path)
    except preflight.Refusal as refusal:
        assert ".compile_cache" in str(refusal)
    else:
        raise AssertionError("a cache folder linked out of the project was not refused")


def test_a_compilation_in_a_fresh_process_writes_into_the_projects_cache(tmp_path):
    """A real (tiny) inductor compilation in a job-like process: its graphs land in the
    project's folder, where the next job finds them."""
    code = ("import torch\nfrom darel import runtime\n"
            "runtime.configure_runtime(torch.device('cpu'), 1, take_turn=False)\n"
            "f = torch.compile(lambda x: torch.sin(x) * 2 + 1)\nprint(float(f(torch.ones(4)).sum()))\n")
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    cache = tmp_path / runtime.COMPILE_CACHE
    assert cache.is_dir() and any(path.is_file() for path in cache.rglob("*"))
