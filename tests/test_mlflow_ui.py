"""`make mlflow-ui` (darel.tools.mlflow_ui): the address comes once the server answers it,
and the terminal shows no deprecation warnings, access log or telemetry notice. The real
server on a free port of 127.0.0.1, stopped by the process group this test started; the
browser side is tests_ui/."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from darel import tracking
from darel.tools import mlflow_ui
from tests.conftest import ROOT

# What `mlflow ui` wrote before its output was quieted (MLflow 3.17, 2 cores), in order.
SERVER_OUTPUT = [
    "Registry store URI not provided. Using backend store URI.\n",
    "/venv/lib/python3.11/site-packages/mlflow/server/fastapi_app.py:23: StarletteDeprecationWarning: "
    "starlette.middleware.wsgi is deprecated and will be removed in a future release.\n",
    "  from starlette.middleware.wsgi import WSGIResponder, build_environ\n",
    "2026/11/29 00:53:05 INFO:     Uvicorn running on http://127.0.0.1:5731 (Press CTRL+C to quit)\n",
    "/x.py:3: DeprecationWarning: old\n",
    "  old()\n",
    "  Traceback-like indented line that follows an ordinary one\n",
    '2026/11/29 00:53:25 INFO:     127.0.0.1:56632 - "GET / HTTP/1.1" 200 OK\n',
    '2026/11/29 00:53:26 INFO:     127.0.0.1:56650 - "GET /api/2.0/mlflow/experiments/search?max_results=1 '
    'HTTP/1.1" 200 OK\n',
    "2026/11/29 00:53:27 ERROR mlflow.server: something real\n",
]
ACCESS_LINE = re.compile(r'"(GET|POST) \S+ HTTP/1\.1" \d{3}')


def test_the_server_output_loses_deprecation_warnings_and_access_lines_only():
    assert list(mlflow_ui.quiet(SERVER_OUTPUT)) == [SERVER_OUTPUT[i] for i in (0, 3, 6, 9)]


def test_the_start_page_is_polled_on_this_machine():
    assert mlflow_ui.local_url("127.0.0.1", 5000) == "http://127.0.0.1:5000/"
    assert mlflow_ui.local_url("0.0.0.0", 5001) == "http://127.0.0.1:5001/"
    assert mlflow_ui.local_url("::", 5002) == "http://[::1]:5002/"
    assert mlflow_ui.local_url("::1", 5003) == "http://[::1]:5003/"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_waiting_ends_with_why_when_the_server_exits_or_never_answers():
    url = f"http://127.0.0.1:{_free_port()}/"  # nobody listens there
    gone = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    gone.wait()
    assert mlflow_ui.wait_until_serving(url, gone, wait_s=60) == f"MLflow exited (code 3) before it answered at {url}"
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        assert mlflow_ui.wait_until_serving(url, alive, wait_s=0) == f"MLflow did not answer at {url} within 0 s"
    finally:
        alive.kill()
        alive.wait()


def _store(folder: Path) -> str:
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    tracking.log_cell_run(uri, "table1", "quick/resnet18/s0/baseline", {}, {"top1": 80.0}, {}, {"profile": "quick"}, [])
    return uri


def _start(uri: str, port: int) -> subprocess.Popen:
    """What `make mlflow-ui` runs, on this store and port, in a process group of its own."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
           "MLFLOW_DISABLE_TELEMETRY": "true", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    # --wait: only a bound on a hang; a busy machine may start MLflow many times slower.
    return subprocess.Popen([sys.executable, "-m", "darel.tools.mlflow_ui", "--backend-store-uri", uri, "--port",
                             str(port), "--wait", "900"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _stop(proc: subprocess.Popen) -> str:
    """Stop the process group this test started (by its PID); the rest of its output."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        rest, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        rest, _ = proc.communicate()
    return rest


def _get(url: str) -> bytes:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=60) as answer:
        assert answer.status == 200
        return answer.read()


@pytest.mark.slow
def test_the_address_comes_once_the_server_answers_and_nothing_scrolls_it_away(tmp_path):
    port = _free_port()
    proc = _start(_store(tmp_path), port)
    printed = ""
    try:
        while "MLflow serves the store until Ctrl-C." not in printed:
            line = proc.stdout.readline()
            assert line, f"mlflow-ui ended before printing the address:\n{printed}"
            printed += line
        # The address is printed: the server answers it at once (one try; before, the address
        # came half a minute before the server listened).
        address = re.search(r"http://127\.0\.0\.1:\d+/#/experiments/\S+", printed).group(0)
        page = _get(address.split("#")[0])
        for path in ("/", "/ajax-api/2.0/mlflow/experiments/search?max_results=5", "/health"):
            _get(f"http://127.0.0.1:{port}{path}")  # each would be an access-log line
        telemetry = json.loads(_get(f"http://127.0.0.1:{port}/ajax-api/3.0/mlflow/ui-telemetry"))
    finally:
        printed += _stop(proc)
    lines = printed.splitlines()
    assert lines[0].startswith("mlflow-ui: starting MLflow on port"), printed
    assert lines[1] == "table1 (quick profile) in MLflow: open" and lines.index(f"  {address}") == 3, printed
    # Nothing of the server's start-up between the first line and the address.
    assert not [line for line in lines[:lines.index("MLflow serves the store until Ctrl-C.")]
                if "INFO" in line or "Uvicorn" in line], printed
    assert "DeprecationWarning" not in printed and not ACCESS_LINE.search(printed), printed
    # The telemetry notice: marked read in the browser by the start page, telemetry off on the server.
    assert b'"mlflow.telemetry.info.alert.dismissed_v1": "true"' in page
    assert telemetry["disable_ui_telemetry"] is True
    assert "collects usage data" not in printed


@pytest.mark.slow
def test_a_server_that_cannot_start_is_shown_with_one_line_and_no_address(tmp_path):
    with socket.socket() as taken:  # the port is in use: uvicorn cannot bind it
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        proc = _start(_store(tmp_path), taken.getsockname()[1])
        try:
            out, _ = proc.communicate(timeout=900)
        finally:
            if proc.poll() is None:
                _stop(proc)
    assert proc.returncode == 1, out
    last = out.strip().splitlines()[-1]
    assert re.fullmatch(r"mlflow-ui: MLflow exited \(code \d+\) before it answered at http://127\.0\.0\.1:\d+/; "
                        r"its output is above", last), out
    assert "address already in use" in out.lower() and "/#/experiments/" not in out, out
