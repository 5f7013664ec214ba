"""The negative control with several restreams per seed (issue 50, item 5): the streams'
declaration (controls.darel_restream.streams), one training per stream, seed and budget
planned through the one plan path, and the analysis that tells DAREL's own stream from
the streams' chance spread."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from darel import config, methods, plans
from darel.config import ConfigError
from darel.methods.darel_restream import RESTREAM
from darel.study import (NEGATIVE_REFERENCE, restream_reading, trustworthy, validation_checks, validation_markdown,
                         validation_methods)
from tests.conftest import ROOT
from tests.test_plans import _calibration

STREAMS = [RESTREAM, 11, 12]
RUNS = ["darel-restream", "darel-restream-2", "darel-restream-3"]
CELL = "t0.80_m0.80"


def _params(streams: list[int] | None = None) -> dict:
    overrides = {} if streams is None else {"controls": {"darel_restream": {"streams": streams}}}
    return config.load_params(ROOT / "params.yaml", overrides)


def _sampler_seed(cfg: dict, run: str, seed: int) -> int:
    """The sampler seed of a study run, through the path every run takes: its slice, its
    method's plan at a calibration, the training loop's RunPlan."""
    slice_ = config.control_params(cfg, "resnet18", CELL, seed, run)
    plan = plans.method_plan(slice_["method"], _calibration(), n_full=1000, warmup_epochs=2, epochs=12,
                             params=slice_)
    run_plan = plans.run_plan(plans.ImageSettings.from_slice(slice_), plan)
    return run_plan.selection.sampler_seed(run_plan.seed)


def test_three_streams_plan_three_restream_runs_per_seed_and_budget_with_distinct_sampler_seeds():
    cfg = _params(STREAMS)
    cells = config.study_table1_cells(cfg)
    for seed in config.study_seeds(cfg):
        for t, m in config.study_budgets(cfg, "resnet18"):
            here = [run for model, s, cell, run in cells if s == seed and cell == config.cell_id(t, m)]
            assert [run for run in here if run.startswith("darel-restream")] == RUNS
    seed = config.study_seeds(cfg)[0]
    seeds = [_sampler_seed(cfg, run, seed) for run in RUNS]
    assert len(set(seeds)) == 3 and seed not in seeds  # three streams, none DAREL's own
    assert _sampler_seed(cfg, "darel", seed) == seed
    # each run's plan records its stream; the first is the stream every earlier study trained
    assert seeds[0] == _sampler_seed(_params(), "darel-restream", seed)
    slice_ = config.control_params(cfg, "resnet18", CELL, seed, "darel-restream-3")
    assert slice_["method"] == "darel-restream" and slice_["controls"] == {"darel_restream": {"stream": 12}}
    assert methods.get("darel-restream").plan(_calibration(), n_full=1000, warmup_epochs=2, epochs=12,
                                              settings={"stream": 12}).stream == 12


def test_each_restream_job_depends_on_its_own_stream_alone():
    one, three = _params(), _params(STREAMS)
    seed = config.study_seeds(one)[0]
    slices = {run: config.control_params(three, "resnet18", CELL, seed, run) for run in RUNS}
    # adding streams leaves the first restream's job (and every other method's) as it was
    assert slices["darel-restream"] == config.control_params(one, "resnet18", CELL, seed, "darel-restream")
    assert "controls" not in slices["darel-restream"]
    for method in ("darel", "random", "oracle-clean"):
        assert config.control_params(three, "resnet18", CELL, seed, method) == \
            config.control_params(one, "resnet18", CELL, seed, method)
    # changing the third stream changes the third run's job alone
    moved = _params([RESTREAM, 11, 13])
    changed = [run for run in RUNS if config.control_params(moved, "resnet18", CELL, seed, run) != slices[run]]
    assert changed == ["darel-restream-3"]
    # a first stream of its own is named in that job's parameters
    assert config.control_params(_params([5]), "resnet18", CELL, seed, "darel-restream")["controls"] == {
        "darel_restream": {"stream": 5}}


def test_runs_and_streams_are_refused_by_name():
    with pytest.raises(ConfigError, match="restream 2, but controls.darel_restream.streams lists 1 stream"):
        config.control_params(_params(), "resnet18", CELL, 0, "darel-restream-2")
    for bad in ("darel-restream-1", "darel-restream-02", "darel-restream-x", "random-2"):
        with pytest.raises(ValueError, match=f"unknown method or run '{bad}'"):
            methods.of_run(bad)
    assert methods.of_run("darel-restream-7") is methods.get("darel-restream")
    for streams in ([RESTREAM, RESTREAM], [], [-1]):
        with pytest.raises(ConfigError, match="darel_restream"):
            _params(streams)
    assert config.study_verdict_params(_params())["validation"]["negative"] == "darel-restream"
    assert "negative_runs" not in config.study_verdict_params(_params())["validation"]
    assert config.study_verdict_params(_params(STREAMS))["validation"]["negative_runs"] == RUNS


def _rows(offsets: dict[str, float], n: int = 12, spread: float = 0.7) -> pd.DataFrame:
    """Study rows of one budget: per seed a level shared by every run of that seed (the same
    initial weights), each run its own stream's noise, plus its offset."""
    rng = np.random.default_rng(5)
    level = 50 + rng.normal(0, 2, n)
    out = []
    for method in ("darel", "random", *RUNS):
        values = level + rng.normal(0, spread, n) + offsets.get(method, 0.0)
        out += [{"model": "resnet18", "cell": CELL, "budget": "B(0.8, 0.8)", "method": method, "seed": s, "top1": v}
                for s, v in enumerate(values)]
    return pd.DataFrame(out)


