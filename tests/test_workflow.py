"""Real Snakemake, DVC and MLflow runs of a tiny profile in a temporary copy of the repo."""

import base64
import json
import math
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from darel import data, provenance
from darel.budget import selection_ratios
from tests.conftest import ROOT, build_differences, copy_worktree, tiny_project

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
LEADING = ["model", "method", "batch", "alpha", "A", "eta", "epochs", "boost", "acc_drop_pp", "mem_cut", "co2e_cut"]


def _env():
    env = dict(os.environ)
    env["PATH"] = f"{BIN}:{env['PATH']}"
    env["MLFLOW_DISABLE_TELEMETRY"] = "true"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _run(cmd, cwd, check=True):
    # The timeout only catches a hang: a busy machine may run these many times slower. The
    # project copy's own package runs (PYTHONPATH), with whatever a test added to it.
    proc = subprocess.run(cmd, cwd=cwd, env={**_env(), "PYTHONPATH": str(cwd)}, capture_output=True, text=True,
                          timeout=3600)
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


def _tiny_params(params: dict) -> dict:
    quick = params["profiles"]["quick"]
    quick["models"]["resnet18"] = {"width": 4, "epochs": 3, "milestones": [2], "warmup_epochs": 1}
    quick["table1"] = {"resnet18": [[1.0, 1.0], [0.5, 0.55]]}
    params["profiles"]["paper"]["table1"] = {"resnet18": [[1.0, 1.0], [0.5, 0.55]]}
    params.pop("comparisons", None)
    params["study"]["seeds"] = [0, 1]
    # The study's budget is Table 1's t = 1 cell: at a tight one (t = 0.5) a busy machine can
    # skew the calibration's timings until not even DAREL's warm-up epoch fits t_max.
    params["study"]["table1"].update(budgets={"quick": [[1.0, 1.0]]},
                                     methods=["darel", "random", "darel-restream", "oracle-clean"])
    params["study"]["table1"]["primary"]["methods"] = ["random"]
    return params


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A copy of the working tree (tracked and untracked-but-not-ignored files), as a git repo."""
    dest = tiny_project(tmp_path_factory.mktemp("project"), _tiny_params)
    _run([str(BIN / "snakemake"), "--cores", "2", "results/table1.csv"], dest)
    return dest


def test_snakemake_builds_table1_with_exact_columns(project):
    table = pd.read_csv(project / "results/table1.csv")
    assert list(table.columns[: len(LEADING)]) == LEADING
    assert list(table["method"]) == ["baseline", "darel", "darel"]
    assert table.loc[0, "boost"] == 1 and table.loc[0, "acc_drop_pp"] == 0
    assert table["dataset_label"].str.startswith("GENERATED: synth benchmark").all()
    # The quick profile's data set is the generated benchmark, with its per-sample categories.
    import numpy as np

    with np.load(project / "data/quick/train.npz") as train:
        assert {"category", "rare", "true_labels", "duplicate_of"} <= set(train.files)
        assert len(train["category"]) == 600 and (train["labels"] != train["true_labels"]).sum() == 60
    assert json.loads((project / "data/quick/meta.json").read_text())["generated"] is True
    md = (project / "results/table1_vs_paper.md").read_text()
    assert "QUICK" in md.upper()
    assert (project / "results/table1.png").stat().st_size > 0


def test_table_numbers_recompute_from_cell_jsons(project):
    table = pd.read_csv(project / "results/table1.csv").set_index("cell")
    cells = {p.stem: json.loads(p.read_text()) for p in (project / "results/cells/quick/table1/resnet18/s0").glob("*.json")}
    assert set(cells) == {"baseline", "t1.00_m1.00", "t0.50_m0.55"}
    base = cells["baseline"]
    required = {"time_s", "top1", "peak_mem_bytes", "co2e_kg", "energy_kwh", "batch", "alpha", "A", "eta", "epochs",
                "t", "m", "T_full_s", "M_full_bytes", "T_new_s"}
    for name, cell in cells.items():
        assert required <= set(cell), name
        assert cell["T_full_s"] == base["time_s"] and cell["M_full_bytes"] == base["peak_mem_bytes"]
        row = table.loc[name]
        assert row["boost"] == pytest.approx(base["time_s"] / cell["time_s"], rel=1e-3)
        assert row["acc_drop_pp"] == pytest.approx(base["top1"] - cell["top1"], abs=0.006)  # CSV keeps 2 decimals
        assert row["mem_cut"] == pytest.approx(base["peak_mem_bytes"] / cell["peak_mem_bytes"], rel=1e-3)
    # Eq. 2-5 recomputed from the calibration artifact.
    for name in ("t1.00_m1.00", "t0.50_m0.55"):
        cal = json.loads((project / f"runs/quick/table1/resnet18/s0/{name}/calibration.json").read_text())
        again = selection_ratios(cal["T_full_s"], cal["t"], cal["T_new_s"], cal["alpha_default"], cal["A_min"],
                                 cal["A_max"])
        for key in ("alpha", "A", "eta"):
            assert again[key] == pytest.approx(cal[key]) and cells[name][key] == pytest.approx(cal[key])
        assert cal["batch"] == cells[name]["batch"]
        # T_new relative to the probe at the baseline batch of the same session.
        n, b, B = cal["n_samples"], cal["batch"], cal["reference_batch"]
        assert cal["T_new_s"] == pytest.approx(
            cal["T_full_s"] * cal["t_b_s"] * math.ceil(n / b) / (cal["t_ref_s"] * math.ceil(n / B)))
        probe = {p["batch"]: p for p in cal["probes"]}[cal["batch"]]
        assert probe["peak_mem_bytes"] <= cal["m_max_bytes"]
        # Plan enforcement: exactly the planned epochs; adherence is measured time / t_max.
        assert cells[name]["epochs"] == cells[name]["epochs_planned"] == cal["planned_epochs"]
        assert cells[name]["budget_adherence"] == pytest.approx(cells[name]["time_s"] / cal["t_max_s"])
        assert table.loc[name, "budget_adherence"] == pytest.approx(cells[name]["budget_adherence"], abs=6e-4)
    # Time and energy cover the same intervals: the tracker's readings bracket every timed
    # epoch (tests/test_engine.py also bounds them by the call's wall clock).
    for name in cells:
        train = json.loads((project / f"runs/quick/table1/resnet18/s0/{name}/train.json").read_text())
        assert train["time_s"] <= train["energy"]["duration_s"], name
        assert train["energy"]["timed_intervals"] == train["epochs_completed"]
    # The budgeted cell trained on exactly the offline subset of ceil(alpha * n) per class.
    subset = json.loads((project / "runs/quick/table1/resnet18/s0/t0.50_m0.55/train.json").read_text())
    assert subset["n_train"] < subset["n_train_full"]


def test_a_second_build_from_the_same_calibration_gives_the_same_bits(project, tmp_path_factory):
    """Issue 32: a budget cell built again in a fresh folder, with --cores 1 (the first had 2),
    from the first build's calibration (timed by design, so
    pinned: --config calibrations_from): its baseline, scorer losses, subset, trained
    weights, evaluation and cell record equal the first build's in every field but the
    measurements (tests/conftest.py lists them by name); the results hashes agree."""
    second = tiny_project(tmp_path_factory.mktemp("second_build"), _tiny_params)
    cell = "results/cells/quick/table1/resnet18/s0/t0.50_m0.55.json"
    calibration = "runs/quick/table1/resnet18/s0/t0.50_m0.55/calibration.json"
    _run([str(BIN / "snakemake"), "--cores", "1", cell, "--config", f"calibrations_from={project}"], second)
    reused = json.loads((second / calibration).read_text())["reused_from"]
    assert reused["path"] == str((project / calibration).resolve())
    differences, compared = build_differences(project, second, ["data/quick", "runs/quick/table1", "results/cells"])
    assert compared >= 12 and differences == []
    ours, theirs = (json.loads((root / cell).read_text()) for root in (second, project))
    assert ours["results_sha256"] == theirs["results_sha256"]


def test_second_snakemake_run_does_nothing(project):
    out = _run([str(BIN / "snakemake"), "--cores", "2", "results/table1.csv"], project)
    assert "Nothing to be done" in out.stdout + out.stderr


def test_make_report_holds_the_tables_with_their_captions_and_the_data_label(project):
    """`make report`'s two commands (read from the Makefile) give one HTML file holding Table 1's
    rows, comparison and plot with their captions, the data card with its GENERATED label and
    the workflow's note on the data, and build nothing else."""
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^report:.*\n((?:\t.*\n)+)", makefile, re.M).group(1)
    commands = [line.strip().removeprefix("$(BIN)/") for line in recipe.splitlines() if "$(BIN)/snakemake" in line]
    assert commands == ["snakemake --cores 1 results/data_card.md",
                        "snakemake --report results/report.html $(REPORT_TARGETS)"]
    assert re.search(r"^REPORT_TARGETS \?= results/table1.csv results/data_card.md \$\(wildcard ", makefile, re.M)
    _run([str(BIN / "snakemake"), "--cores", "1", "results/data_card.md"], project)
    card = (project / "results" / "data_card.md").read_text()
    assert card.startswith("# The data of this build\n\n**GENERATED: synth benchmark") and "## Sizes" in card
    out = _run([str(BIN / "snakemake"), "--report", "results/report.html", "results/table1.csv",
                "results/data_card.md"], project)
    assert "Report created" in out.stdout + out.stderr
    html = (project / "results" / "report.html").read_text(errors="replace")
    # The report embeds each file whole (a base64 data URI in its `results` object): the
    # table's rows, the comparison and the card are the built files, byte for byte.
    embedded = json.loads(re.search(r"var results = (\{.*?\});\s*</script>", html, re.S).group(1))
    for name in ("table1.csv", "table1_vs_paper.md", "table1.png", "data_card.md"):
        uri = embedded[f"results/{name}"]["data_uri"]
        assert base64.b64decode(uri.split("base64,", 1)[1]) == (project / "results" / name).read_bytes(), name
    assert "Read the data label first" in html  # workflow/report/workflow.rst
    assert "rows that ran over their time budget" in html  # the comparison's caption
    again = _run([str(BIN / "snakemake"), "--cores", "2", "results/table1.csv"], project)
    assert "Nothing to be done" in again.stdout + again.stderr


