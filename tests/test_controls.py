"""The study's controls keep exactly what they promise (darel/methods/<method>/)."""

import math

import numpy as np
import pytest
import torch

import yaml

from darel import image_training, plans, schedules
from darel.methods import base, subsets
from darel.methods.infobatch import policy as infobatch
from darel.methods.selective_backprop import policy as selective_backprop
from darel.augment import DeviceAugment
from darel.methods.darel import OnlineSettings
from darel.methods.infobatch import InfoBatchSettings
from darel.methods.rs2 import RS2Settings
from darel.methods.selective_backprop import SelectiveBackpropSettings
from tests.conftest import ROOT

PARAMS = yaml.safe_load((ROOT / "params.yaml").read_text())
from darel.models import build_model
from darel.selection import select_by_loss


def test_random_offline_keeps_darels_class_counts_with_another_seeded_choice():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 7, size=500)
    losses = rng.exponential(size=500)
    darel = select_by_loss(losses, labels, 0.7, "hard")
    first = subsets.random_per_class(labels, 0.7, seed=3)
    again = subsets.random_per_class(labels, 0.7, seed=3)
    other = subsets.random_per_class(labels, 0.7, seed=4)
    for cls in range(7):
        n = int((labels == cls).sum())
        assert (labels[first] == cls).sum() == (labels[darel] == cls).sum() == math.ceil(0.7 * n)
    assert np.array_equal(first, again) and not np.array_equal(first, other)
    assert not np.array_equal(first, darel)
    assert len(np.unique(first)) == len(first) and np.all(np.diff(first) > 0)
    with pytest.raises(ValueError, match="alpha"):
        subsets.random_per_class(labels, 0.0, seed=0)


