"""A training evaluates its model itself (run_training's ``eval_out``, issue 52 item 3): the
eval.json it writes from the model in memory is, byte for byte, the one the evaluation
stage writes from model.pt in a process of its own, and the training's own outputs are
those of a training without it. A profile's live_tracking: false keeps MLflow out of the
training (--no-live-run); its train.json holds the run plan the tracking job logs instead."""

import hashlib
import json
import logging
import subprocess
import sys

import pytest

from darel import config, data
from darel.stagekit import training as stage_training
from tests.conftest import ROOT, TINY_SYNTH


def _params():
    cfg = config.load_params(ROOT / "params.yaml", {
        "datasets": {"synth": {"sizes": {"cpu": dict(TINY_SYNTH)}}},
        "profiles": {"quick": {"models": {"resnet18": {"width": 4, "epochs": 2, "milestones": [1],
                                                        "warmup_epochs": 0}}}}})
    return cfg, config.training_params(cfg, "resnet18", 0)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("evaluated")
    cfg, params = _params()
    train, test, meta = data.make_synth_dataset(config.dataset_params(cfg))
    data.write_dataset(root / "data", train, test, meta)
    for name, eval_out in (("plain", None), ("evaluated", root / "evaluated" / "eval.json")):
        stage_training.run_training(params, data_dir=str(root / "data"), out_dir=str(root / name),
                                    log=logging.getLogger("t"), progress=False, eval_out=eval_out)
    return root, params


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_training_writes_the_evaluation_stage_s_record_byte_for_byte(runs):
    root, params = runs
    folder = root / "evaluated"
    in_memory = (folder / "eval.json").read_bytes()
    record = json.loads(in_memory)
    # The generated benchmark names rare classes: their top-1 apart is in the record too.
    assert {"top1", "top1_rare", "top1_common", "n_test", "model_sha256"} <= set(record)
    assert record["n_test"] == TINY_SYNTH["n_test"] and 0 <= record["top1"] <= 100
    (folder / "eval.json").unlink()
    done = subprocess.run([sys.executable, "stages/evaluate.py", "--params", json.dumps(params),
                           "--data", str(root / "data"), "--model", str(folder / "model.pt"),
                           "--out", str(folder / "eval.json"), "--log", str(root / "evaluate.log")],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (folder / "eval.json").read_bytes() == in_memory


def test_evaluating_in_the_training_changes_none_of_its_outputs(runs):
    root, _ = runs
    assert _sha(root / "plain" / "model.pt") == _sha(root / "evaluated" / "model.pt")
    assert not (root / "plain" / "eval.json").exists()
    plain, evaluated = (json.loads((root / name / "train.json").read_text()) for name in ("plain", "evaluated"))
    assert plain["curves"]["test_top1"] == evaluated["curves"]["test_top1"]
    assert plain["model_sha256"] == evaluated["model_sha256"]


def test_no_live_run_leaves_the_training_without_mlflow_and_says_so_only_with_the_flag():
    import argparse

    from darel import stagekit

    ap = argparse.ArgumentParser()
    stagekit.add_tracking_args(ap)
    given = ["--tracking-uri", "sqlite:///mlflow.db", "--experiment", "table1", "--cell-key", "quick/resnet18/s0/baseline"]
    live = stagekit.tracking_target(ap.parse_args(given))
    assert live is not None and live["cell_key"] == "quick/resnet18/s0/baseline"
    assert stagekit.tracking_target(ap.parse_args([*given, "--no-live-run"])) is None


def test_train_json_holds_the_run_plan_the_tracking_job_logs_without_a_live_run(runs):
    root, params = runs
    record = json.loads((root / "evaluated" / "train.json").read_text())
    plan = record["run_plan"]
    assert plan["epochs"] == params["protocol"]["epochs"] and plan["batch"] == record["batch"]
    assert "extra" not in plan and "epoch_cost_s" not in plan
