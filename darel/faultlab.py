"""Fault injection for the training stages: start a stage as its own process, kill it with
SIGKILL at chosen points, start it again, and compare the result with an uninterrupted
run. Used by the fault tests and by bench/faults.py (no I/O of its own beyond the stage
processes and their folders)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from darel import checkpoint


def start_stage(argv: list[str], cwd: Path, log: Path) -> subprocess.Popen:
    env = dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, *argv], cwd=cwd, env=env, stdout=open(log, "ab"),
                            stderr=subprocess.STDOUT)


def checkpoint_epoch(path: Path) -> int | None:
    """The epoch the checkpoint file holds (None: absent or unreadable right now)."""
    try:
        state = checkpoint.loads(path.read_bytes())
    except Exception:  # noqa: BLE001 - a file being replaced, or none yet
        return None
    return int(state["loop"]["epoch"])  # darel.epochs' checkpoint layout


def kill_when(proc: subprocess.Popen, ready, timeout_s: float = 600.0, poll_s: float = 0.05) -> bool:
    """SIGKILL ``proc`` as soon as ``ready()`` is true; False if it ended (or timed out) first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        if ready():
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
            return True
        time.sleep(poll_s)
    proc.kill()
    proc.wait(timeout=60)
    return False


def run_to_end(argv: list[str], cwd: Path, log: Path, timeout_s: float = 900.0) -> int:
    proc = start_stage(argv, cwd, log)
    return proc.wait(timeout=timeout_s)


def same_weights(a: Path, b: Path) -> bool:
    """model.pt files (state dicts under "state_dict") with equal tensors."""
    first = torch.load(a, weights_only=True)["state_dict"]
    second = torch.load(b, weights_only=True)["state_dict"]
    return first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


def resumed_from(train_json: Path) -> int | None:
    return json.loads(train_json.read_text()).get("resumed_from_epoch")


def checkpoint_line(log_text: str) -> str | None:
    """The line of a training stage's log that says what became of the checkpoint it found
    (resumed, set aside as another configuration's, damaged), whatever logger wrote it."""
    return next((line for line in log_text.splitlines() if " INFO checkpoint " in line), None)
