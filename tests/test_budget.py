from __future__ import annotations

import json
import math

import pytest

from darel.budget import (BudgetError, Probe, calibrate, epoch_kinds, fit_batch_size, floor_pow2, online_epoch_costs,
                          plan_epochs, predicted_full_time, probe_batch_sizes, regress_batch_on_memory,
                          selection_ratios, step_time_for)

MIB = 2**20
STATIC = 100 * MIB
PER_SAMPLE = 1 * MIB
MAX_BATCH = 128
M_FULL = STATIC + MAX_BATCH * PER_SAMPLE  # 228 MiB: the baseline's peak at batch 128


def linear_memory(calls: list[int] | None = None):
    def measure(b: int) -> tuple[float, int]:
        if calls is not None:
            calls.append(b)
        return 0.01 + 0.001 * b, STATIC + b * PER_SAMPLE

    return measure


# mem(b) = 100 + b MiB, so h(m_max) = m_max - 100 (in MiB), then floor to a power of two:
#   m=1.00: m_max 228.0 -> h 128.0 -> 128 (all probes 1..128)
#   m=0.80: m_max 182.4 -> h  82.4 ->  64 (probe 128 = 228 reaches m_max)
#   m=0.70: m_max 159.6 -> h  59.6 ->  32 (probe 64 = 164 reaches m_max)
#   m=0.55: m_max 125.4 -> h  25.4 ->  16 (probe 32 = 132 reaches m_max)
#   m=0.45: m_max 102.6 -> h   2.6 ->   2 (probe 4 = 104 reaches m_max)
@pytest.mark.parametrize("m,expected", [(1.0, 128), (0.8, 64), (0.7, 32), (0.55, 16), (0.45, 2)])
def test_batch_for_memory_budget(m, expected):
    m_max = m * M_FULL
    probes = probe_batch_sizes(linear_memory(), m_max, MAX_BATCH)
    b = fit_batch_size(probes, m_max, MAX_BATCH)
    assert b == expected
    assert STATIC + b * PER_SAMPLE <= m_max


def test_probing_stops_at_first_probe_reaching_budget():
    calls: list[int] = []
    probes = probe_batch_sizes(linear_memory(calls), 0.55 * M_FULL, MAX_BATCH)
    assert calls == [1, 2, 4, 8, 16, 32]
    assert [p.batch for p in probes] == calls
    assert probes[-1].peak_mem_bytes >= 0.55 * M_FULL > probes[-2].peak_mem_bytes


def test_probing_never_passes_max_batch():
    calls: list[int] = []
    probe_batch_sizes(linear_memory(calls), 10 * M_FULL, 100)
    assert calls == [1, 2, 4, 8, 16, 32, 64, 100]
    calls.clear()
    probe_batch_sizes(linear_memory(calls), 10 * M_FULL, 64)
    assert calls == [1, 2, 4, 8, 16, 32, 64]


def test_batch_one_too_big_names_the_numbers():
    m_max = 0.44 * M_FULL  # 100.32 MiB < 101 MiB needed at batch 1
    with pytest.raises(BudgetError, match=r"100\.3 MiB.*batch 1.*101\.0 MiB"):
        probe_batch_sizes(linear_memory(), m_max, MAX_BATCH)
    assert issubclass(BudgetError, ValueError)


def test_fit_caps_and_guards():
    # Result never exceeds the largest probed batch, even if the line extrapolates beyond it.
    convex = [Probe(1, 1.0, 100), Probe(2, 1.0, 104), Probe(4, 1.0, 116), Probe(8, 1.0, 164)]
    assert regress_batch_on_memory(convex, 300) > 16
    assert fit_batch_size(convex, 300, 128) == 8
    # The chosen batch's own measurement above m_max halves it: h(145) = 2.87 -> 2, but mem(2) = 150.
    noisy = [Probe(1, 1.0, 100), Probe(2, 1.0, 150), Probe(4, 1.0, 140)]
    assert 2 <= regress_batch_on_memory(noisy, 145) < 4
    assert fit_batch_size(noisy, 145, 128) == 1
    # One probe scales proportionally through it.
    assert regress_batch_on_memory([Probe(1, 1.0, 100)], 350) == pytest.approx(3.5)
    assert fit_batch_size([Probe(1, 1.0, 100)], 100, 128) == 1
    assert floor_pow2(127.99) == 64 and floor_pow2(128) == 128 and floor_pow2(0.3) == 1


