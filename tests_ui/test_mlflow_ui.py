"""`make mlflow-ui` in a real browser: the address it prints opens, in headless Chromium,
the table1 experiment on its training runs (not the GenAI overview), one row per cell,
Table 1's columns with the paper's figure beside ours, values rounded. The store is made
here (a few runs through the tracking code the workflow uses), not by a workflow run.

Run by `make test-ui` (which installs chromium and playwright first); outside it, the
test is skipped where either is missing."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

from darel.table1 import load_paper_table1, mlflow_row_figures  # noqa: E402
from darel.tracking import TABLE_VIEW_METRICS, follow_table, log_cell_run  # noqa: E402

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
REQUIRED = os.environ.get("DAREL_TEST_UI_REQUIRED") == "1"

# (cell, method, t, m, batch, alpha, A, eta, epochs, boost)
CELLS = [("baseline", "baseline", None, None, 64, 1.0, 1.0, 1, 12, 1.0),
         ("b0.80_0.80", "darel", 0.8, 0.8, 64, 0.8, 0.431234567, 3, 9, 1.234567891),
         ("b0.50_0.55", "darel", 0.5, 0.55, 32, 0.6, 0.1, 3, 5, 1.987654321),
         ("ids_adonis", "ids+adonis", None, None, 64, 0.7, 0.5, 1, 12, 1.5)]


def _missing() -> str | None:
    if not Path(CHROMIUM).exists():
        return f"no chromium at {CHROMIUM} (make test-ui installs Debian's package)"
    try:
        import playwright  # noqa: F401
    except ImportError:
        return "playwright is not installed (make test-ui installs requirements-ui.lock)"
    return None


def _make_store(folder: Path, profile: str) -> str:
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    record = folder / "cell.json"
    record.write_text("{}")
    rows = []
    for cell, method, t, m, batch, alpha, a, eta, epochs, boost in CELLS:
        log_cell_run(uri, "table1", f"{profile}/resnet18/s0/{cell}", params={"cell": {"t": t, "m": m}},
                     metrics={"top1": 80.123456789, "time_s": 12.3456789, "epochs": epochs},
                     curves={"train_loss": [1.0, 0.5]},
                     tags={"profile": profile, "model": "resnet18", "method": method, "cell": cell, "seed": 0},
                     artifacts=[record])
        rows.append({"model": "resnet18", "seed": 0, "cell": cell, "method": method, "t": t, "m": m, "batch": batch,
                     "alpha": alpha, "A": a, "eta": eta, "epochs": epochs, "boost": boost,
                     "acc_drop_pp": 0.0 if method == "baseline" else 3.14159265, "mem_cut": 1.5, "co2e_cut": 2.0,
                     "budget_adherence": 0.987654321, "top1": 80.123456789})
    paper, baselines = load_paper_table1()
    figures = mlflow_row_figures(pd.DataFrame(rows), paper, baselines)
    follow_table(uri, "table1", profile, {f"{profile}/{m}/s{s}/{c}": v for (m, s, c), v in figures.items()},
                 f"{profile}/table1", [record])
    return uri


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_up(base: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"mlflow ui exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"mlflow ui did not answer at {base} within {timeout} s")


def test_make_mlflow_ui_opens_table1(tmp_path):
    missing = _missing()
    if missing:
        if REQUIRED:
            pytest.fail(missing)
        pytest.skip(missing)
    from playwright.sync_api import sync_playwright

    from darel import config

    profile = config.load_params(ROOT / "params.yaml")["profile"]
    uri = _make_store(tmp_path, profile)
    # A DVC experiment's run of the same cell: not part of the table's view.
    os.environ["DVC_EXP_NAME"] = "tiny-exp"
    try:
        log_cell_run(uri, "table1", f"{profile}/resnet18/s0/baseline", params={}, metrics={"top1": 1.0}, curves={},
                     tags={"profile": profile}, artifacts=[])
    finally:
        del os.environ["DVC_EXP_NAME"]

    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    # What `make mlflow-ui` runs, on this store and a free port.
    proc = subprocess.Popen([sys.executable, "-m", "darel.tools.mlflow_ui", "--backend-store-uri", uri,
                             "--port", str(port)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True,
                            env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true",
                                 "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
    try:
        printed = ""
        while "/#/experiments/" not in printed:
            line = proc.stdout.readline()
            assert line, f"mlflow-ui printed no address:\n{printed}"
            printed += line
        url = re.search(r"http://\S+/#/experiments/\S+", printed).group(0)
        assert "workflowType=machine_learning" in url and "viewStateShareKey=" in url
        _wait_up(base, proc)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            try:
                page = browser.new_page(viewport={"width": 3600, "height": 1000})
                page.goto(url)
                page.wait_for_selector(f"text={profile}/resnet18/s0/b0.80_0.80", timeout=90_000)
                page.wait_for_selector('.ag-header-cell[col-id="metrics.`boost_paper`"]', timeout=30_000)
                text = page.inner_text("body")
                headers = page.eval_on_selector_all(
                    ".ag-header-cell[col-id]",
                    "els => els.map(e => [Number(e.getAttribute('aria-colindex')), e.getAttribute('col-id')])")
                cells = page.eval_on_selector_all(
                    ".ag-row .ag-cell[col-id]", "els => els.map(e => [e.getAttribute('col-id'), e.innerText.trim()])")
                page.screenshot(path=str(tmp_path / "mlflow_ui.png"))
            finally:
                browser.close()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    # The training runs, not the GenAI overview.
    assert "Runs" in text and "matching runs" in text, text[:2000]
    # One row per cell, the table's own run and the DVC experiment's run filtered out.
    for cell in ("baseline", "b0.80_0.80", "b0.50_0.55", "ids_adonis"):
        assert f"{profile}/resnet18/s0/{cell}" in text
    assert f"{profile}/table1" not in text and "[dvc exp" not in text
    assert "4 matching runs" in text
    # Table 1's columns, in the view's order: the paper's figure right after ours.
    order = [col for _, col in sorted(headers) if col.startswith("metrics.")]
    expected = [f"metrics.`{name}`" for name in TABLE_VIEW_METRICS["table1"]]
    assert order == expected, order
    # Rounded: 0.431234567 shows as 0.431, 1.234567891 as 1.23; the paper's 2.03 beside ours.
    shown = {value for _, value in cells}
    assert {"0.431", "1.23", "1.99", "3.14", "0.988", "80.12"} <= shown, sorted(shown)
    assert not any(re.fullmatch(r"-?\d+\.\d{4,}", value) for value in shown), sorted(shown)
    by_column: dict[str, list[str]] = {}
    for column, value in cells:
        by_column.setdefault(column, []).append(value)
    assert "2.03" in by_column["metrics.`boost_paper`"]  # B(0.50, 0.55) in the paper
    assert "1.25" in by_column["metrics.`boost_paper`"]  # B(0.80, 0.80)
