"""`make mlflow-ui` in a real browser, as a researcher's first screen: headless Chromium at
1600 x 1000, a fresh browser (nothing in its local storage), the address the command
prints. It must show Table 1's rows in the paper's order, one per cell, with every column
of the view whole and inside the window, in the view's order (each figure beside the
paper's, adherence and top-1, the calibrated settings; the budget ends the run's name),
values rounded, and no side panel over them. A person who starts from MLflow's home page
instead sees no notice about usage data (telemetry is off), and after clicking the
experiment lands on its training runs (not the GenAI overview, no pop-up) and finds the
view in the Views menu. The store is made here (the quick profile's
16 rows through the tracking code the workflow uses), not by a workflow run.

Run by `make test-ui` (which installs chromium and playwright first); outside it, the
test is skipped where either is missing."""

from __future__ import annotations

import math
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

from darel.table1 import load_paper_table1, mlflow_row_figures, table1_row_numbers  # noqa: E402
from darel.tracking import (CREATED_COLUMN, RUN_NAME_COLUMN, TABLE_VIEW_COLUMNS, follow_table,  # noqa: E402
                            log_cell_run, table_view_key, table_view_name)

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
REQUIRED = os.environ.get("DAREL_TEST_UI_REQUIRED") == "1"
WIDTH, HEIGHT = 1600, 1000
DESCRIPTION_START = "Table 1 of the DAREL paper, reproduced"


def _missing() -> str | None:
    if not Path(CHROMIUM).exists():
        return f"no chromium at {CHROMIUM} (make test-ui installs Debian's package)"
    try:
        import playwright  # noqa: F401
    except ImportError:
        return "playwright is not installed (make test-ui installs requirements-ui.lock)"
    return None


def _quick_rows() -> pd.DataFrame:
    """Table 1 as the quick profile builds it (per-seed rows, the paper's order): both
    baselines, every budget of the paper, IDS + ADONIS; figures as wide as real ones."""
    paper, _ = load_paper_table1()
    rows = []
    for model in ("resnet18", "resnet18_hc"):
        rows.append(dict(model=model, cell="baseline", method="baseline", t=math.nan, m=math.nan, batch=32, alpha=1.0,
                         A=1.0, eta=1, epochs=40, boost=1.0, acc_drop_pp=0.0, mem_cut=1.0, co2e_cut=1.0,
                         budget_adherence=math.nan, top1=97.2222222))
        for i, ref in enumerate(paper[paper["model"] == model].itertuples()):
            rows.append(dict(model=model, cell=f"t{ref.t:.2f}_m{ref.m:.2f}", method="darel", t=ref.t, m=ref.m,
                             batch=32 if ref.m == 1 else (16 if ref.m > 0.6 else 8), alpha=0.8, A=0.431234567 + i / 100,
                             eta=3, epochs=40 - 2 * i, boost=1.234567891 + i / 10, acc_drop_pp=12.3456 + 2 * i,
                             mem_cut=1.987654, co2e_cut=2.1234567, budget_adherence=1.2271 - i / 50,
                             top1=84.876543))
        if model == "resnet18":
            rows.append(dict(model=model, cell="ids_adonis", method="ids+adonis", t=math.nan, m=math.nan, batch=32,
                             alpha=0.8, A=0.3, eta=1, epochs=40, boost=2.6012, acc_drop_pp=53.912, mem_cut=1.0123,
                             co2e_cut=2.55, budget_adherence=math.nan, top1=43.3))
    frame = pd.DataFrame(rows)
    frame["seed"] = 0
    return frame