def test_dvc_repro_gives_the_same_table_and_then_nothing(project):
    before = (project / "results/table1.csv").read_bytes()
    # The table1 stage and what it depends on (named, so the test stays about Table 1 when
    # Tables 2/3 get DVC stages).
    first = _run([str(BIN / "dvc"), "repro", "table1"], project)
    assert (project / "results/table1.csv").read_bytes() == before, first.stdout
    second = _run([str(BIN / "dvc"), "repro", "table1"], project)
    assert "didn't change" in second.stdout or "up to date" in second.stdout, second.stdout
    assert (project / "results/table1.csv").read_bytes() == before


def _mlflow(project):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{project / 'mlflow.db'}")


def test_mlflow_store_holds_one_run_per_cell(project):
    client = _mlflow(project)
    exp = client.get_experiment_by_name("table1")
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"  # the UI opens on the runs
    runs = client.search_runs([exp.experiment_id])
    assert sorted(r.data.tags["cell_key"] for r in runs) == [
        "quick/resnet18/s0/baseline", "quick/resnet18/s0/t0.50_m0.55", "quick/resnet18/s0/t1.00_m1.00",
        "quick/table1"]
    for run in runs:
        key = run.data.tags["cell_key"]
        if key == "quick/table1":  # the table's own files
            assert {a.path for a in client.list_artifacts(run.info.run_id)} >= {
                "table1.csv", "table1_vs_paper.md", "table1.png", "table1_metrics.json"}
            continue
        cell = key.rsplit("/", 1)[1]
        assert run.info.status == "FINISHED" and run.data.tags["state"] == "finished"
        for tag in ("model", "method", "seed", "profile", "energy_covers", "git_commit", "device", "torch_version"):
            assert tag in run.data.tags, tag
        # The full training settings, not just the cell's coordinates.
        for param in ("params.protocol.lr", "params.protocol.width", "params.protocol.epochs",
                      "plan.batch", "cell.batch", "cell.alpha", "cell.A"):
            assert param in run.data.params, param
        # The raw measurements, and the table's figures under the view's names (darel.table1.MLFLOW_FIGURES).
        for metric in ("top1", "time_s", "peak_mem_bytes", "energy_kwh", "co2e_kg", "boost", "drop", "mem", "row",
                       "boost paper", "drop paper"):
            assert metric in run.data.metrics, metric
        assert re.fullmatch(r"\d+/[\d.]+/[\d.]+/(\d+|—)/\d+", run.data.tags["calibrated"]), run.data.tags
        if cell != "baseline":
            assert "budget_adherence" in run.data.metrics and "plan.train_epochs" in run.data.params
        history = client.get_metric_history(run.info.run_id, "train_loss")
        assert [m.step for m in history] == list(range(len(history))) and len(history) >= 1
        artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
        assert {"train.json", f"{cell}.json"} <= artifacts and any(a.endswith(".log") for a in artifacts)
        # The quick profile has no live run (live_tracking: false): the tracking job made the run
        # after train.json was written, its run plan (plan.*, above) and curves from that record.
        assert yaml.safe_load((project / "params.yaml").read_text())["profiles"]["quick"]["live_tracking"] is False
        train_json = project / f"runs/quick/table1/resnet18/s0/{cell}/train.json"
        assert run.info.start_time >= int(train_json.stat().st_mtime * 1000)
    boost = {r.data.tags["cell_key"]: r.data.metrics.get("boost") for r in runs}
    table = pd.read_csv(project / "results/table1.csv").set_index("cell")
    # The run shows the table's figure rounded to 2 decimals (the MLflow UI prints every digit).
    assert boost["quick/resnet18/s0/t0.50_m0.55"] == pytest.approx(table.loc["t0.50_m0.55", "boost"], abs=6e-3)


