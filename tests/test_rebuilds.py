"""Results apart from measurements (issue 32): the results hash of a cell record, and the
table stages' line when two builds of a cell disagree on results (darel/rebuilds.py)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

from darel import provenance, rebuilds, records  # noqa: E402


def _cell(**changes) -> dict:
    cell = {"table": "table1", "profile": "quick", "model": "resnet18", "seed": 0, "cell": "t0.50_m0.55",
            "method": "darel", "top1": 61.5, "epochs": 3, "batch": 64, "alpha": 0.8,
            "plan": {"planned_epochs": 3, "predicted_time_s": 2.5}, "time_s": 3.2, "wall_time_s": 3.4,
            "peak_mem_bytes": 1000, "energy_kwh": 1e-6, "co2e_kg": 4e-7, "T_full_s": 6.0, "t_max_s": 3.0,
            "budget_adherence": 1.07, "time_charged_s": {"scoring_s": 0.1}}
    for key, value in changes.items():
        if "." in key:
            head, leaf = key.split(".")
            cell[head] = {**cell[head], leaf: value}
        else:
            cell[key] = value
    return records.sealed_results(cell)


def test_results_hash_ignores_measurements_and_nothing_else(tmp_path):
    first = _cell()
    remeasured = _cell(time_s=9.9, wall_time_s=11.0, peak_mem_bytes=2000, energy_kwh=5e-6, co2e_kg=2e-6,
                       T_full_s=7.0, t_max_s=3.5, budget_adherence=0.9, time_charged_s={"scoring_s": 0.4},
                       **{"plan.predicted_time_s": 4.0})
    assert remeasured[provenance.RESULTS_KEY] == first[provenance.RESULTS_KEY]
    for change in ({"top1": 61.6}, {"epochs": 4}, {"batch": 32}, {"plan.planned_epochs": 2}):
        assert _cell(**change)[provenance.RESULTS_KEY] != first[provenance.RESULTS_KEY], change
    # The seal travels with the record: an edited result no longer matches it.
    provenance.write_record(tmp_path / "cell.json", first)
    read = provenance.read_record(tmp_path / "cell.json")
    assert provenance.check_results(read, records.MEASUREMENTS, tmp_path / "cell.json") == first["results_sha256"]
    with pytest.raises(provenance.ArtifactError, match="cell.json: its results differ from its results_sha256"):
        provenance.check_results({**read, "top1": 70.0}, records.MEASUREMENTS, tmp_path / "cell.json")
    assert provenance.check_results({"top1": 1.0}, records.MEASUREMENTS, "old.json") is None


def test_previous_build_skips_this_builds_own_run_and_unhashed_runs():
    runs = [{"results_sha256": "new"}, {"results_sha256": None}, {"results_sha256": "old"}, {"results_sha256": "x"}]
    assert rebuilds.previous_build(runs, "new") == {"results_sha256": "old"}
    assert rebuilds.previous_build(runs[1:], "new") == {"results_sha256": "old"}  # this build not tracked yet
    assert rebuilds.previous_build(runs[:2], "new") is None


def test_the_table_says_in_one_line_which_cell_changed_its_results(tmp_path):
    """Three builds of a cell logged to one MLflow store as the tracking stage logs them;
    the third is compared with the second (the first is long gone)."""
    from darel import tracking

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    key = "quick/resnet18/s0/t0.50_m0.55"
    builds = [_cell(top1=58.0), _cell(), _cell(time_s=7.7)]  # the last two differ only in time

    def track(record: dict) -> None:
        artifact = tmp_path / "cell.json"
        artifact.write_text("{}")
        tracking.log_cell_run(uri, "table1", key, params={}, metrics={"top1": record["top1"],
                                                                       "time_s": record["time_s"]},
                              curves={}, tags={"profile": "quick", "results_sha256": record["results_sha256"]},
                              artifacts=[artifact])

    said, warned = [], []
    track(builds[0])
    track(builds[1])
    lines = rebuilds.compare_with_earlier_builds(uri, "table1", "quick", {"cell.json": builds[1]}, said.append,
                                                 warned.append)
    assert lines == warned and len(lines) == 1
    assert lines[0].startswith(f"{key}: results differ from its previous build (MLflow run ")
    assert "top1 61.5 vs 58" in lines[0] and "time_s" not in lines[0]
    assert said == ["table1: 0 of 1 cells with an earlier build in the MLflow store agree with it on results (0 built "
                    "once)"]
    track(builds[2])
    said.clear()
    assert rebuilds.compare_with_earlier_builds(uri, "table1", "quick", {"cell.json": builds[2]}, said.append,
                                                warned.append) == []
    assert said[0].startswith("table1: 1 of 1 cells with an earlier build in the MLflow store agree")
