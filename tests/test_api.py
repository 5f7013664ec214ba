"""darel.api: any method of darel.methods planned at a budget from one measured baseline,
trained through an ordinary DataLoader, and the example that shows it."""

from __future__ import annotations

import math
import re
import runpy
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from darel import api, methods
from darel.methods import PlanError
from tests.conftest import ROOT

# Every method a baseline alone can plan; the others need more than labels and losses.
PLANNABLE = ["darel", "darel-history", "darel-bins", "darel-floor", "darel-restream", "random-offline",
             "uniform-online", "random", "short-schedule", "selective-backprop", "infobatch", "rs2"]
# Epoch kinds whose sample count is drawn at random (Algorithm 3's keep draws, selective
# backprop's queue): their count is planned as an expectation.
DRAWN = {"refresh", "reuse", "select"}

N, CLASSES, FEATURES, BATCH, EPOCHS = 240, 3, 6, 32, 8


def _data(seed: int = 0) -> TensorDataset:
    gen = torch.Generator().manual_seed(seed)
    y = torch.arange(N) % CLASSES
    x = torch.randn(N, FEATURES, generator=gen) + y[:, None].float()
    return TensorDataset(x, y)


def _baseline(time_s: float = 1.0) -> api.Baseline:
    """A baseline measured by hand: step memory and time affine in the batch, the scoring
    pass lighter than a step."""
    train_b, score_b = api.probe_batches(BATCH), api.probe_batches(BATCH)
    steps = api.StepCosts(memory_bytes={b: 1000 + 100 * b for b in train_b},
                          step_s={b: 1e-3 + 1e-4 * b for b in train_b},
                          score_bytes={e: 800 + 30 * e for e in score_b}, score_s={e: 2e-4 + 3e-5 * e for e in score_b},
                          plan_s=2e-4)
    x, y = _data().tensors
    losses = (x[:, 0] - y.float()).abs().numpy()  # a scorer's losses: any per-sample values
    return api.Baseline(labels=y.numpy(), losses=losses, epochs=EPOCHS, batch=BATCH, warmup_epochs=1,
                        time_s=time_s, steps=steps)


def _train(run: api.Run, data: TensorDataset) -> list[list[int]]:
    """The plain loop through a DataLoader, as examples/own_training_loop.py runs it; the
    data set indices each epoch trained."""
    torch.manual_seed(0)
    model = torch.nn.Linear(FEATURES, CLASSES)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def score(index):
        with torch.no_grad():
            x, y = data[index]
            return F.cross_entropy(model(x), y, reduction="none")

    loader = DataLoader(run.dataset(data), batch_sampler=run.batch_sampler(score))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, run.lr_factor)
    visited = []
    for _ in range(run.epochs):
        visited.append([])
        for x, y, index in loader:
            loss = run.update(index, F.cross_entropy(model(x), y, reduction="none"))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            visited[-1] += index.tolist()
    return visited