def test_step_time_and_predicted_time():
    probes = probe_batch_sizes(linear_memory(), M_FULL, MAX_BATCH)
    assert step_time_for(probes, 64) == pytest.approx(0.074)
    with pytest.raises(ValueError, match="no probe at batch 48"):
        step_time_for(probes, 48)
    # 50000 / 64 = 781.25 -> 782 steps per epoch.
    assert predicted_full_time(0.074, 50000, 64, 200) == pytest.approx(0.074 * 782 * 200)
    with pytest.raises(ValueError, match="n_samples"):
        predicted_full_time(0.1, 0, 64, 1)


# Equations 3-5 with T_new = 1000 s and alpha 0.8, so A = T*t / 800.
@pytest.mark.parametrize("T,t,A_raw,A,eta", [
    (1000, 0.2, 0.25, 0.25, 3),    # A <= 0.5
    (800, 0.5, 0.5, 0.5, 3),       # boundary A == 0.5 still gives 3
    (1000, 0.5, 0.625, 0.625, 2),  # 0.5 < A < 0.8
    (1280, 0.5, 0.8, 0.8, 1),      # boundary A == 0.8 gives 1
    (1000, 1.0, 1.25, 0.8, 1),     # above 0.8: eta from 1.25, A clipped to 0.8
])
def test_ratio_branches(T, t, A_raw, A, eta):
    r = selection_ratios(T, t, 1000.0)
    assert r["A_unclipped"] == pytest.approx(A_raw)
    assert r["A"] == pytest.approx(A)
    assert r["eta"] == eta
    assert r["alpha"] == 0.8 and r["alpha_lowered"] is False
    assert r["predicted_time_s"] == pytest.approx(1000.0 * 0.8 * A)


def test_alpha_is_lowered_when_floor_cannot_meet_budget():
    # T*t = 50 < T_new * 0.8 * 0.1 = 80: A stays 0.1, alpha = 50 / (1000 * 0.1) = 0.5.
    r = selection_ratios(1000.0, 0.05, 1000.0)
    assert r["A"] == pytest.approx(0.1) and r["A_unclipped"] == pytest.approx(0.1)
    assert r["alpha"] == pytest.approx(0.5) and r["alpha_lowered"] is True
    assert r["eta"] == 3
    assert r["predicted_time_s"] == pytest.approx(50.0)
    # Exactly at the floor (T*t = 80): A = 0.1 from the first branch, alpha untouched.
    r = selection_ratios(1000.0, 0.08, 1000.0)
    assert r["A"] == pytest.approx(0.1) and r["alpha"] == 0.8 and r["alpha_lowered"] is False


def test_ratio_validation():
    for bad in (0.0, 1.2):
        with pytest.raises(ValueError, match=f"t must be in \\(0, 1\\], got {bad}"):
            selection_ratios(1000.0, bad, 1000.0)
    with pytest.raises(ValueError, match="T_new_s"):
        selection_ratios(1000.0, 0.5, -1.0)
    with pytest.raises(ValueError, match="A_min"):
        selection_ratios(1000.0, 0.5, 1000.0, A_min=0.9, A_max=0.8)


def linear_times(batches: list[int], slowdown: float = 1.0) -> dict[int, float]:
    return {b: slowdown * (0.01 + 0.001 * b) for b in batches}


