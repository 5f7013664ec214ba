"""Planned trainings side by side (profile key ``planned_side_by_side``) and the record of
what ran beside a timed run (``cpu_beside_s``, ``cores_beside``).

A training that follows a fixed plan trains the same model whatever runs beside it, so on
the quick profile two such trainings may share the machine's cores; the baseline (whose
time sets every budget) and the calibrations (whose probes set every plan) still run
alone. Every run records the other processes' CPU seconds over its timed intervals, so a
time measured beside a neighbour says so in its record and in the tables."""

from __future__ import annotations

import math
import re
import time

import pytest
import yaml

from darel import config, records, study, table1
from darel.measure import timing
from tests.conftest import ROOT, copy_worktree, run_in
from tests.test_workflow_static import SNAKEMAKE


def test_an_interval_records_the_other_processes_cpu_seconds(monkeypatch):
    """The machine's busy seconds less this process's own: a fake machine counter that
    runs 1.5 s ahead of the process per reading gives 1.5 s beside per interval."""
    others = {"s": 0.0}

    def machine():
        others["s"] += 1.5
        return time.process_time() + others["s"]

    monkeypatch.setattr(timing, "machine_busy_cpu_s", machine)
    work = timing.TimedWork(None, "cpu")
    for _ in range(2):
        with work.interval():
            sum(i * i for i in range(20_000))
    assert work.cpu_beside_s == pytest.approx(2 * 1.5, abs=1e-3)
    assert timing.cores_beside(work.cpu_beside_s, 6.0) == pytest.approx(0.5, abs=1e-3)
    # The 10 ms ticks of an idle machine may read below the process's own: never negative.
    assert timing.cores_beside(-0.01, 2.0) == 0.0
    assert timing.cores_beside(math.nan, 2.0) is None and timing.cores_beside(1.0, 0.0) is None


def test_the_neighbour_survives_a_resume_and_is_unknown_after_an_older_checkpoint():
    work = timing.TimedWork(None, "cpu")
    work.cpu_beside_s = 4.0
    resumed = timing.TimedWork(None, "cpu")
    resumed.load_state_dict(work.state_dict())
    assert resumed.cpu_beside_s == 4.0 and resumed.segments == 2
    older = {key: value for key, value in work.state_dict().items() if key != "cpu_beside_s"}
    resumed.load_state_dict(older)
    assert math.isnan(resumed.cpu_beside_s)


def test_a_real_neighbour_is_seen():
    """A busy-looping process beside the interval: its CPU seconds are counted as beside,
    the interval's own are not. The interval lasts until the hog has had 0.3 s of CPU
    (however busy the machine), and at least half of that must be seen beside."""
    import subprocess
    import sys

    hog = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 120: pass"])
    try:
        time.sleep(0.3)
        hog_before = _cpu_of(hog.pid)
        work = timing.TimedWork(None, "cpu")
        waited = 0.0
        with work.interval():  # this process sleeps: the machine's busy time is someone else's
            while _cpu_of(hog.pid) - hog_before < 0.3 and waited < 60:
                time.sleep(0.1)
                waited += 0.1
        hog_cpu = _cpu_of(hog.pid) - hog_before
    finally:
        hog.kill()
        hog.wait()
    if hog_cpu < 0.3:
        pytest.skip(f"the machine gave the busy-looping neighbour {hog_cpu:.2f} s of CPU in 60 s")
    assert work.cpu_beside_s >= 0.5 * hog_cpu - 0.05


def _cpu_of(pid: int) -> float:
    import psutil

    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def test_records_and_tables_carry_the_neighbour():
    assert "cores_beside" in records.MEASUREMENTS  # a measurement: not in the results hash
    assert "cores_beside" in table1.TABLE1_TRAILING
    cells = [_cell("baseline", "baseline", None, None, 0.02), _cell("t0.80_m0.80", "darel", 0.8, 0.8, 0.93)]
    rows = study.study_rows(cells)
    assert rows.set_index("method").loc["darel", "cores_beside"] == pytest.approx(0.93)
    assert table1.build_table1(cells).set_index("cell").loc["t0.80_m0.80", "cores_beside"] == pytest.approx(0.93)


def _cell(cell, method, t, m, beside):
    return {"model": "resnet18", "method": method, "cell": cell, "t": t, "m": m, "batch": 16, "alpha": 1.0, "A": 1.0,
            "eta": None, "epochs": 10, "epochs_planned": 10, "enforce": "plan", "budget_adherence": None,
            "time_s": 10.0, "wall_time_s": 10.5, "cores_beside": beside, "top1": 40.0, "peak_mem_bytes": 1000,
            "co2e_kg": 1e-6, "energy_kwh": 2e-6, "energy_covers": "x", "profile": "quick", "seed": 0,
            "dataset_label": "GENERATED"}