def _make_store(folder: Path, profile: str) -> tuple[str, list[str]]:
    """The store and the run names in the table's order."""
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    record = folder / "cell.json"
    record.write_text("{}")
    rows = _quick_rows()
    # Logged out of order (as parallel jobs finish): the view orders them.
    for _, row in rows.sample(frac=1.0, random_state=1).iterrows():
        log_cell_run(uri, "table1", f"{profile}/{row['model']}/s0/{row['cell']}", params={"cell": {"t": row["t"]}},
                     metrics={"top1": row["top1"], "epochs": row["epochs"]}, curves={"train_loss": [1.0, 0.5]},
                     tags={"profile": profile, "model": row["model"], "method": row["method"], "cell": row["cell"],
                           "seed": 0, "dataset_label": "GENERATED: synth benchmark (the UI test's store)"},
                     artifacts=[record])
    paper, baselines = load_paper_table1()
    figures = mlflow_row_figures(rows, paper, baselines, table1_row_numbers(rows))
    follow_table(uri, "table1", profile, {f"{profile}/{m}/s{s}/{c}": v for (m, s, c), v in figures.items()},
                 f"{profile}/table1", [record])
    return uri, [f"{profile}/{m}/s0/{c}" for m, c in zip(rows["model"], rows["cell"])]


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


# Every header of the grid with its box, and whether its text is whole (not clipped).
_HEADERS_JS = """() => [...document.querySelectorAll('.ag-header-cell[col-id]')].map(e => {
    const box = e.getBoundingClientRect();
    const label = e.querySelector('[data-testid^="sort-header-"]') || e.querySelector('.ag-header-cell-text');
    const holder = label ? label.parentElement : e;
    return {id: e.getAttribute('col-id'), text: e.innerText.trim(), left: box.left, right: box.right,
            whole: !label || (holder.scrollWidth <= holder.clientWidth + 0.5)};
})"""
_GRID_JS = "() => { const r = document.querySelector('.ag-root').getBoundingClientRect(); return [r.left, r.right]; }"


def _headers(page) -> list[dict]:
    return sorted(page.evaluate(_HEADERS_JS), key=lambda header: header["left"])