def test_calibrate_end_to_end_is_json_ready_and_consistent():
    timed: list[list[int]] = []

    def time_batches(batches):
        timed.append(list(batches))
        return linear_times(batches)

    r = calibrate(lambda b: STATIC + b * PER_SAMPLE, time_batches, T_full_s=1000.0, M_full_bytes=M_FULL, t=0.5,
                  m=0.8, n_samples=50000, epochs=200, max_batch=MAX_BATCH)
    json.dumps(r)
    # Every probed batch and the reference batch B = 128 are timed in one session.
    assert timed == [[1, 2, 4, 8, 16, 32, 64, 128]]
    assert r["batch"] == 64 and r["t_b_s"] == pytest.approx(0.074) and r["t_ref_s"] == pytest.approx(0.138)
    assert r["m_max_bytes"] == pytest.approx(0.8 * M_FULL) and r["t_max_s"] == pytest.approx(500.0)
    assert r["fitted_batch_unrounded"] == pytest.approx(82.4)
    # T_new = T * (t_64 * ceil(50000/64)) / (t_128 * ceil(50000/128)) = 1000 * 0.074 * 782 / (0.138 * 391).
    assert r["T_new_s"] == pytest.approx(1000 * 0.074 * 782 / (0.138 * 391))
    assert r["T_new_absolute_s"] == pytest.approx(0.074 * 782 * 200)
    # A = 500 / (1072.46 * 0.8) = 0.5828 -> eta 2, alpha untouched.
    assert r["A"] == pytest.approx(500 / (r["T_new_s"] * 0.8)) and r["eta"] == 2 and r["alpha"] == 0.8
    for key in ("T_full_s", "M_full_bytes", "t", "m", "n_samples", "epochs", "A", "alpha", "eta", "A_unclipped"):
        assert key in r
    with pytest.raises(ValueError, match="m must be in"):
        calibrate(lambda b: 1, linear_times, 1000.0, M_FULL, 0.5, 0.0, 100, 1, 128)
    assert math.isfinite(r["alpha"])


def test_calibration_is_immune_to_a_uniform_slowdown():
    # A machine three times slower during calibration changes every probe time alike:
    # batch, T_new, alpha, A and eta stay exactly the same.
    common = dict(T_full_s=1000.0, M_full_bytes=M_FULL, t=0.5, m=0.7, n_samples=50000, epochs=200,
                  max_batch=MAX_BATCH)
    memory = lambda b: STATIC + b * PER_SAMPLE  # noqa: E731
    idle = calibrate(memory, linear_times, **common)
    busy = calibrate(memory, lambda bs: linear_times(bs, slowdown=3.0), **common)
    for key in ("batch", "T_new_s", "alpha", "A", "eta"):
        assert busy[key] == pytest.approx(idle[key], rel=1e-12), key
    # At the baseline batch itself T_new is T exactly (the old absolute formula was not).
    full = calibrate(memory, lambda bs: linear_times(bs, slowdown=7.0), **{**common, "m": 1.0})
    assert full["batch"] == 128 and full["T_new_s"] == pytest.approx(1000.0)


def test_epoch_kinds_follow_the_sampler_schedule():
    from darel.sampler import OnlineSampler

    for warmup, eta in ((0, 1), (2, 3), (3, 2), (12, 1)):
        kinds = epoch_kinds(12, warmup, eta)
        sampler = OnlineSampler(n_samples=8, batch_size=4, keep_fraction=0.5, eta=eta, warmup_epochs=warmup,
                                history_size=8, bins=2, seed=0)
        expected = []
        for epoch in range(12):
            if sampler.is_warmup(epoch):
                expected.append("warmup")
            elif sampler.needs_refresh(epoch):
                expected.append("refresh")
                sampler.update_losses(epoch, __import__("torch").ones(8))
            else:
                expected.append("reuse")
        assert kinds == expected, (warmup, eta)
    assert epoch_kinds(6, 2, 3) == ["warmup", "warmup", "refresh", "reuse", "reuse", "refresh"]