def test_dvc_metrics_plots_and_experiments_say_something(project):
    """`dvc metrics show`: one short row of headline figures; `dvc plots show`: a page with
    Table 1's image and nothing to load from the network; `dvc exp show` as the README
    writes it (no terminal): each experiment's figures, no "!" and no column cut to "..."."""
    subprocess.run(["git", "checkout", "-q", "--", "params.yaml"], cwd=project, check=True)
    _run([str(BIN / "dvc"), "repro", "table1"], project)
    shown = _run([str(BIN / "dvc"), "metrics", "show", "results/table1_metrics.json"], project)
    text = shown.stdout + shown.stderr
    assert "failed" not in text.lower(), text
    header, row = [line.split() for line in shown.stdout.strip().splitlines()[:2]]
    assert header == ["Path", "acc_drop_pp_mean", "adherence_mean", "boost_max", "boost_mean", "darel_rows"], header
    metrics = json.loads((project / "results/table1_metrics.json").read_text())
    assert row[0] == "results/table1_metrics.json" and float(row[4]) == pytest.approx(metrics["boost_mean"])

    plots = _run([str(BIN / "dvc"), "plots", "show", "results/table1.png"], project)
    page = (project / "dvc_plots/index.html").read_text()
    assert "dvc_plots/index.html" in plots.stdout and "failed" not in (plots.stdout + plots.stderr).lower()
    assert re.search(r'<img src="static/[^"]*table1\.png"', page) and "<script" not in page and "http" not in page
    ignored = subprocess.run(["git", "status", "--porcelain", "--ignored", "dvc_plots"], cwd=project,
                             capture_output=True, text=True).stdout
    assert ignored.startswith("!!"), ignored  # git-ignored

    _run([str(BIN / "dvc"), "exp", "run", "-n", "same-params", "table1"], project)
    keep = "Experiment|profile$|.*_mean$|.*boost_max$"  # the README's column choice
    exps = _run([str(BIN / "dvc"), "exp", "show", "--md", "--drop", ".*", "--keep", keep], project).stdout
    line = next(line for line in exps.splitlines() if "[same-params]" in line)
    cells = [cell.strip() for cell in line.strip("|").split("|")]
    assert "!" not in cells and "…" not in exps and "..." not in exps, exps
    assert str(metrics["boost_mean"]).rstrip("0")[:5] in line, exps
    assert "acc_drop_pp_mean" in exps and "adherence_mean" in exps


def _planned_outputs(project, *config) -> set[str]:
    """The outputs of every job a dry run plans (with ``--config`` overrides)."""
    out = _run([str(BIN / "snakemake"), "--cores", "1", "--dry-run", "results/table1.csv",
                *(["--config", *config] if config else [])], project).stdout
    return {line.strip() for line in out.splitlines() if line.strip().startswith("output:")}


