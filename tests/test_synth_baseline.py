"""bench/synth_baseline.py --from-build: an existing build's baselines, read, not trained:
the final top-1 from eval.json (the whole test set), the curve from train.json."""

from __future__ import annotations

import json
import statistics
import sys

from tests.conftest import load_script

FINALS = {36: 39.5, 37: 41.0, 38: 37.25}


def _build(root):
    for seed, top1 in FINALS.items():
        folder = root / "runs/quick/table1/resnet18" / f"s{seed}" / "baseline"
        folder.mkdir(parents=True)
        curve = [10.0 + 2 * epoch + seed % 3 for epoch in range(10)]
        (folder / "train.json").write_text(json.dumps({"time_s": 60.0 + seed, "curves": {
            "test_top1": curve, "train_top1": [c + 1 for c in curve]}}))
        (folder / "eval.json").write_text(json.dumps({"top1": top1}))
    # a baseline trained but not evaluated yet is left out
    (root / "runs/quick/table1/resnet18/s99/baseline").mkdir(parents=True)
    (root / "data/quick").mkdir(parents=True)
    (root / "data/quick/meta.json").write_text(json.dumps({"label": "GENERATED: test", "num_classes": 20}))


def test_from_build_reports_the_evaluated_baselines_and_draws_their_curves(tmp_path, capsys, monkeypatch):
    script = load_script("bench/synth_baseline.py", "synth_baseline")
    _build(tmp_path)
    figure = tmp_path / "curves.png"
    monkeypatch.setattr(sys, "argv", ["synth_baseline.py", "--from-build", str(tmp_path), "--figure", str(figure)])
    script.main()
    out = capsys.readouterr().out
    values = list(FINALS.values())
    assert f"final top-1 over 3 seeds: mean {statistics.mean(values):.2f} %, std {statistics.stdev(values):.2f} pp" in out
    assert "seed 99" not in out and "seed 36: top-1 39.50 %" in out
    # the curve rises 2 pp an epoch: from epoch 2 (20 % of 10) to the end, 16 pp
    assert "mean +16.00 pp" in out and figure.stat().st_size > 0