def test_online_epoch_costs_and_plan_hand_computed():
    # n_kept 1000, b 100, A 0.35, e 250; probe seconds: step 0.2, scoring batch 0.1, planning 0.05;
    # the baseline ran 1.5x slower per step than the probe session.
    costs = online_epoch_costs(seconds_per_probe_second=1.5, t_b_s=0.2, batch=100, n_kept=1000, keep_fraction=0.35,
                               t_score_s=0.1, score_batch=250, t_plan_s=0.05)
    assert costs["warmup"] == pytest.approx(1.5 * 0.2 * 10)              # 10 steps
    assert costs["reuse"] == pytest.approx(1.5 * (0.2 * 3 + 0.05))       # floor(350 / 100) = 3 steps
    assert costs["refresh"] == pytest.approx(costs["reuse"] + 1.5 * 0.1 * 4)  # 4 scoring batches
    kinds = epoch_kinds(10, 2, 3)  # w w r u u r u u r u
    plan = plan_epochs(costs, kinds, t_max_s=10.0)
    cumulative = [3.0, 6.0, 7.575, 8.55, 9.525, 11.1]
    assert plan["planned_epochs"] == 5 and plan["predicted_time_s"] == pytest.approx(cumulative[4])
    assert plan["epoch_kinds"] == kinds[:5] and plan["plan_exceeds_budget"] is False
    # A budget smaller than one epoch still trains one, and says so.
    tight = plan_epochs(costs, kinds, t_max_s=1.0)
    assert tight["planned_epochs"] == 1 and tight["plan_exceeds_budget"] is True
    # A generous budget is capped by the schedule's epochs.
    assert plan_epochs(costs, kinds, t_max_s=1e9)["planned_epochs"] == 10


def test_a_measured_probe_within_the_budget_is_never_undercut():
    # Memory that grows a little slower at the top: the line through all probes, read at
    # m_max = the baseline's own peak, gives 127.4 -> 64; the probe at 128 itself fits, so
    # the baseline batch is kept (B(1, 1) must train at the baseline batch).
    probes = [Probe(1, 1.0, 100), Probe(2, 1.0, 101), Probe(4, 1.0, 103), Probe(8, 1.0, 107),
              Probe(16, 1.0, 115), Probe(32, 1.0, 131), Probe(64, 1.0, 163), Probe(128, 1.0, 224)]
    assert regress_batch_on_memory(probes, 224) < 128
    assert fit_batch_size(probes, 224, 128) == 128
    assert fit_batch_size(probes, 223, 128) == 64


# ---- one learning-rate function of the optimiser step (darel.schedules) -------------------------

def _torch_rates(make, steps: int) -> list[float]:
    """The rates a torch scheduler sets, stepped ``steps`` times (the first: before any step)."""
    import torch

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    scheduler = make(optimizer)
    rates = [optimizer.param_groups[0]["lr"]]
    for _ in range(steps):
        optimizer.step()
        scheduler.step()
        rates.append(optimizer.param_groups[0]["lr"])
    return rates


def test_one_rate_function_gives_every_schedulers_values_to_the_last_bit():
    """The protocols' multistep and cosine schedules, the short-schedule control's linear
    decay and the LoRA recipe's warm-up + linear decay: the same floats torch's and Hugging
    Face's schedulers set (so a run on the one function trains bit for bit as before)."""
    import torch
    from transformers import get_linear_schedule_with_warmup

    from darel.schedules import LrSchedule, StepAt, lr_at

    cases = [
        (LrSchedule("multistep", 0.1, milestones=(12, 24, 32), gamma=0.2),
         lambda opt: torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[12, 24, 32], gamma=0.2), 40, "epoch"),
        (LrSchedule("cosine", 0.1, span=40), lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=40),
         40, "epoch"),
        (LrSchedule("cosine", 0.1, span=7), lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=7),
         30, "epoch"),  # past its span too
        (LrSchedule("linear", 0.1, total_steps=37),
         lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda k: max(0.0, 1.0 - k / 37)), 40, "step"),
        (LrSchedule("warmup_linear", 0.1, warmup_steps=10, total_steps=57),
         lambda opt: get_linear_schedule_with_warmup(opt, 10, 57), 60, "step"),
    ]
    for rate, make, count, unit in cases:
        expected = _torch_rates(make, count)
        ours = [lr_at(rate, StepAt(epoch=k, step=0) if unit == "epoch" else StepAt(epoch=0, step=k))
                for k in range(count + 1)]
        assert ours == expected, rate.kind  # exact equality of floats, not approx