def test_changing_one_budget_reruns_only_that_cell(project):
    """A budget renamed on the quick profile: the dry run plans that cell alone, says it is
    a new cell (not a damaged one) and forces nothing; the paper profile's plan, from its
    own budgets, does not change."""
    paper_before = _planned_outputs(project, "profile=paper")
    params_file = project / "params.yaml"
    params = yaml.safe_load(params_file.read_text())
    params["profiles"]["quick"]["table1"]["resnet18"][1] = [0.5, 0.7]
    params_file.write_text(yaml.safe_dump(params, sort_keys=False))
    done = _run([str(BIN / "snakemake"), "--cores", "1", "--dry-run", "results/table1.csv"], project)
    out = done.stdout
    stats = out.split("Job stats:")[1]
    counts = {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", stats, re.MULTILINE)}
    assert counts == {"calibrate": 1, "cell_record": 1, "materialise_subset": 1, "table1": 1,
                      "track_cell": 1, "train_online": 1, "total": 6}, out
    assert "runs/quick/table1/resnet18/s0/t0.50_m0.70/train.json" in out
    said = done.stdout + done.stderr
    assert "1 new cell(s), not in the table yet (resnet18/s0/t0.50_m0.70)" in said, said[-3000:]
    assert "Forced execution" not in said and "are missing" not in said, said[-3000:]
    paper_after = _planned_outputs(project, "profile=paper")
    assert paper_after == paper_before and any("runs/paper/table1/" in line for line in paper_after)


def _one_run_per_table1_row(project) -> list[str]:
    """The cell keys of Table 1's cell runs in the project's MLflow store, checked to be
    exactly one per row of results/table1.csv."""
    table = pd.read_csv(project / "results/table1.csv")
    client = _mlflow(project)
    runs = client.search_runs([client.get_experiment_by_name("table1").experiment_id])
    keys = sorted(r.data.tags["cell_key"] for r in runs if r.data.tags.get("kind") != "table")
    assert keys == sorted(f"quick/resnet18/s0/{cell}" for cell in table["cell"])
    return keys


def test_renamed_budget_leaves_one_active_run_per_table_row(project):
    """(Follows the budget change above.) MLflow follows the table: the run of the cell that
    left the table is deleted, the new cell's run added."""
    _run([str(BIN / "snakemake"), "--cores", "2", "results/table1.csv"], project)
    keys = _one_run_per_table1_row(project)
    assert "quick/resnet18/s0/t0.50_m0.70" in keys and "quick/resnet18/s0/t0.50_m0.55" not in keys


def test_an_empty_tracking_store_is_refused_and_costs_no_result(project):
    """A cell whose tracking is still to do (its marker and the table gone) meets an emptied
    store: its tracking job stops naming the file, nothing is written to the store, no
    result is lost, and once the store is back the same command completes the run and the table."""
    db = project / "mlflow.db"
    saved = db.read_bytes()
    cell = project / "results/cells/quick/table1/resnet18/s0/t1.00_m1.00.json"
    marker = project / "runs/quick/table1/resnet18/s0/t1.00_m1.00/mlflow.json"
    table = project / "results/table1.csv"
    before = cell.read_bytes()
    marker.unlink()
    table.unlink()
    try:
        db.write_bytes(b"")
        proc = _run([str(BIN / "snakemake"), "--cores", "2", "results/table1.csv"], project, check=False)
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0
        assert "mlflow.db is an empty file (0 bytes)" in out and "Traceback" not in out
        assert db.read_bytes() == b""  # not silently recreated
        assert cell.read_bytes() == before  # the cell's results are intact
        assert not marker.exists() and not table.exists()  # nothing claims the run is complete
    finally:
        db.write_bytes(saved)
    _run([str(BIN / "snakemake"), "--cores", "2", "results/table1.csv"], project)
    assert marker.exists() and table.exists() and cell.read_bytes() == before


def test_bad_override_stops_before_any_job(project):
    out = _run([str(BIN / "snakemake"), "--cores", "1", "--dry-run", "results/table1.csv",
                "--config", "darel={mode: medium}"], project, check=False)
    assert out.returncode != 0
    assert "darel.mode = 'medium'" in out.stdout + out.stderr


def _job_counts(out: str) -> dict[str, int]:
    if "Job stats:" not in out:
        return {}
    stats = out.split("Job stats:")[1]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", stats, re.MULTILINE)}


def test_dry_run_with_no_flags_applies_the_default_profile(tmp_path):
    copy_worktree(tmp_path)
    out = _run([str(BIN / "snakemake"), "-n", "results/table1.csv"], tmp_path)
    text = out.stdout + out.stderr
    assert "Using workflow specific profile profiles/default" in text
    jobs = re.split(r"\n(?=(?:local)?rule \w+:)", text)
    timed = [job for job in jobs if re.match(r"(?:local)?rule (pretrain_scorer|calibrate):", job)]
    # the quick profile's planned_side_by_side: a planned training takes one core, no timed slot
    planned = [job for job in jobs if re.match(r"(?:local)?rule train_online:", job)]
    untimed = [job for job in jobs if re.match(r"(?:local)?rule (score_losses|evaluate|cell_record):", job)]
    assert timed and planned and untimed
    for job in timed:  # every core ("cores: all") and the one-at-a-time resource
        assert re.search(r"resources: .*\btimed=1\b", job), job
        assert re.search(rf"threads: {os.cpu_count()}\b", job), job
    for job in untimed + planned:
        assert "timed=1" not in job, job
        assert not re.search(r"threads: (?!1\b)\d+", job), job


def test_profile_switch_plans_the_other_profiles_cells_and_keeps_these(project):
    out = _run([str(BIN / "snakemake"), "-n", "results/table1.csv", "--config", "profile=paper"], project)
    text = out.stdout + out.stderr
    table_job = text.split("rule table1:")[1].split("\n\n")[0]
    cells = re.findall(r"results/cells/(\w+)/table1/", table_job.split("output:")[0])
    assert cells and set(cells) == {"paper"}
    paper_seeds = yaml.safe_load((project / "params.yaml").read_text())["profiles"]["paper"]["seeds"]
    assert _job_counts(text)["pretrain_scorer"] == len(paper_seeds)  # the paper profile's own baselines
    back = _run([str(BIN / "snakemake"), "-n", "results/table1.csv"], project)
    assert "Nothing to be done" in back.stdout + back.stderr  # the quick results were not touched


def test_infeasible_memory_budget_names_the_budget_and_the_least_m(project):
    params_file = project / "params.yaml"
    committed = params_file.read_text()
    params = yaml.safe_load(committed)
    params["profiles"]["quick"]["table1"]["resnet18"].append([1.0, 0.01])
    params_file.write_text(yaml.safe_dump(params, sort_keys=False))
    try:
        out = _run([str(BIN / "snakemake"), "--cores", "2", "results/table1.csv"], project, check=False)
    finally:
        params_file.write_text(committed)
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert "budget [1.0, 0.01] of resnet18 (profiles.<profile>.table1.resnet18" in text, text[-3000:]
    assert "smallest feasible m" in text, text[-3000:]
    assert "Traceback" not in text


def test_damaged_data_file_is_recreated_and_costs_no_training(project):
    weights = project / "runs/quick/table1/resnet18/s0/baseline/model.pt"
    before = weights.read_bytes()
    data = project / "data/quick/train.npz"
    good = data.read_bytes()
    with open(data, "r+b") as handle:
        handle.truncate(2000)
    out = _run([str(BIN / "snakemake"), "--cores", "2", "results/table1.csv"], project)
    text = out.stdout + out.stderr
    assert "data/quick/train.npz was damaged or missing: re-created" in text and "Nothing to be done" in text, \
        text[-3000:]
    assert data.read_bytes() == good and weights.read_bytes() == before


def test_failed_dvc_experiment_leaves_params_as_committed(project):
    """(Also brings params.yaml back to the committed budgets: the table returns to the
    cell that left it, and MLflow follows with exactly one active run per row.)"""
    subprocess.run(["git", "checkout", "-q", "--", "params.yaml"], cwd=project, check=True)
    committed = (project / "params.yaml").read_bytes()
    out = _run([str(BIN / "dvc"), "exp", "run", "-S", "darel.mode=medium", "table1"], project, check=False)
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert "darel.mode = 'medium'" in text and "back at the last commit" in text, text[-3000:]
    assert (project / "params.yaml").read_bytes() == committed
    kept = list(project.glob("params.failed-*.yaml"))
    assert len(kept) == 1 and "mode: medium" in kept[0].read_text()
    kept[0].unlink()
    out = _run([str(BIN / "snakemake"), "-n", "results/table1.csv"], project)  # no config error any more
    assert set(_job_counts(out.stdout + out.stderr)) <= {"table1", "track_cell", "total"}, out.stdout
    _run([str(BIN / "snakemake"), "--cores", "2", "results/table1.csv"], project)
    keys = _one_run_per_table1_row(project)
    assert "quick/resnet18/s0/t0.50_m0.55" in keys


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_mlflow_server_shows_the_experiment(project):
    port = _free_port()
    env = _env()
    env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"
    proc = subprocess.Popen([str(BIN / "mlflow"), "server", "--backend-store-uri", "sqlite:///mlflow.db",
                             "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                            cwd=project, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}/api/2.0/mlflow/experiments/get-by-name?experiment_name=table1"
        deadline = time.time() + 90
        body = None
        while time.time() < deadline and body is None:
            try:
                with urllib.request.urlopen(url, timeout=5) as resp:
                    body = json.loads(resp.read())
            except OSError:
                time.sleep(1)
        assert body is not None, "mlflow server did not answer within 90 s"
        assert body["experiment"]["name"] == "table1"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def _both_models_and_the_comparison(params: dict) -> dict:
    """One budget per model beside the IDS + ADONIS row: every rule and model of Table 1
    (the other budgets run the same rules with other numbers; `make quick` builds them
    all), with width, epochs and calibration probes cut to keep CI short."""
    quick = params["profiles"]["quick"]
    quick["models"]["resnet18"].update(width=4, epochs=3, milestones=[2], warmup_epochs=1)
    quick["models"]["resnet18_hc"].update(width=4, epochs=3, warmup_epochs=1)
    params["budget"].update(probe_warmup=1, probe_repeats=1, probe_rounds=2)
    quick["table1"] = {"resnet18": [[0.5, 0.55]], "resnet18_hc": [[0.8, 0.8]]}
    return params


def test_both_models_and_the_ids_adonis_row_build(tmp_path):
    project = tiny_project(tmp_path, _both_models_and_the_comparison)
    _run([str(BIN / "snakemake"), "--cores", "2", "results/table1.csv"], project)
    table = pd.read_csv(project / "results/table1.csv")
    ids = yaml.safe_load((ROOT / "params.yaml").read_text())["comparisons"]["ids_adonis"]
    # Two baselines, one budget each, the IDS + ADONIS row.
    assert sorted(zip(table["model"], table["method"])) == [
        ("resnet18", "baseline"), ("resnet18", "darel"), ("resnet18", "ids+adonis"),
        ("resnet18_hc", "baseline"), ("resnet18_hc", "darel")]
    ids_row = table[table["method"] == "ids+adonis"]
    assert ids_row["A"].item() == ids["A"] and ids_row["eta"].item() == ids["eta"]
    assert ids_row["alpha"].item() == ids["keep_ratio"]
    compare = (project / "results/table1_vs_paper.md").read_text()
    assert "1650" in compare and "73.06" in compare  # the paper's figures beside ours
    hc_cells = {p.stem for p in (project / "results/cells/quick/table1/resnet18_hc/s0").glob("*.json")}
    assert hc_cells == {"baseline", "t0.80_m0.80"}


# The tiny studies run at Table 1's t = 1 tiny cell: already calibrated, and its warm-up
# epoch leaves room in t_max however skewed a busy machine makes the calibration.
STUDY_CELL, STUDY_BUDGET = "t1.00_m1.00", "B(t=1.00, m=1.00)"


def test_tiny_study_compares_darel_with_a_control_over_two_seeds(project):
    # A new control is one folder in darel/methods (tests/data/toy_method.py: its own training
    # set, selection, settings and plan) plus its settings: no other file changes.
    (project / "darel/methods/toy").mkdir()
    (project / "darel/methods/toy/__init__.py").write_text((ROOT / "tests/data/toy_method.py").read_text())
    _run([str(BIN / "snakemake"), "--cores", "2", "results/study_table1.csv", "--config",
          "study={table1: {methods: [darel, random, toy, darel-restream, oracle-clean]}}",
          "controls={toy: {offset: 5}}"], project)
    rows = pd.read_csv(project / "results/study_table1.csv")
    # Every run recorded what ran beside it, and the verdict file says so in its design.
    assert rows["cores_beside"].notna().all() and (rows["cores_beside"] >= 0).all()
    assert "runs recorded it): median " in (project / "results/study_table1.md").read_text()
    # Rare and common classes apart (issue 50 item 3): every run, and a secondary table each in the verdict.
    assert rows["top1_rare"].notna().all() and rows["top1_common"].notna().all()
    assert "### Top-1 on the rare classes' test images" in (project / "results/study_table1.md").read_text()
    # What each run trained on, by the generated benchmark's categories (issue 28 item 6).
    shares = rows[[f"trained_share_{name}" for name in ("clean", "label-noise", "near-duplicate", "hard")]]
    assert ((shares.sum(axis=1) - 1).abs() < 1e-9).all() and (rows["data_share_label-noise"] > 0).all()
    assert sorted(zip(rows["method"], rows["seed"])) == [("baseline", 0), ("baseline", 1), ("darel", 0),
                                                         ("darel", 1), ("darel-restream", 0), ("darel-restream", 1),
                                                         ("oracle-clean", 0), ("oracle-clean", 1), ("random", 0),
                                                         ("random", 1), ("toy", 0), ("toy", 1)]
    # The study's own controls ran: the oracle trained on no noisy label and the random
    # control's class counts; darel-restream on DAREL's subset, drawn by another stream.
    oracle = rows[rows["method"] == "oracle-clean"]
    assert (oracle["trained_share_label-noise"] == 0).all() and (oracle["data_share_label-noise"] > 0).all()
    train_data, _, _ = data.read_dataset(str(project / "data/quick"))
    for seed in (0, 1):
        folder = project / f"runs/quick/study_table1/resnet18/s{seed}/{STUDY_CELL}"
        kept, drawn = (np.load(folder / f"{name}_subset.npz")["indices"] for name in ("oracle-clean", "random"))
        labels, clean = train_data["labels"], train_data["category"] != 1
        # random's class counts, or every clean sample of a (rare) class with fewer left
        assert np.array_equal(np.bincount(labels[kept], minlength=10),
                              np.minimum(np.bincount(labels[drawn], minlength=10),
                                         np.bincount(labels[clean], minlength=10)))
        assert not (train_data["category"][kept] == 1).any() and (train_data["category"][drawn] == 1).any()
        twins = [provenance.read_record(folder / name / "train.json") for name in ("darel", "darel-restream")]
        assert twins[0]["n_train"] == twins[1]["n_train"] and twins[0]["epochs_completed"] == twins[1]["epochs_completed"]
        assert twins[0]["curves"] != twins[1]["curves"]  # the same run but for the sampler's draws
    for seed in (0, 1):
        toy = project / f"runs/quick/study_table1/resnet18/s{seed}/{STUDY_CELL}/toy"
        plan, train = (provenance.read_record(toy / name) for name in ("plan.json", "train.json"))
        firsts = np.load(toy.parent / "firsts_subset.npz")["indices"]  # its own training set, drawn by its rule
        assert plan["offset"] == 5 and plan["subset"] == "firsts" and train["n_train"] == len(firsts)
        assert train["epochs_completed"] == plan["planned_epochs"]
        assert train["samples_trained"] == plan["planned_samples"] == plan["planned_epochs"] * len(firsts)
        assert train["selection"] == {"policy": "toy", "offset": 5}
        cell = json.loads((project / f"results/cells/quick/study_table1/resnet18/s{seed}/{STUDY_CELL}/toy.json")
                          .read_text())
        # the cell record holds the method's whole typed plan (plan.json's identity is its file's;
        # its lr_schedule is the run's resolved learning-rate rule, the one train.json records)
        assert cell["plan"] == {k: v for k, v in plan.items() if k not in (provenance.IDENTITY_KEY, "lr_schedule")}
        assert plan["lr_schedule"] == train["lr_schedule"] and plan["lr_schedule"]["kind"] == "matched"
    # The control keeps DAREL's class counts, calibrated batch and budget; its own plan.
    for seed in (0, 1):
        darel = rows[(rows["method"] == "darel") & (rows["seed"] == seed)].iloc[0]
        random = rows[(rows["method"] == "random") & (rows["seed"] == seed)].iloc[0]
        assert random["batch"] == darel["batch"] and random["t"] == darel["t"] and random["m"] == darel["m"]
        assert random["alpha"] == darel["alpha"] and random["A"] == darel["A"]
        plan = json.loads((project / f"runs/quick/study_table1/resnet18/s{seed}/{STUDY_CELL}/random/plan.json")
                          .read_text())
        assert random["epochs"] == plan["planned_epochs"] and plan["rule"] == "uniform"
        train = json.loads((project / f"runs/quick/study_table1/resnet18/s{seed}/{STUDY_CELL}/random/train.json")
                           .read_text())
        # Under the study's default schedule rule (matched) DAREL is trained by the study
        # itself, beside its controls, not taken from Table 1 (which keeps the paper's rule).
        darel_train = json.loads((project / f"runs/quick/study_table1/resnet18/s{seed}/{STUDY_CELL}/darel/"
                                  "train.json").read_text())
        assert train["n_train"] == darel_train["n_train"]
    # The summary and the interval recompute from the per-seed cells.
    cells = project / "results/cells/quick/study_table1/resnet18"
    top1 = {method: pd.Series({s: json.loads((cells / f"s{s}/{STUDY_CELL}/{method}.json").read_text())["top1"]
                               for s in (0, 1)}) for method in ("darel", "random")}
    summary = pd.read_csv(project / "results/study_table1_summary.csv")
    for method in ("darel", "random"):
        row = summary[summary["method"] == method].iloc[0]
        assert row["top1_mean"] == pytest.approx(top1[method].mean(), abs=1e-4)
        assert row["top1_std"] == pytest.approx(top1[method].std(ddof=1), abs=1e-4) and row["n"] == 2
        assert list(rows[rows["method"] == method]["top1"]) == pytest.approx(list(top1[method]), abs=0.006)
    d = top1["darel"] - top1["random"]
    from scipy.stats import t as student

    half = student.ppf(0.975, 1) * d.std(ddof=1) / 2 ** 0.5
    verdict = (project / "results/study_table1.md").read_text()
    assert f"| random | {summary[summary['method'] == 'random'].iloc[0]['top1_mean']:.4g} | {d.mean():+.4g} |" in verdict
    assert f"[{d.mean() - half:+.4g}, {d.mean() + half:+.4g}]" in verdict
    assert (project / "results/study_table1.png").stat().st_size > 0
    # What each method trained on, on the generated benchmark's groups: the plot beside the rows' shares.
    assert (project / "results/study_table1_composition.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert {"trained_share_label-noise", "data_share_label-noise", "trained_share_rare-class"} <= set(rows.columns)
    # The declared primary analysis heads the file; DAREL vs random is its one comparison, with its MDD.
    head = verdict.split("## Design")[0]
    assert verdict.splitlines()[2] == "## The study's own controls (reported first)"
    assert f"| negative | resnet18, {STUDY_BUDGET} | darel - darel-restream |" in head
    assert f"| positive | resnet18, {STUDY_BUDGET} | oracle-clean - random |" in head
    assert "| darel-restream |" not in head.split("## Primary analysis")[1]  # never a control of DAREL's
    assert "## Primary analysis" in head and f"| resnet18, {STUDY_BUDGET} | random |" in head
    assert "MDD (80%)" in head and "## Secondary comparisons" in verdict
    # MLflow: one run per (cell, method, seed) of the controls, and the study's own run.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{project / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("study_table1").experiment_id])
    keys = sorted(r.data.tags["cell_key"] for r in runs)
    assert keys == sorted([f"quick/resnet18/s{s}/{cell}/{method}" for s in (0, 1)
                           for cell, method in (("baseline", "baseline"), (STUDY_CELL, "darel"),
                                                (STUDY_CELL, "random"), (STUDY_CELL, "toy"),
                                                (STUDY_CELL, "darel-restream"), (STUDY_CELL, "oracle-clean"))]
                          + ["quick/study_table1"])
    control = next(r for r in runs if r.data.tags["cell_key"].endswith(f"s1/{STUDY_CELL}/random"))
    assert control.data.tags["method"] == "random" and control.data.tags["seed"] == "1"
    assert control.data.tags["dataset_label"].startswith("GENERATED")
    assert control.data.params["method"] == "random" and control.data.params["seed"] == "1"
    assert "params.protocol.lr" in control.data.params
    study = next(r for r in runs if r.data.tags["cell_key"] == "quick/study_table1")
    assert {a.path for a in client.list_artifacts(study.info.run_id)} >= {
        "study_table1.csv", "study_table1_summary.csv", "study_table1.png", "study_table1.md",
        "study_table1_composition.png"}


_TINY_STUDY = "study={table1: {methods: [darel, random, toy, darel-restream, oracle-clean]}}"


def _study_jobs(project, *config) -> tuple[dict, list[str]]:
    """A dry run of the study under ``--config`` overrides: the planned jobs per rule and
    the study runs (model/seed/cell/method) their trainings would write."""
    out = _run([str(BIN / "snakemake"), "--cores", "1", "--dry-run", "results/study_table1.csv",
                "--config", _TINY_STUDY, *config], project).stdout
    if "Job stats:" not in out:
        return {}, []
    stats = out.split("Job stats:")[1]
    counts = {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", stats, re.MULTILINE)}
    counts.pop("total", None)
    trained, rule = set(), None
    for line in out.splitlines():
        line = line.strip()
        if re.match(r"(local)?rule \w+:$", line):
            rule = line.split()[-1].rstrip(":")
        elif line.startswith("output:") and rule == "study_train":
            trained |= set(re.findall(r"runs/quick/study_table1/(resnet18/s\d+/[^/]+/[^/\s,]+)/train\.json", line))
    return counts, sorted(trained)


def test_a_control_changed_or_added_replans_only_its_own_jobs(project):
    """On the tiny study built above: a job's parameters hold its own method's settings
    only, so changing one control's setting, or adding a control, plans only that
    control's jobs; nothing of DAREL, random or the other controls (the study's own
    table, which reads every cell, is the one other job)."""
    assert _study_jobs(project, "controls={toy: {offset: 5}}") == ({}, [])  # as built: nothing to do
    # a control the study does not list: its setting is no job's parameter
    assert _study_jobs(project, "controls={toy: {offset: 5}, infobatch: {r_max: 0.8}}") == ({}, [])
    own = {"study_train": 2, "study_cell_record": 2, "study_track": 2, "study_table1": 1}
    counts, trained = _study_jobs(project, "controls={toy: {offset: 6}}")
    assert counts == own and trained == [f"resnet18/s{seed}/{STUDY_CELL}/toy" for seed in (0, 1)]
    added = "study={table1: {methods: [darel, random, toy, darel-restream, oracle-clean, rs2]}}"
    counts, trained = _study_jobs(project, "controls={toy: {offset: 5}}", added)
    assert counts == own and trained == [f"resnet18/s{seed}/{STUDY_CELL}/rs2" for seed in (0, 1)]
    # The negative control's restreams (issue 50, item 5): a second stream plans its own runs alone (the
    # first stream's stand), and moving the first stream re-plans the first restream's runs alone.
    counts, trained = _study_jobs(project, "controls={toy: {offset: 5}, darel_restream: {streams: [1380275028, 7]}}")
    assert counts == own and trained == [f"resnet18/s{seed}/{STUDY_CELL}/darel-restream-2" for seed in (0, 1)]
    counts, trained = _study_jobs(project, "controls={toy: {offset: 5}, darel_restream: {streams: [7]}}")
    assert counts == own and trained == [f"resnet18/s{seed}/{STUDY_CELL}/darel-restream" for seed in (0, 1)]


_FIT_STUDY = ("study={table1: {methods: [darel, random, toy, darel-restream, oracle-clean], "
              "fit_check: {quick: {train_top1_min: 95.0, rise_max_pp: 2.0}}}}")


def test_a_declared_fitting_regime_adds_only_the_baselines_fit_and_the_table(project):
    """On the tiny study built above: declaring a fitting regime (study.table1.fit_check)
    plans one baseline_fit job a seed and the study's table; no training, calibration or
    evaluation reruns. Built, the verdict file prints each baseline's fit, and its figures
    recompute from the saved model and the baseline's recorded test curve."""
    import torch

    from darel.stagekit.models import load_model, transforms

    counts, trained = _study_jobs(project, "controls={toy: {offset: 5}}", _FIT_STUDY)
    assert counts == {"baseline_fit": 2, "study_table1": 1} and trained == []
    _run([str(BIN / "snakemake"), "--cores", "2", "results/study_table1.csv", "--config", _FIT_STUDY,
          "controls={toy: {offset: 5}}"], project)
    assert _study_jobs(project, "controls={toy: {offset: 5}}", _FIT_STUDY) == ({}, [])
    # Without the declaration the table is made again without the section, and nothing else.
    assert _study_jobs(project, "controls={toy: {offset: 5}}") == ({"study_table1": 1}, [])
    verdict = (project / "results/study_table1.md").read_text()
    section = verdict.split("## The baselines' fit")[1].split("## Primary analysis")[0]
    with np.load(project / "data/quick/train.npz") as train:
        images, labels, category = train["images"], train["labels"], train["category"]
    meta = json.loads((project / "data/quick/meta.json").read_text())
    params = yaml.safe_load((project / "params.yaml").read_text())
    _, normalise = transforms(meta, params["datasets"]["synth"]["augment"])
    figures = []
    for seed in (0, 1):
        record = json.loads((project / f"results/fit/quick/resnet18/s{seed}.json").read_text())
        baseline = project / f"runs/quick/table1/resnet18/s{seed}/baseline"
        curve = json.loads((baseline / "train.json").read_text())["curves"]["test_top1"]
        first = len(curve) - math.ceil(len(curve) / 4)
        tail = np.array(curve[first:], dtype=float)
        rise = np.polyfit(np.arange(len(tail)), tail, 1)[0] * (len(tail) - 1) if len(tail) > 1 else 0.0
        assert record["last_quarter"]["rise_pp"] == pytest.approx(rise, abs=1e-9)
        assert record["last_quarter"]["mean"] == pytest.approx(tail.mean())
        # The saved model in eval mode on every training image, against the observed labels.
        model, _ = load_model(baseline / "model.pt", torch.device("cpu"))
        model.eval()
        with torch.no_grad():
            x = torch.from_numpy(images).permute(0, 3, 1, 2)  # stored (N, H, W, C)
            pred = torch.cat([model(normalise(x[i:i + 64].contiguous())).argmax(1) for i in range(0, len(x), 64)])
        right = pred.numpy() == labels
        assert record["train_top1"] == pytest.approx(100 * right.mean(), abs=1e-4)
        assert record["train_noisy_top1"] == pytest.approx(100 * right[category == 1].mean(), abs=1e-4)
        assert f"| resnet18 | {seed} | {record['train_top1']:.2f} | " in section
        assert f"| {record['last_quarter']['rise_pp']:+.2f} |" in section
        figures.append(record["train_top1"])
    fits = sum(f >= 95.0 for f in figures)
    assert f"{fits} of 2 baselines reach training top-1 >= 95 %" in section
    # 3 epochs: the last quarter is one evaluated epoch, no line to call flat
    assert "0 of 2 test curves are flat" in section and "fit check: **FAILED**" in section


def test_a_study_with_three_restreams_trains_each_and_reads_them_against_each_other(project):
    """Three stream constants (issue 50, item 5): the two new restreams train beside the first,
    each with its own stream in its plan, and the verdict file judges DAREL against their mean
    beside the chance reference (restream against restreams), read per budget."""
    streams = "controls={toy: {offset: 5}, darel_restream: {streams: [1380275028, 7, 8]}}"
    _run([str(BIN / "snakemake"), "--cores", "2", "results/study_table1.csv", "--config", _TINY_STUDY, streams],
         project)
    runs = ("darel-restream", "darel-restream-2", "darel-restream-3")
    for run, stream in zip(runs, (0x52455354, 7, 8)):
        for seed in (0, 1):
            folder = project / f"runs/quick/study_table1/resnet18/s{seed}/{STUDY_CELL}/{run}"
            record = provenance.read_record(folder / "train.json")
            assert record["method_plan"]["method"] == "darel-restream" and record["method_plan"]["stream"] == stream
    rows = pd.read_csv(project / "results/study_table1.csv")
    assert sorted(rows.loc[rows["method"].str.startswith("darel-restream"), "method"]) == sorted(runs * 2)
    head = (project / "results/study_table1.md").read_text().split("## Primary analysis")[0]
    assert f"| negative | resnet18, {STUDY_BUDGET} | darel - mean({', '.join(runs)}) |" in head
    assert (f"| negative reference | resnet18, {STUDY_BUDGET} | darel-restream - "
            "mean(darel-restream-2, darel-restream-3) |") in head
    assert "trains 3 restreams per seed and budget" in head and "against its chance reference" in head