@pytest.mark.parametrize("budget", [(0.5, 0.8), (0.3, 0.6)])
@pytest.mark.parametrize("method", PLANNABLE)
def test_each_method_plans_within_its_budget_and_trains_its_planned_samples(method, budget):
    baseline, data = _baseline(), _data()
    t, m = budget
    run = api.plan(method, budget=budget, baseline=baseline, seed=1)  # both budgets fit every method here
    plan = run.plan
    # Memory: the calibrated batch's measured step, and the scoring pass, within m M.
    assert baseline.steps.memory_bytes[run.batch] <= m * baseline.peak_bytes
    assert baseline.steps.score_bytes[run.calibration["score_batch"]] <= m * baseline.peak_bytes
    # Time: the plan's prediction, in the baseline's seconds, within t T; and its steps alone
    # (each as long as a step at the calibrated batch, converted by T / (baseline steps at B))
    # fit too.
    assert plan.predicted_time_s <= t * baseline.time_s * (1 + 1e-9)
    step_s = baseline.time_s / (EPOCHS * math.ceil(N / BATCH)) * (baseline.steps.step_s[run.batch]
                                                                  / baseline.steps.step_s[BATCH])
    planned_steps = sum(math.floor(plan.epoch_samples[kind] / run.batch) for kind in plan.epoch_kinds)
    assert planned_steps * step_s <= t * baseline.time_s
    assert run.epochs == len(plan.epoch_kinds) <= EPOCHS

    visited = _train(run, data)
    assert run.trained_samples == sum(map(len, visited))
    training_set = set(run.indices.tolist())
    for epoch, (kind, seen) in enumerate(zip(plan.epoch_kinds, visited)):
        assert set(seen) <= training_set, f"epoch {epoch} trained samples outside the method's training set"
        expected = plan.epoch_samples[kind]
        if kind in DRAWN:  # an expectation: within the draw's spread and one batch of carry-over
            spread = 5 * math.sqrt(len(run.indices)) + run.batch
            assert abs(len(seen) - expected) <= spread, (epoch, kind, len(seen), expected)
        else:
            assert len(seen) == expected, (epoch, kind, len(seen), expected)
        if kind in ("warmup", "full", "anneal"):
            assert sorted(seen) == sorted(training_set)  # every sample once
    assert len(visited) == plan.planned_epochs


def test_methods_planned_from_one_baseline_share_the_budget_batch_and_cost_model():
    baseline = _baseline()
    runs = {name: api.plan(name, budget=(0.5, 0.8), baseline=baseline) for name in ("darel", "random", "infobatch")}
    cals = [run.calibration for run in runs.values()]
    for key in ("batch", "t_max_s", "alpha", "A", "eta", "score_batch", "seconds_per_probe_second"):
        assert len({cal[key] for cal in cals}) == 1, key
    assert len(runs["darel"].indices) == len(runs["random"].indices) < N  # Algorithm 2's class counts
    assert len(runs["infobatch"].indices) == N
    assert runs["darel"].indices.tolist() != runs["random"].indices.tolist()


def test_settings_default_to_params_yaml_and_can_be_given():
    baseline = _baseline()
    assert api.plan("rs2", budget=(0.5, 0.8), baseline=baseline, settings={"ratio": 0.25}).plan.ratio == 0.25
    sb = api.plan("selective-backprop", budget=(0.5, 0.8), baseline=baseline)
    assert sb.plan.beta == 3.0  # controls.selective_backprop of params.yaml
    linear = api.plan("short-schedule", budget=(0.5, 0.8), baseline=baseline)
    steps = linear.schedule["linear_steps"]
    assert linear.lr_factor(0) == 1.0 and linear.lr_factor(steps) == 0.0
    assert api.plan("darel", budget=(0.5, 0.8), baseline=baseline).lr_factor(10**6) == 1.0


@pytest.mark.parametrize("method", sorted(set(methods.names()) - set(PLANNABLE)))
def test_a_method_a_baseline_cannot_plan_is_refused_by_name(method):
    with pytest.raises(ValueError, match=re.escape(f"method {method}")):
        api.plan(method, budget=(0.5, 0.8), baseline=_baseline())


def test_bad_requests_are_named_before_any_work():
    baseline = _baseline()
    with pytest.raises(PlanError, match="method infobatch"):  # no plan fits a budget too small for one epoch
        api.plan("infobatch", budget=(0.01, 0.8), baseline=baseline)
    with pytest.raises(ValueError, match="unknown setting"):
        api.plan("rs2", budget=(0.5, 0.8), baseline=baseline, settings={"keep_fraction": 0.5})
    with pytest.raises(ValueError, match="unknown method"):
        api.plan("nope", budget=(0.5, 0.8), baseline=baseline)
    with pytest.raises(ValueError, match="budget"):
        api.plan("darel", budget=(1.5, 0.8), baseline=baseline)
    without_losses = api.Baseline(**{**baseline.__dict__, "losses": None})
    with pytest.raises(ValueError, match="losses"):
        api.plan("darel", budget=(0.5, 0.8), baseline=without_losses)
    with pytest.raises(ValueError, match="warmup_epochs"):
        api.Baseline(**{**baseline.__dict__, "warmup_epochs": EPOCHS + 1})
    with pytest.raises(ValueError, match=r"steps at batch\(es\) \[64\]"):
        api.Baseline(**{**baseline.__dict__, "batch": 64})
    run = api.plan("darel", budget=(0.5, 0.8), baseline=baseline)
    with pytest.raises(ValueError, match="outside its training set"):
        run.update(torch.tensor([N + 5]), torch.zeros(1))
    with pytest.raises(ValueError, match="score"):  # DAREL scores in its first online epoch
        for _ in range(run.epochs):
            list(run.batch_sampler())