def test_make_mlflow_ui_shows_table1_beside_the_paper_on_the_first_screen(tmp_path):
    missing = _missing()
    if missing:
        if REQUIRED:
            pytest.fail(missing)
        pytest.skip(missing)
    from playwright.sync_api import sync_playwright

    from darel import config

    profile = config.load_params(ROOT / "params.yaml")["profile"]
    uri, names = _make_store(tmp_path, profile)
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
    expected = [RUN_NAME_COLUMN, CREATED_COLUMN] + [column for column, _ in TABLE_VIEW_COLUMNS["table1"]]
    try:
        printed = ""
        while "Columns:" not in printed:
            line = proc.stdout.readline()
            assert line, f"mlflow-ui printed no address:\n{printed}"
            printed += line
        url = re.search(r"http://\S+/#/experiments/\S+", printed).group(0)
        assert "workflowType=machine_learning" in url and "viewStateShareKey=" in url
        assert f"Views (top right) -> {table_view_name('table1', profile, generated=True)}" in printed, printed
        _wait_up(base, proc)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            try:
                # 1. The printed address in a fresh browser: the whole view, no click.
                page = browser.new_context(viewport={"width": WIDTH, "height": HEIGHT}).new_page()
                page.goto(url)
                page.wait_for_selector(f"text={names[-1]}", timeout=90_000)
                page.wait_for_selector('.ag-header-cell[col-id="tags.`calibrated`"]', timeout=30_000)
                time.sleep(1)  # the column widths are applied once the grid has drawn
                page.screenshot(path=str(tmp_path / "first_screen.png"))
                text = page.inner_text("body")
                headers = _headers(page)
                grid = page.evaluate(_GRID_JS)
                rows = page.eval_on_selector_all(
                    ".ag-pinned-left-cols-container .ag-row",
                    "els => els.map(e => [Number(e.getAttribute('row-index')), e.querySelector('a').innerText.trim()])")
                cells = page.eval_on_selector_all(
                    ".ag-center-cols-container .ag-row",
                    "els => els.map(e => [Number(e.getAttribute('row-index')), [...e.querySelectorAll('.ag-cell[col-id]')]"
                    ".map(c => [c.getAttribute('col-id'), c.innerText.trim()])])")
                assistant_open = page.get_by_text("Ask questions about your experiments").count() > 0

                # 2. A person who starts at MLflow's home page and clicks the experiment.
                person = browser.new_context(viewport={"width": WIDTH, "height": HEIGHT}).new_page()
                person.goto(f"{base}/")
                experiment_link = person.get_by_role("link", name="table1", exact=True).first
                experiment_link.wait_for(timeout=90_000)
                home = person.inner_text("body")
                experiment_link.click(timeout=90_000)
                person.wait_for_selector('[data-testid="saved-views-trigger"]', timeout=90_000)
                person.wait_for_selector("text=matching runs", timeout=30_000)
                person.screenshot(path=str(tmp_path / "experiment_page.png"))
                landed = person.inner_text("body")
                person.click('[data-testid="saved-views-trigger"]')
                # (the description names the view too: the menu's item is the one to click)
                person.get_by_test_id(f"saved-views-item-{table_view_key(profile)}").get_by_text(
                    table_view_name("table1", profile, generated=True)).click()
                person.wait_for_selector('.ag-header-cell[col-id="metrics.`boost paper`"]', timeout=30_000)
                person.wait_for_selector(f"text={names[-1]}", timeout=30_000)
                from_menu = [header["id"] for header in _headers(person)]
            finally:
                browser.close()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    # The training runs, not the GenAI overview; no assistant panel over the table.
    assert "matching runs" in text and not assistant_open, text[:2000]
    assert f"{len(names)} matching runs" in text
    assert f"{profile}/table1" not in text and "[dvc exp" not in text
    # Every column of the view inside the grid and the window, whole, in the view's order.
    shown = [header for header in headers if header["id"] in expected]
    assert [header["id"] for header in shown] == expected, [header["id"] for header in headers]
    for header in shown:
        assert header["left"] >= grid[0] - 1 and header["right"] <= min(grid[1], WIDTH) + 1, (header, grid)
        assert header["whole"], header
    # No header of the UI's own is cut at the grid's edge either (its "Duration" starts outside).
    cut = [header for header in headers if header["left"] < grid[1] - 1 and header["right"] > grid[1] + 1]
    assert not cut, (cut, grid)
    # The rows in the paper's order: per model its baseline, the paper's budgets in order, IDS + ADONIS last.
    by_index = dict(rows)
    assert [by_index[i] for i in sorted(by_index)] == names
    # Rounded figures, the paper's beside ours, the settings as text.
    first = dict(dict(cells)[1])  # B(1, 1) of resnet18
    assert first["metrics.`boost`"] == "1.23" and first["metrics.`boost paper`"] == "1.46"
    assert first["metrics.`drop`"] == "12.35" and first["metrics.`drop paper`"] == "3.01"
    assert first["metrics.`adherence`"] == "1.227" and first["tags.`calibrated`"] == "32/0.80/0.43/3/40"
    ids = dict(dict(cells)[names.index(f"{profile}/resnet18/s0/ids_adonis")])
    assert ids["metrics.`boost paper`"] == "1.49" and ids["metrics.`drop paper`"] == "2.8"
    every = [value for _, row in cells for _, value in row]
    assert not any(re.fullmatch(r"-?\d+\.\d{4,}", value) for value in every), sorted(set(every))
    # The home page without MLflow's usage-data notice (telemetry is off for this server).
    assert "Welcome to MLflow" in home and "collects usage data" not in home, home[:2000]
    # From the home page: the experiment's training runs, no "Detect Issues" pop-up, the view in the Views menu.
    assert "matching runs" in landed and "Detect Issues" not in landed, landed[:2000]
    # The experiment page shows its description: what the table is, on what data.
    assert f"{DESCRIPTION_START}: {profile} profile on GENERATED data" in landed, landed[:2000]
    assert [column for column in from_menu if column in expected] == expected
