"""A DVC remote between two clones: one builds the tiny Table 1 and pushes, the other runs
`make pull` and gets every file byte for byte, after which `snakemake -n` plans nothing.
Once with a shared folder, once with an S3-compatible store (moto's server, started here
and stopped by its PID)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, one_budget_table1, tiny_project

BIN = Path(sys.executable).parent
S3_ENV = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}


def _params(params: dict) -> dict:
    return one_budget_table1(params, epochs=3)


def _env(extra: dict | None = None) -> dict:
    return {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "MLFLOW_DISABLE_TELEMETRY": "true",
            "PYTHONUNBUFFERED": "1", **S3_ENV, **(extra or {})}


def sh(cwd: Path, *cmd: str, timeout: int = 1800) -> str:
    proc = subprocess.run(list(cmd), cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd}: {proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout + proc.stderr


def _files(project: Path) -> dict[str, bytes]:
    found = {}
    for top in ("data/quick", "runs/quick/table1", "results/cells/quick/table1"):
        for path in sorted((project / top).rglob("*")):
            if path.is_file() and not path.name.startswith("."):
                found[str(path.relative_to(project))] = path.read_bytes()
    return found


@pytest.fixture(scope="module")
def origin(tmp_path_factory):
    """The first clone: built, its DVC outputs committed (dvc repro: Snakemake has nothing to do)."""
    project = tiny_project(tmp_path_factory.mktemp("origin"), _params)
    sh(project, str(BIN / "snakemake"), "--cores", "2", "results/table1.csv")
    sh(project, str(BIN / "dvc"), "repro", "table1")
    sh(project, "git", "add", "-A")
    sh(project, "git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "built")
    return project


def _pull_into_a_new_clone(origin: Path, dest: Path, remote: list[str]) -> Path:
    """remote: [url] or [url, S3 endpoint]."""
    for project in (origin, None):
        if project is None:
            sh(dest.parent, "git", "clone", "-q", str(origin), str(dest))
            project = dest
        sh(project, str(BIN / "dvc"), "remote", "add", "-f", "-d", "shared", remote[0])
        if len(remote) > 1:
            sh(project, str(BIN / "dvc"), "remote", "modify", "shared", "endpointurl", remote[1])
        if project == origin:
            sh(origin, str(BIN / "dvc"), "push")
    (dest / ".venv").symlink_to(ROOT / ".venv")  # the same environment; -o: make installs nothing
    out = sh(dest, "make", "-o", ".venv/.installed", "pull")
    assert "snakemake plans nothing" in out, out[-3000:]
    return dest


def test_a_shared_folder_remote_gives_another_clone_everything(origin, tmp_path):
    clone = _pull_into_a_new_clone(origin, tmp_path / "clone", [str(tmp_path / "remote")])
    assert _files(clone) == _files(origin) and len(_files(origin)) > 10
    assert "Nothing to be done" in sh(clone, str(BIN / "snakemake"), "-n", "results/table1.csv")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_s3_remote_gives_another_clone_everything(origin, tmp_path):
    port = _free_port()
    server = subprocess.Popen([str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)], env=_env(),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        import boto3

        endpoint = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                boto3.client("s3", endpoint_url=endpoint, **{k.lower(): v for k, v in S3_ENV.items()
                                                              if k != "AWS_DEFAULT_REGION"},
                             region_name="us-east-1").create_bucket(Bucket="darel")
                break
            except Exception:  # noqa: BLE001 - the server is still starting
                time.sleep(0.2)
        clone = _pull_into_a_new_clone(origin, tmp_path / "clone", ["s3://darel/cache", endpoint])
        assert _files(clone) == _files(origin)
    finally:
        server.terminate()
        server.wait(timeout=30)