@pytest.mark.parametrize("change, named", [
    ({"profiles": {"gpu": {"planned_side_by_side": True}}}, "needs device: cpu"),
    ({"profiles": {"quick": {"planned_side_by_side": True}}, "budget": {"enforce": "wallclock"}},
     "needs budget.enforce: plan"),
    ({"profiles": {"quick": {"planned_side_by_side": "yes"}}}, "planned_side_by_side"),
])
def test_side_by_side_is_refused_where_it_could_change_a_model(change, named):
    with pytest.raises(config.ConfigError, match=re.escape(named)):
        config.load_params(ROOT / "params.yaml", change)


def test_the_setting_enters_no_jobs_parameters():
    """Turning it on or off must re-run nothing: no stage's slice holds it."""
    on = config.load_params(ROOT / "params.yaml", {"profiles": {"quick": {"planned_side_by_side": True}}})
    off = config.load_params(ROOT / "params.yaml", {"profiles": {"quick": {"planned_side_by_side": False}}})
    for build in (config.training_params, ):
        assert build(on, "resnet18", 0) == build(off, "resnet18", 0)
    assert config.online_params(on, "resnet18", "t0.80_m0.80") == config.online_params(off, "resnet18", "t0.80_m0.80")
    assert config.calibration_params(on, "resnet18", "t0.80_m0.80") == \
        config.calibration_params(off, "resnet18", "t0.80_m0.80")


@pytest.mark.parametrize("side_by_side", [True, False])
def test_planned_trainings_take_one_core_and_baselines_and_calibrations_every_core(tmp_path, side_by_side):
    """A dry run of the study on 2 cores: with the setting, Table 1's online trainings and
    the study's control trainings ask the profile's threads and no `timed` slot, so two run
    at once; the baseline and the calibrations keep every core and the `timed` slot. Without
    it, every one of them runs alone as before."""
    copy_worktree(tmp_path)
    params = yaml.safe_load((tmp_path / "params.yaml").read_text())
    threads = params["profiles"]["quick"]["threads"]
    out = run_in(tmp_path, SNAKEMAKE, "-n", "--cores", "2", "results/study_table1.csv", "--config",
                 f"profiles={{quick: {{planned_side_by_side: {str(side_by_side).lower()}}}}}", "study={seeds: [0]}")
    jobs = re.split(r"\n(?=(?:local)?rule \w+:)", out.stdout + out.stderr)

    def of(*rules: str) -> list[str]:
        return [job for job in jobs if re.match(rf"(?:local)?rule ({'|'.join(rules)}):", job)]

    planned, alone = of("train_online", "study_train"), of("pretrain_scorer", "calibrate")
    assert planned and alone
    for job in alone:
        assert re.search(r"resources: .*\btimed=1\b", job) and re.search(r"threads: 2\b", job), job
    for job in planned:
        if side_by_side:  # Snakemake prints no threads line for a one-thread job
            assert threads == 1 and not re.search(r"threads: (?!1\b)\d+", job) and "timed=1" not in job, job
        else:
            assert re.search(r"resources: .*\btimed=1\b", job) and re.search(r"threads: 2\b", job), job


def test_the_verdict_file_says_what_ran_beside_the_timed_runs():
    import pandas as pd

    rows = pd.DataFrame({"cores_beside": [0.01, 0.9, 1.0, None]})
    note = study.neighbour_note(rows)
    assert "3 of 4 runs recorded it" in note and "median 0.90" in note and "largest 1.00" in note
    assert "2 runs had a quarter of a core or more" in note
    assert study.neighbour_note(pd.DataFrame({"cores_beside": [None, None]})) is None
    assert study.neighbour_note(pd.DataFrame({"top1": [1.0]})) is None
    from tests.test_study_stats import PRIMARY, _assessed, _study_rows

    summary = study.summarize(_study_rows().assign(panel="p"), ("top1", "time_s"))
    text = study.verdict_markdown(_assessed(PRIMARY, "matched"), summary, title="study_table1", profile="quick",
                                  dataset="GENERATED", seeds=list(range(6)), metric="top1", unit="pp",
                                  schedule="matched", margin=1.0, level=0.05, primary=PRIMARY, neighbours=note)
    design = text.split("## Design")[1].split("## ")[0]
    assert f"- times: {note}" in design