def test_measure_steps_meters_and_times_a_real_loop():
    data = _data()
    model = torch.nn.Linear(FEATURES, CLASSES)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]

    def train_step(b):
        x, y = data[:b]
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()

    steps = api.measure_steps(train_step, lambda b: model(data[:b][0]), batch=BATCH, n_samples=N, model=model,
                              optimizer=optimizer, repeats=1, rounds=1)
    assert sorted(steps.memory_bytes) == sorted(steps.step_s) == api.probe_batches(BATCH) == [1, 2, 4, 8, 16, 32]
    assert all(v > 0 for v in steps.step_s.values()) and steps.plan_s > 0
    assert steps.memory_bytes[32] > steps.memory_bytes[1]
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # the model put back
    assert api.probe_batches(48) == [1, 2, 4, 8, 16, 32, 48]


def _snippet(text: str) -> str:
    """The first indented code block of a text (a docstring's or a page's)."""
    block = re.search(r"\n\n((?: {4}\S.*\n)(?: {4}.*\S.*\n|\n)*)", text)
    assert block, "no indented code block"
    return block.group(1).strip("\n")


def test_the_api_docstring_and_docs_own_loop_show_the_same_snippet_and_it_runs():
    snippet = _snippet(api.__doc__)
    page = (ROOT / "docs/own_loop.md").read_text(encoding="utf-8")
    assert snippet in page, "docs/own_loop.md shows another snippet than darel.api's docstring"
    data = _data()
    model = torch.nn.Linear(FEATURES, CLASSES)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def train_step(b):
        opt.zero_grad()
        F.cross_entropy(model(data[:b][0]), data[:b][1]).backward()
        opt.step()

    def no_grad_losses(index):
        with torch.no_grad():
            return F.cross_entropy(model(data[index][0]), data[index][1], reduction="none")

    namespace = dict(train_step=train_step, score_step=lambda b: no_grad_losses(torch.arange(b)), model=model,
                     opt=opt, y=data.tensors[1].numpy(), scorer_losses=np.linspace(0, 1, N), T=1.0, train_set=data,
                     no_grad_losses=no_grad_losses, DataLoader=DataLoader, F=F, optimizer=opt)
    exec(compile("\n".join(line[4:] for line in snippet.splitlines()), "darel.api snippet", "exec"), namespace)
    assert namespace["run"].trained_samples > 0


def test_the_example_plans_darel_and_two_controls_at_one_budget(monkeypatch, capsys):
    """examples/own_training_loop.py at its tiny size, as a user runs it (argv and all)."""
    monkeypatch.setattr(sys, "argv", ["own_training_loop.py", "--tiny"])
    runpy.run_path(str(ROOT / "examples/own_training_loop.py"), run_name="__main__")
    out = capsys.readouterr().out
    budgets = re.findall(r"^budget B\(0\.6, 0\.9\): (batch \d+, alpha [0-9.]+, A [0-9.]+, eta \d+); (\S+):", out,
                         flags=re.MULTILINE)
    assert [method for _, method in budgets] == ["darel", "random", "infobatch"], out
    assert len({calibration for calibration, _ in budgets}) == 1  # one budget, one calibration
    for method in ("darel", "random", "infobatch"):
        assert re.search(rf"^{method}: top-1 [0-9.]+ % in", out, flags=re.MULTILINE), out