def _problem(n=192, classes=4, size=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % classes
    images = (torch.rand(n, 1, size, size, generator=gen) * 120 + labels.view(-1, 1, 1, 1) * 30).to(torch.uint8)
    return images, labels


def _train(plan, images, labels, on_epoch_end=None):
    torch.manual_seed(0)
    model = build_model("resnet18", num_classes=4, in_channels=1, width=4)
    aug = DeviceAugment(pad=1, hflip=False, max_rotation_deg=0, mean=[0.3], std=[0.2])
    summary = image_training.train(model, images, labels, aug, aug.normalise, plan, torch.device("cpu"), progress=False,
                           on_epoch_end=on_epoch_end)
    return model, summary


def _plan(**kw):
    base = dict(epochs=4, batch=16, lr_schedule=schedules.LrSchedule("multistep", 0.05, milestones=(3,), gamma=0.2),
                momentum=0.9, weight_decay=5e-4, seed=1, eval_batch=64)
    base.update(kw)
    return plans.RunPlan(**base)


def test_short_schedule_learning_rate_reaches_zero_at_its_last_planned_step():
    images, labels = _problem(n=80)
    steps = 3 * math.ceil(80 / 16)
    linear = schedules.LrSchedule("linear", 0.05, total_steps=steps)
    model, summary = _train(_plan(epochs=6, train_epochs=3, lr_schedule=linear), images, labels)
    assert summary["steps"] == steps == 15
    # The rate recorded after each epoch: 1 - 5/15, 1 - 10/15, then exactly zero.
    assert summary["curves"]["lr"] == pytest.approx([0.05 * 10 / 15, 0.05 * 5 / 15, 0.0], abs=1e-12)
    assert [schedules.linear_to_zero(k, 15) for k in (0, 14, 15)] == [1.0, pytest.approx(1 / 15), 0.0]
    assert base.epochs_that_fit(2.0, 7.0, 10) == 3 and base.epochs_that_fit(2.0, 1.0, 10) == 1


def test_uniform_rule_keeps_A_whatever_the_loss():
    from darel.sampler import OnlineSampler

    n = 20000
    sampler = OnlineSampler(n_samples=n, batch_size=100, keep_fraction=0.3, eta=1, warmup_epochs=0,
                            history_size=1000, bins=10, seed=0, rule="uniform")
    losses = torch.linspace(0, 10, n)
    kept = torch.cat(sampler.plan_epoch(0) + [sampler.state_dict()["pending"]])
    assert abs(len(kept) / n - 0.3) < 0.02
    low, high = (kept < n // 2).sum().item(), (kept >= n // 2).sum().item()
    assert abs(low - high) / len(kept) < 0.05  # no preference for the upper half of the losses
    assert not sampler.needs_refresh(1)  # no scoring pass: the rule needs no loss
    del losses


def test_selective_backprop_trains_full_batches_and_prefers_big_losers():
    n, b = 4000, 50
    policy = selective_backprop.SelectiveBackprop(n_samples=n, batch_size=b, beta=3.0,
                                                  candidate_batch=400, history_size=2000, warmup_epochs=0, seed=0)
    assert policy.keep_fraction == pytest.approx(0.25)  # 1 / (beta + 1)
    loss_of = torch.linspace(0.0, 1.0, n)  # sample i's loss grows with i
    chosen = []
    for positions, weights in policy.batches(0, lambda pos: loss_of[pos]):
        assert weights is None and len(positions) == b
        chosen.append(positions)
    chosen = torch.cat(chosen)
    stats = policy.stats()
    assert stats["kept_total"] == n // 4  # exactly the planned share, whatever the losses' distribution
    assert len(chosen) == (stats["kept_total"] // b) * b
    # P(select) = percentile ** 3: the top quarter of the losses is chosen far more often.
    top = (chosen >= 3 * n // 4).float().mean().item()
    bottom = (chosen < n // 4).float().mean().item()
    assert top > 0.5 and bottom < 0.02
    p = selective_backprop.selection_probabilities(torch.tensor([0.0, 0.5, 1.0]), torch.tensor([0.0, 0.5, 1.0, 2.0]),
                                                  2.0)
    assert p.tolist() == pytest.approx([(1 / 4) ** 2, (2 / 4) ** 2, (3 / 4) ** 2])


def test_infobatch_prunes_only_below_mean_rescales_exactly_and_anneals():
    n = 1000
    scores = torch.cat([torch.zeros(600), torch.ones(400)])  # mean 0.4: the first 600 are below it
    kept, weights, r = infobatch.prune(scores, 300, torch.Generator().manual_seed(0))
    assert set(range(600, 1000)) <= set(kept.tolist())  # no above-mean sample is ever pruned
    below_kept = kept < 600
    assert r == 0.5 and int(below_kept.sum()) == 300  # exactly the count asked for: r = 300 / 600
    assert torch.equal(weights[below_kept], torch.full((300,), 2.0))
    assert torch.equal(weights[~below_kept], torch.ones(int((~below_kept).sum())))
    kept, _, r = infobatch.prune(scores, 590, torch.Generator().manual_seed(0), r_max=0.9)
    assert r == 0.9 and len(kept) == n - 540  # never more than r_max of the below-mean samples
    assert infobatch.anneal_start(16) == 14 and infobatch.anneal_start(12) == 10

    policy = infobatch.InfoBatch(n_samples=n, batch_size=64, prune_count=300, anneal_start_epoch=3, seed=0)
    counts = []
    for epoch in range(4):
        trained = 0
        for positions, weights in policy.batches(epoch):
            trained += len(positions)
            policy.observe(positions, scores[positions])
        counts.append(trained)
    assert counts == [n, 700, 700, n]  # first and annealing epochs: everything; pruned ones: the plan exactly


def test_infobatch_training_rescales_the_loss_of_kept_low_loss_samples():
    images, labels = _problem(n=96)
    plan = _plan(epochs=4, selection=InfoBatchSettings(prune_count=30, anneal_start_epoch=3))
    _, summary = _train(plan, images, labels)
    trained = summary["curves"]["samples_trained"]
    assert trained[0] == 96 and trained[3] == 96 and all(t < 96 for t in trained[1:3])
    assert summary["selection"]["policy"] == "infobatch"


def test_infobatch_prune_count_fits_the_budget():
    # 10 epochs of 100 steps of 0.1 s, t_max 80 s: epoch 0 and the 2 annealing epochs are
    # full (300 steps), 7 pruned epochs share 500 steps -> 71 steps each -> 710 samples kept,
    # P = 290 dropped, within r_max * 0.5 * n = 450.
    fit = infobatch.prune_count_for_budget(step_s=0.1, n_samples=1000, batch=10, epochs=10, t_max_s=80.0)
    assert fit["planned_epochs"] == 10 and fit["prune_count"] == 290 and fit["predicted_time_s"] <= 80.0
    assert fit["epoch_samples"] == {"full": 1000, "prune": 710, "anneal": 1000}
    # Too tight for r_max at 10 epochs: fewer epochs, still within t_max.
    tight = infobatch.prune_count_for_budget(step_s=0.1, n_samples=1000, batch=10, epochs=10, t_max_s=40.0)
    assert tight["planned_epochs"] < 10 and tight["predicted_time_s"] <= 40.0
    assert tight["prune_count"] <= 450
    # Not even one full epoch fits: no plan.
    assert infobatch.prune_count_for_budget(step_s=0.1, n_samples=1000, batch=10, epochs=10, t_max_s=5.0) is None


def _calibration(**kw):
    cal = dict(batch=64, A=0.3, eta=3, n_kept=800, t_max_s=20.0, seconds_per_probe_second=1.2, t_b_s=0.05,
               t_score_s=0.04, score_batch=256, t_plan_s=0.01)
    cal.update(kw)
    return cal


def _method_plan(method, cal, epochs):
    return plans.method_plan(method, cal, n_full=1000, warmup_epochs=2, epochs=epochs, params=PARAMS)


@pytest.mark.parametrize("method", ["darel", "random-offline", "uniform-online", "random", "short-schedule",
                                    "selective-backprop", "infobatch"])
def test_every_method_plan_fits_the_same_budget(method):
    plan = _method_plan(method, _calibration(), epochs=12)
    assert plan.batch == 64 and 1 <= plan.planned_epochs <= 12
    assert plan.predicted_time_s <= 20.0 * (1 + 1e-9) or plan.plan_exceeds_budget


def test_controls_without_a_scoring_pass_get_more_epochs():
    cal = _calibration(t_max_s=8.0)
    darel = _method_plan("darel", cal, epochs=40)
    uniform = _method_plan("uniform-online", cal, epochs=40)
    assert darel.subset == uniform.subset == "darel"
    assert uniform.planned_epochs > darel.planned_epochs
    assert _method_plan("random-offline", cal, epochs=40).planned_epochs == darel.planned_epochs


# ---- the study's matched schedule rule -------------------------------------------------------

def _matched_plans(n: int) -> dict:
    """One run plan per kind of selection, each under the matched rule with its own epochs."""
    matched = lambda shape, epochs, samples: schedules.LrSchedule(  # noqa: E731
        "matched", 0.05, shape=shape, planned_epochs=epochs, epoch_samples=tuple(samples.items()),
        fractions=(0.3, 0.6, 0.8), gamma=0.2)
    online = OnlineSettings(keep_fraction=0.5, eta=1, warmup_epochs=1, history_size=256, bins=10)
    return {
        "full (short-schedule)": dict(train_epochs=3, lr_schedule=matched("multistep", 3, {"warmup": n})),
        "darel online": dict(train_epochs=4, selection=online,
                             lr_schedule=matched("multistep", 4, {"warmup": n, "refresh": n / 2, "reuse": n / 2})),
        "uniform online": dict(train_epochs=4, selection=OnlineSettings(0.5, 1, 1, 256, 10, rule="uniform"),
                               lr_schedule=matched("multistep", 4, {"warmup": n, "refresh": n / 2, "reuse": n / 2})),
        "selective-backprop": dict(train_epochs=4, selection=SelectiveBackpropSettings(
            beta=1.0, warmup_epochs=1, history_size=64),
            lr_schedule=matched("multistep", 4, {"warmup": n, "select": n / 2})),
        "infobatch": dict(train_epochs=4, selection=InfoBatchSettings(prune_count=20, anneal_start_epoch=3),
                          lr_schedule=matched("multistep", 4, {"full": n, "prune": n - 20, "anneal": n})),
        "rs2": dict(train_epochs=5, selection=RS2Settings(ratio=0.4),
                    lr_schedule=matched("multistep", 5, {"subset": 0.4 * n})),
        "cosine": dict(train_epochs=3, lr_schedule=matched("cosine", 3, {"warmup": n})),
    }


@pytest.mark.parametrize("name", list(_matched_plans(96)))
def test_under_the_matched_rule_every_method_ends_at_the_schedules_final_value(name):
    """Whatever a method's epochs and steps, its last step runs at the protocol shape's
    final rate: multistep lr * gamma ** 3, cosine 0."""
    from darel import schedules

    images, labels = _problem(n=96)
    settings = _matched_plans(96)[name]
    plan = _plan(epochs=6, **settings)
    rates = []
    _, summary = _train(plan, images, labels, on_epoch_end=lambda epoch, record: rates.append(record["lr"]))
    shape = settings["lr_schedule"].shape
    final = 0.05 * schedules.final_factor(shape, fractions=(0.3, 0.6, 0.8), gamma=0.2)
    assert summary["epochs_completed"] == settings["train_epochs"]
    assert rates[-1] == pytest.approx(final, abs=1e-12)
    assert rates[0] > rates[-1]  # it decayed on the way
    assert all(a >= b - 1e-12 for a, b in zip(rates, rates[1:]))  # and never went back up


def test_rs2_draws_fresh_subsets_without_replacement_across_epochs():
    from darel.methods.rs2 import policy as rs2

    n, b = 100, 16
    policy = rs2.RandomSubsetsPerEpoch(n_samples=n, batch_size=b, ratio=0.3, seed=4)
    epochs = []
    for epoch in range(4):
        chosen = torch.cat([positions for positions, weights in policy.batches(epoch)])
        assert len(chosen) == 30
        epochs.append(chosen)
    first_pass = torch.cat(epochs[:3]).tolist()
    assert len(set(first_pass)) == 90  # no sample twice before the permutation is used up
    assert set(epochs[3].tolist()) >= set(range(n)) - set(first_pass)  # the rest of it comes first in epoch 4
    state = policy.state_dict()
    again = rs2.RandomSubsetsPerEpoch(n_samples=n, batch_size=b, ratio=0.3, seed=4)
    again.load_state_dict(state)
    assert torch.equal(torch.cat([p for p, _ in policy.batches(4)]), torch.cat([p for p, _ in again.batches(4)]))
    assert rs2.ratio_for_budget(step_s=0.1, n_samples=1000, batch=10, epochs=10, t_max_s=50.0) == pytest.approx(0.5)


@pytest.mark.parametrize("method", ["darel", "random-offline", "uniform-online", "random", "short-schedule",
                                    "selective-backprop", "infobatch", "rs2"])
def test_no_plan_over_its_budget_is_ever_used(method):
    """At the boundary a plan fits t_max exactly; below one epoch's cost there is no plan."""
    cal = _calibration(t_max_s=20.0)
    plan = _method_plan(method, cal, epochs=12)
    assert plan.predicted_time_s <= 20.0 * (1 + 1e-9) and not plan.plan_exceeds_budget
    exact = _method_plan(method, _calibration(t_max_s=plan.predicted_time_s), epochs=12)
    assert exact.planned_epochs == plan.planned_epochs  # a budget hit exactly (up to rounding) still fits
    with pytest.raises(plans.PlanError, match=method):
        _method_plan(method, _calibration(t_max_s=0.05), epochs=12)
