from __future__ import annotations

import pytest
import torch

from darel.sampler import (
    LossHistory,
    OnlineSampler,
    chunked_keep_probabilities,
    keep_probabilities,
    per_chunk_keep_probabilities,
)


def make_sampler(n: int = 2000, batch: int = 64, A: float = 0.3, eta: int = 1, warmup: int = 1,
                 history: int = 512, bins: int = 10, seed: int = 0) -> OnlineSampler:
    return OnlineSampler(n_samples=n, batch_size=batch, keep_fraction=A, eta=eta, warmup_epochs=warmup,
                         history_size=history, bins=bins, seed=seed)


def bimodal_losses(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """90% of losses uniform in [0, 0.2) (frequent), 10% in [1.8, 2.0] (rare)."""
    g = torch.Generator().manual_seed(seed)
    rare = torch.rand(n, generator=g) < 0.1
    base = torch.rand(n, generator=g) * 0.2
    return torch.where(rare, base + 1.8, base), rare


# -- LossHistory ---------------------------------------------------------------------

def test_history_ring_buffer_keeps_newest_in_order():
    h = LossHistory(5)
    h.push(torch.tensor([1.0, 2.0, 3.0]))
    assert len(h) == 3 and h.values().tolist() == [1.0, 2.0, 3.0]
    h.push(torch.tensor([4.0, 5.0, 6.0]))
    assert len(h) == 5 and h.values().tolist() == [2.0, 3.0, 4.0, 5.0, 6.0]
    h.push(torch.arange(10.0, 17.0))  # longer than capacity
    assert h.values().tolist() == [12.0, 13.0, 14.0, 15.0, 16.0]
    h.push(torch.tensor([20.0]))
    restored = LossHistory(5)
    restored.load_state_dict(h.state_dict())
    assert restored.values().tolist() == h.values().tolist() == [13.0, 14.0, 15.0, 16.0, 20.0]
    restored.push(torch.tensor([21.0]))
    h.push(torch.tensor([21.0]))
    assert restored.values().tolist() == h.values().tolist()
    with pytest.raises(ValueError, match="capacity"):
        LossHistory(0)


# -- keep_probabilities --------------------------------------------------------------

def test_keep_probabilities_mean_and_cap():
    losses, _ = bimodal_losses(1000)
    for A in (0.05, 0.3, 0.6, 0.95, 1.0):
        p = keep_probabilities(losses, losses, A, 10)
        assert abs(float(p.mean()) - A) < 1e-6
        assert float(p.max()) <= 1.0 and float(p.min()) >= 0.0
    # At A = 0.95 the frequent bin (weight 0.9 vs 0.1) would need p > 1: it is capped
    # and the excess goes to the rare samples.
    p = keep_probabilities(losses, losses, 0.95, 10)
    assert int((p == 1.0).sum()) >= 800
    # Proportional to frequency while nothing is capped.
    p = keep_probabilities(losses, losses, 0.3, 10)
    assert float(p.max() / p.min()) > 5


def test_keep_probabilities_flat_history_and_outside_range():
    p = keep_probabilities(torch.tensor([0.5, 3.0, -1.0, 1.0]), torch.ones(20), 0.5, 8)
    assert torch.allclose(p, torch.full((4,), 0.5, dtype=p.dtype))
    history = torch.tensor([0.0, 0.0, 0.0, 1.0])  # bin 0 holds 3/4, last bin 1/4
    p = keep_probabilities(torch.tensor([-5.0, 7.0]), history, 0.5, 4)  # clamp to edge bins
    assert p[0] / p[1] == pytest.approx(3.0)


def test_keep_probabilities_validation():
    with pytest.raises(ValueError, match="keep_fraction"):
        keep_probabilities(torch.ones(3), torch.ones(3), 0.0, 4)
    with pytest.raises(ValueError, match="bins"):
        keep_probabilities(torch.ones(3), torch.ones(3), 0.5, 0)
    with pytest.raises(ValueError, match="empty"):
        keep_probabilities(torch.ones(3), torch.ones(0), 0.5, 4)
    with pytest.raises(ValueError, match="finite"):
        keep_probabilities(torch.tensor([float("nan")]), torch.ones(3), 0.5, 4)


# -- OnlineSampler --------------------------------------------------------------------

def test_kept_fraction_matches_A():
    n = 50_000
    s = make_sampler(n=n, batch=128, A=0.3, warmup=0, history=1024)
    losses, _ = bimodal_losses(n)
    s.update_losses(0, losses)
    s.plan_epoch(0)
    stats = s.stats()
    assert stats["seen_total"] == n
    assert abs(stats["keep_fraction_observed"] - 0.3) < 0.01


def test_frequent_losses_are_kept_more_often():
    n = 20_000
    s = make_sampler(n=n, batch=100, A=0.3, warmup=0, history=1000)
    losses, rare = bimodal_losses(n, seed=1)
    s.update_losses(0, losses)
    kept = torch.cat(s.plan_epoch(0) + [s.state_dict()["pending"]])
    mask = torch.zeros(n, dtype=torch.bool)
    mask[kept] = True
    rate_frequent = float(mask[~rare].float().mean())
    rate_rare = float(mask[rare].float().mean())
    # Expected about 0.33 vs 0.037 (bin weights 0.9 vs 0.1).
    assert rate_frequent > 3 * rate_rare


def test_online_batches_are_full_and_unique_across_carry_over():
    n, b = 3000, 64
    s = make_sampler(n=n, batch=b, A=0.45, warmup=1, eta=2)
    losses, _ = bimodal_losses(n)
    carried = 0
    for epoch in range(5):
        carried += s.stats()["pending"] if not s.is_warmup(epoch) else 0
        if s.needs_refresh(epoch):
            s.update_losses(epoch, losses)
        batches = s.plan_epoch(epoch)
        if s.is_warmup(epoch):
            continue
        assert batches, "an online epoch with A=0.45 must emit batches"
        for idx in batches:
            assert idx.dtype == torch.int64
            assert idx.numel() == b
            assert torch.unique(idx).numel() == b
        assert s.stats()["pending"] < b
    assert carried > 0, "the carry-over path between epochs was never exercised"


def test_warmup_covers_every_index_once():
    s = make_sampler(n=1000, batch=64, warmup=2)
    for epoch in range(2):
        assert s.is_warmup(epoch)
        batches = s.plan_epoch(epoch)
        assert [x.numel() for x in batches] == [64] * 15 + [40]
        assert torch.equal(torch.sort(torch.cat(batches)).values, torch.arange(1000))
    assert not s.is_warmup(2)


@pytest.mark.parametrize("eta,expected", [
    (1, [False, False] + [True] * 10),
    (2, [False, False] + [True, False] * 5),
    (3, [False, False] + [True, False, False] * 3 + [True]),
])
def test_refresh_schedule(eta, expected):
    s = make_sampler(n=10, eta=eta, warmup=2)
    seen = []
    for epoch in range(12):
        refresh = s.needs_refresh(epoch)
        seen.append(refresh)
        if refresh:
            s.update_losses(epoch, torch.rand(10))
    assert seen == expected


def test_online_epoch_without_losses_is_an_error():
    s = make_sampler(n=10, warmup=0)
    with pytest.raises(ValueError, match="no losses"):
        s.plan_epoch(0)
    with pytest.raises(ValueError, match="expected 10 losses, got 9"):
        s.update_losses(0, torch.rand(9))
    with pytest.raises(ValueError, match="1 non-finite"):
        s.update_losses(0, torch.tensor([float("inf")] + [0.0] * 9))
    with pytest.raises(ValueError, match="keep_fraction"):
        make_sampler(A=1.5)


def test_state_dict_round_trip_replays_next_epoch():
    n = 2000
    losses, _ = bimodal_losses(n)
    original = make_sampler(n=n, A=0.35, eta=2, warmup=1, seed=7)
    for epoch in range(3):
        if original.needs_refresh(epoch):
            original.update_losses(epoch, losses * (1 + epoch))
        original.plan_epoch(epoch)
    state = original.state_dict()

    restored = make_sampler(n=n, A=0.35, eta=2, warmup=1, seed=7)
    restored.load_state_dict(state)
    for epoch in (3, 4):
        assert original.needs_refresh(epoch) == restored.needs_refresh(epoch)
        if original.needs_refresh(epoch):
            original.update_losses(epoch, losses * (1 + epoch))
            restored.update_losses(epoch, losses * (1 + epoch))
        a, b = original.plan_epoch(epoch), restored.plan_epoch(epoch)
        assert len(a) == len(b) > 0
        assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert original.stats() == restored.stats()
    with pytest.raises(ValueError, match="n_samples"):
        make_sampler(n=n + 1).load_state_dict(state)


# -- batched planning against the per-chunk reference -----------------------------------

def _losses_of(kind: str, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if kind == "uniform":
        return torch.rand(n, generator=g)
    if kind == "heavy":  # Pareto tail (index 0.7: infinite mean), as cross-entropy losses can be
        return (1 - torch.rand(n, generator=g)).pow(-1 / 0.7)
    if kind == "ties":  # few distinct values: flat windows and exact bin edges
        return torch.randint(0, 3, (n,), generator=g).float()
    raise ValueError(kind)


@pytest.mark.parametrize("kind", ["uniform", "heavy", "ties"])
@pytest.mark.parametrize("capacity,chunk,n,n_history", [
    (64, 16, 200, 0),     # buffer fills during the epoch; partial last chunk (200 = 12 x 16 + 8)
    (64, 16, 200, 20),    # starts part full
    (64, 16, 200, 64),    # starts full: wrap-around from the first chunk on
    (100, 7, 1000, 100),  # window not a multiple of the chunk
    (5, 16, 50, 5),       # chunks longer than the buffer
    (300, 64, 64, 0),     # a single chunk
    (4096, 128, 3000, 4096),
])
@pytest.mark.parametrize("A", [0.05, 0.3, 0.9, 1.0])
def test_chunked_probabilities_equal_the_per_chunk_definition(kind, capacity, chunk, n, n_history, A):
    values = _losses_of(kind, n_history + n, seed=capacity + chunk + n)
    reference = LossHistory(capacity)
    if n_history:
        reference.push(values[:n_history])
    before = reference.values().clone()
    losses = values[n_history:]
    expected = per_chunk_keep_probabilities(reference, losses, chunk, A, bins=20)
    got = chunked_keep_probabilities(before, losses, chunk, capacity, A, bins=20)
    assert got.dtype == torch.float64 and got.shape == (n,)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
    # One push of the whole epoch leaves the buffer the per-chunk pushes left.
    batched = LossHistory(capacity)
    batched.load_state_dict({"capacity": capacity, "values": before})
    batched.push(losses)
    assert len(batched) == len(reference)
    assert torch.equal(batched.values(), reference.values())


def test_chunked_probabilities_in_several_passes_equal_one_pass():
    losses = _losses_of("heavy", 5000, seed=3)
    history = _losses_of("uniform", 300, seed=4)
    one = chunked_keep_probabilities(history, losses, 16, 300, 0.3, 10)
    several = chunked_keep_probabilities(history, losses, 16, 300, 0.3, 10, max_elements=1000)  # 3 chunks a pass
    assert torch.equal(one, several)
    with pytest.raises(ValueError, match="capacity"):
        chunked_keep_probabilities(torch.zeros(301), losses, 16, 300, 0.3, 10)


@pytest.mark.parametrize("kind", ["uniform", "heavy"])
def test_batched_planner_plans_what_the_per_chunk_planner_plans(kind):
    """Same seed, several epochs with refreshes, carry-over and wrap-around: same batches,
    same buffer, same counters (draws are shared: one uniform per sample per epoch)."""
    n = 3000
    planners = {name: OnlineSampler(n_samples=n, batch_size=64, keep_fraction=0.35, eta=2, warmup_epochs=1,
                                    history_size=500, bins=10, seed=5, planner=name)
                for name in ("batched", "per_chunk")}
    carried = 0
    for epoch in range(6):
        plans = {}
        for name, s in planners.items():
            if s.needs_refresh(epoch):
                s.update_losses(epoch, _losses_of(kind, n, seed=epoch))
            plans[name] = s.plan_epoch(epoch)
        a, b = plans["batched"], plans["per_chunk"]
        assert len(a) == len(b) > 0
        assert all(torch.equal(x, y) for x, y in zip(a, b))
        assert torch.equal(planners["batched"].history.values(), planners["per_chunk"].history.values())
        assert torch.equal(planners["batched"]._pending, planners["per_chunk"]._pending)
        carried += planners["batched"].stats()["pending"]
    assert carried > 0, "the carry-over path was never exercised"
    assert planners["batched"].stats() == planners["per_chunk"].stats()


def test_online_plan_is_views_of_one_index_tensor():
    s = make_sampler(n=1000, batch=32, A=0.5, warmup=0)
    s.update_losses(0, torch.rand(1000))
    batches = s.plan_epoch(0)
    base = batches[0]._base
    assert base is not None and all(b._base is base for b in batches)


# -- the uniform keep rule (control) ----------------------------------------------------

def test_uniform_rule_keeps_A_whatever_the_loss():
    n, A = 50_000, 0.3
    s = OnlineSampler(n_samples=n, batch_size=128, keep_fraction=A, eta=1, warmup_epochs=0, history_size=1024,
                      bins=20, seed=0, rule="uniform")
    assert not s.needs_refresh(0)  # it uses no losses
    losses, rare = bimodal_losses(n)
    s.update_losses(0, losses)
    kept = torch.cat(s.plan_epoch(0) + [s.state_dict()["pending"]])
    mask = torch.zeros(n, dtype=torch.bool)
    mask[kept] = True
    # Binomial standard deviations: 0.002 overall, 0.0065 on the 10 % rare samples.
    assert abs(s.stats()["keep_fraction_observed"] - A) < 0.01
    assert abs(float(mask[rare].float().mean()) - A) < 0.035
    assert abs(float(mask[~rare].float().mean()) - A) < 0.015
    # No dependence on the loss at all: other losses (or none) give the very same batches.
    for other in (losses.flip(0) * 100, None):
        t = OnlineSampler(n_samples=n, batch_size=128, keep_fraction=A, eta=1, warmup_epochs=0, history_size=1024,
                          bins=20, seed=0, rule="uniform")
        if other is not None:
            t.update_losses(0, other)
        assert torch.equal(torch.cat(t.plan_epoch(0) + [t.state_dict()["pending"]]), kept)


def test_rule_and_planner_are_validated():
    with pytest.raises(ValueError, match="rule"):
        OnlineSampler(10, 2, 0.5, 1, 0, 4, 2, 0, rule="loss")
    with pytest.raises(ValueError, match="planner"):
        OnlineSampler(10, 2, 0.5, 1, 0, 4, 2, 0, planner="fast")


# -- the keep floor (darel-floor) ------------------------------------------------------

def _kept_mask(s: OnlineSampler, n: int) -> torch.Tensor:
    kept = torch.cat(s.plan_epoch(0) + [s.state_dict()["pending"]])
    mask = torch.zeros(n, dtype=torch.bool)
    mask[kept] = True
    return mask


def test_a_zero_floor_plans_exactly_what_algorithm_3_plans():
    n = 5000
    losses, _ = bimodal_losses(n, seed=2)
    plain, floored = make_sampler(n=n, warmup=0), OnlineSampler(n_samples=n, batch_size=64, keep_fraction=0.3, eta=1,
                                                                warmup_epochs=0, history_size=512, bins=10, seed=0,
                                                                floor=0.0)
    for s in (plain, floored):
        s.update_losses(0, losses)
    assert torch.equal(_kept_mask(plain, n), _kept_mask(floored, n))


def test_a_floor_keeps_the_tail_at_least_floor_times_A_and_the_mean_at_A():
    n, A, floor = 50_000, 0.3, 0.5
    losses, rare = bimodal_losses(n, seed=1)
    rates = {}
    for f in (0.0, floor, 1.0):
        s = OnlineSampler(n_samples=n, batch_size=100, keep_fraction=A, eta=1, warmup_epochs=0, history_size=1000,
                          bins=10, seed=0, floor=f)
        s.update_losses(0, losses)
        mask = _kept_mask(s, n)
        rates[f] = (float(mask[rare].float().mean()), float(mask[~rare].float().mean()))
        assert abs(s.stats()["keep_fraction_observed"] - A) < 0.01  # the budget's share, whatever the floor
    # Algorithm 3 keeps the rare tail at about 0.037; half a floor of A lifts it to about
    # floor * A + (1 - floor) * 0.037 = 0.17; a full floor is the uniform rule (A for all).
    assert rates[0.0][0] < 0.06
    assert floor * A - 0.02 < rates[floor][0] < floor * A + 0.06
    assert abs(rates[1.0][0] - A) < 0.035 and abs(rates[1.0][1] - A) < 0.015


def test_the_floor_is_validated():
    with pytest.raises(ValueError, match="floor"):
        OnlineSampler(10, 2, 0.5, 1, 0, 4, 2, 0, floor=1.5)
    with pytest.raises(ValueError, match="floor"):
        OnlineSampler(10, 2, 0.5, 1, 0, 4, 2, 0, floor=0.5, rule="uniform")
