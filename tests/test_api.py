"""darel.api: DAREL for one's own model and loop, and the example that shows it."""

from __future__ import annotations

import re
import runpy
import sys

import pytest
import torch

from darel import api
from tests.conftest import ROOT


@pytest.mark.parametrize("method", ["infobatch"])  # darel: the README's command (tests/test_readme.py)
def test_the_example_plans_a_budget_and_trains_its_own_loop_with_a_control(method, monkeypatch, capsys):
    """examples/own_training_loop.py at its tiny size: a generated data set and an MLP, the
    budget from probes of its own step, Algorithm 2's subset, a control in its loop (run in
    this process: the script as a user runs it, its argv and all)."""
    monkeypatch.setattr(sys, "argv", ["own_training_loop.py", "--tiny", "--method", method])
    runpy.run_path(str(ROOT / "examples/own_training_loop.py"), run_name="__main__")
    out = capsys.readouterr().out
    plan = re.search(r"batch (\d+), alpha ([0-9.]+) \((\d+) of (\d+) samples\), A ([0-9.]+), eta (\d+), (\d+) of 4 "
                     r"epochs planned", out)
    assert plan, out
    batch, alpha, kept, total = int(plan[1]), float(plan[2]), int(plan[3]), int(plan[4])
    assert 1 <= batch <= 64 and 0 < alpha <= 1 and kept < total and 1 <= int(plan[7]) <= 4
    assert re.search(rf"^{method}: top-1 [0-9.]+ %", out, flags=re.MULTILINE), out


def test_a_selection_for_ones_own_loop_is_the_workflows_policy():
    """The same policy object the training loop runs (darel.methods), built from the
    method's own settings; bad settings are named."""
    policy = api.selection("darel", n_samples=40, batch_size=8, seed=3, keep_fraction=0.5, eta=1, warmup_epochs=1,
                           history_size=64, bins=8)
    warm = torch.cat([p for p, _ in policy.batches(0, None)])
    assert sorted(warm.tolist()) == list(range(40))  # a warm-up epoch trains everything
    kept = torch.cat([p for p, _ in policy.batches(1, lambda positions: positions.float())])
    assert 0 < len(kept) < 40  # then about A of it, chosen by the losses
    assert api.offline_subset([0.1, 0.9, 0.5, 0.7], [0, 0, 1, 1], 0.5).tolist() == [1, 3]
    with pytest.raises(ValueError, match="unknown setting"):
        api.selection("rs2", n_samples=40, batch_size=8, keep_fraction=0.5)
    with pytest.raises(ValueError, match="unknown method"):
        api.selection("nope", n_samples=40, batch_size=8)