VALIDATION = {"negative": "darel-restream", "negative_runs": RUNS}


def _read(rows: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    checks = validation_checks(rows, "top1", VALIDATION, level=0.05)
    return checks, "\n".join(restream_reading(checks, level=0.05))


def test_no_offset_reads_as_chance_and_passes():
    checks, reading = _read(_rows({}))
    own = checks[checks["check"] == "negative"].iloc[0]
    among = checks[checks["check"] == NEGATIVE_REFERENCE].iloc[0]
    assert own["reference"] == "darel" and own["control"] == f"mean({', '.join(RUNS)})" and own["n"] == 12
    assert among["reference"] == "darel-restream" and among["control"] == "mean(darel-restream-2, darel-restream-3)"
    assert own["passed"] is True and among["passed"] is None and not among["judged"]
    assert own["mdd"] > 0 and among["mdd"] > 0
    assert "no systematic difference" in reading
    assert trustworthy(checks, VALIDATION) == (None, ["the positive control was not run"])  # the negative passed


def test_an_offset_of_darels_own_stream_reads_as_special_and_fails_the_study():
    checks, reading = _read(_rows({"darel": -1.5}))
    own = checks[checks["check"] == "negative"].iloc[0]
    assert own["mean_diff"] < -1 and own["p_holm"] < 0.05 and own["passed"] is False
    assert checks[checks["check"] == NEGATIVE_REFERENCE].iloc[0]["p_holm"] >= 0.05
    assert "DAREL's own stream is special" in reading
    ok, reasons = trustworthy(checks, VALIDATION)
    assert ok is False and "B(0.8, 0.8)" in reasons[0]
    text = "\n".join(validation_markdown(checks, VALIDATION, metric="top1", level=0.05))
    assert "trains 3 restreams per seed and budget" in text and "| negative reference | resnet18, B(0.8, 0.8) |" in text
    assert "DAREL's own stream is special" in text


def test_restreams_apart_among_themselves_read_as_a_fault_of_the_streams():
    _, reading = _read(_rows({"darel-restream": 1.5}))
    assert "the restreams differ among themselves" in reading


def test_one_restream_is_the_control_as_it_always_was():
    rows = _rows({"darel": -1.5})
    one = {"negative": "darel-restream"}
    plain = validation_checks(rows, "top1", one, level=0.05)
    listed = validation_checks(rows, "top1", {**one, "negative_runs": ["darel-restream"]}, level=0.05)
    pd.testing.assert_frame_equal(plain, listed)
    assert list(plain["control"]) == ["darel-restream"] and restream_reading(plain, level=0.05) == []
    assert "restreams per seed" not in "\n".join(validation_markdown(plain, one, metric="top1", level=0.05))
    assert validation_methods(VALIDATION) == RUNS
