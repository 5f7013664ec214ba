"""DAREL for your own model and data, without the workflow (no Snakemake, params.yaml or
MLflow): plan a budget from measured probes, pick the offline subset, and let the online
selection (or any control of darel.methods) choose the samples of your own training loop.

    from darel import api

    # 1. a budget B(t, m) from your baseline's time T and peak memory M, and probes of your step
    budget = api.plan_budget(train_step, score_step, model=model, optimizer=optimizer, labels=y,
                             epochs=20, baseline_batch=128, T_full_s=T, M_full_bytes=M, t=0.5, m=0.8,
                             history_size=4096, bins=20, warmup_epochs=2)
    # 2. Algorithm 2: the share alpha of every class with the highest loss under a scorer
    keep = api.offline_subset(scorer_losses, y, budget.alpha)
    # 3. Algorithm 3 inside your loop, on the kept samples, for the planned epochs
    selection = api.selection("darel", n_samples=len(keep), batch_size=budget.batch, seed=0,
                              keep_fraction=budget.A, eta=budget.eta, warmup_epochs=2, history_size=4096, bins=20)
    for epoch in range(budget.planned_epochs):
        for positions, weights in selection.batches(epoch, score=lambda p: no_grad_losses(keep[p])):
            losses = per_sample_loss(model(x[keep[positions]]), y[keep[positions]])
            ((losses * weights).mean() if weights is not None else losses.mean()).backward()
            optimizer.step(); optimizer.zero_grad()
            selection.observe(positions, losses.detach())

``train_step(b)`` runs one optimiser step of your loop on a batch of ``b`` samples and
``score_step(b)`` one no-grad forward of ``b`` samples (the scoring pass Algorithm 3 runs
every eta epochs): the probes time and meter those, in one session, the training state
put back afterwards. Everything is the code the workflow runs (darel.budget,
darel.selection, darel.methods); examples/own_training_loop.py is a complete script.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Callable

import numpy as np

from darel import methods
from darel.methods.base import Loop


@dataclass(frozen=True)
class Budget:
    """A planned budget B(t, m): Algorithm 1's batch, equations 2-5's alpha, A and eta, and
    the epochs the cost model fits into t_max; ``calibration`` holds every input, probe
    and intermediate (darel.budget.calibrate's record plus the plan)."""

    batch: int
    alpha: float
    A: float
    eta: int
    planned_epochs: int
    t_max_s: float
    predicted_time_s: float
    n_kept: int
    calibration: dict


def step_memory(train_step: Callable[[int], None], batch: int, *, model, optimizer, device: Any = "cpu",
                warmup: int = 1) -> int:
    """Peak memory (bytes) of one step at ``batch``, measured as the budget's probes measure
    it (darel.measure.StepMemoryMeter): use it for your baseline's M. The training state is
    put back afterwards."""
    import torch

    from darel.measure import StepMemoryMeter, preserved_training_state

    device = torch.device(device)
    with preserved_training_state(model, optimizer, None, device):
        for _ in range(warmup):
            train_step(batch)
        meter = StepMemoryMeter(model, optimizer, device)
        with meter.step(kind="train"):
            train_step(batch)
    return int(meter.peak_bytes)


def plan_budget(train_step: Callable[[int], None], score_step: Callable[[int], None], *, model, optimizer,
                labels, epochs: int, baseline_batch: int, T_full_s: float, M_full_bytes: float, t: float, m: float,
                history_size: int, bins: int, warmup_epochs: int = 0, score_batch: int | None = None, seed: int = 0,
                device: Any = "cpu", probe_warmup: int = 1, probe_repeats: int = 3, probe_rounds: int = 3,
                **ratios: float) -> Budget:
    """Algorithm 1 and equations 2-5 for your model (darel.budget.calibrate), then DAREL's
    plan (darel.methods.darel.online_epoch_plan): how many epochs of warm-up, refresh and
    reuse fit t_max = t T. ``labels`` are the training set's classes (Algorithm 2 keeps
    ceil(alpha n_c) of each), ``epochs`` and ``baseline_batch`` your baseline's, ``T_full_s``
    and ``M_full_bytes`` its measured time and peak step memory (``step_memory``).
    ``history_size`` and ``bins`` are Algorithm 3's (the planning's cost is timed with them),
    ``ratios`` equations 2-5's bounds (alpha_default, A_min, A_max; darel.budget.calibrate's
    defaults otherwise). ``score_batch``: the batch of the scoring pass (default: the
    baseline's). The probes are
    timed on the process's CPU time on a CPU and between synchronisations on a GPU (as
    ``T_full_s`` should be), interleaved in rounds so that a busy machine slows all alike."""
    import torch

    from darel import budget
    from darel.calibration import kept_total
    from darel.measure import preserved_training_state, time_passes
    from darel.methods.darel import online_epoch_plan
    from darel.sampler import OnlineSampler

    device = torch.device(device)
    labels = np.asarray(labels)
    n = len(labels)
    score_batch = int(score_batch or baseline_batch)

    def measure_memory(b: int) -> int:
        return step_memory(train_step, b, model=model, optimizer=optimizer, device=device, warmup=probe_warmup)

    session: dict = {}

    def time_batches(batches: list[int]) -> dict[int, float]:
        passes = {("train", b): (lambda b=b: train_step(b)) for b in batches}
        passes[("score", score_batch)] = lambda: score_step(score_batch)
        with preserved_training_state(model, optimizer, None, device):
            times = time_passes(passes, device, warmup=probe_warmup, repeats=probe_repeats, rounds=probe_rounds)
        session["t_score_s"] = times[("score", score_batch)]
        return {b: times[("train", b)] for b in batches}

    result = budget.calibrate(measure_memory, time_batches, T_full_s=T_full_s, M_full_bytes=M_full_bytes, t=t, m=m,
                              n_samples=n, epochs=epochs, max_batch=baseline_batch, **ratios)
    n_kept = kept_total(labels, result["alpha"])
    # The planning of an online epoch (Algorithm 3's histogram), timed against a step at the baseline batch.
    planner = OnlineSampler(n_samples=n_kept, batch_size=result["batch"], keep_fraction=result["A"],
                            eta=int(result["eta"]), warmup_epochs=0, history_size=history_size, bins=bins, seed=seed,
                            device=device)
    planner.update_losses(0, torch.rand(n_kept, generator=torch.Generator(device=device).manual_seed(seed),
                                        device=device))
    with preserved_training_state(model, optimizer, None, device):
        plan_times = time_passes({"plan": lambda: planner.plan_epoch(1), "ref": lambda: train_step(baseline_batch)},
                                 device, warmup=1, repeats=probe_repeats, rounds=probe_rounds)
    baseline_steps = epochs * math.ceil(n / baseline_batch)
    terms = dict(seconds_per_probe_second=T_full_s / (baseline_steps * result["t_ref_s"]), t_b_s=result["t_b_s"],
                 batch=result["batch"], A=result["A"], eta=int(result["eta"]), t_score_s=session["t_score_s"],
                 score_batch=score_batch, t_plan_s=plan_times["plan"] * result["t_ref_s"] / plan_times["ref"],
                 t_max_s=result["t_max_s"])
    plan = online_epoch_plan(terms, n_kept=n_kept, warmup_epochs=warmup_epochs, epochs=epochs)
    record = {**result, **terms, **plan, "n_kept": n_kept}
    return Budget(batch=int(result["batch"]), alpha=float(result["alpha"]), A=float(result["A"]),
                  eta=int(result["eta"]), planned_epochs=int(plan["planned_epochs"]), t_max_s=float(result["t_max_s"]),
                  predicted_time_s=float(plan["predicted_time_s"]), n_kept=n_kept, calibration=record)


def offline_subset(losses, labels, alpha: float, mode: str = "hard") -> np.ndarray:
    """Algorithm 2: the indices (ascending) of ceil(alpha n_c) samples of every class c,
    the highest scorer losses first (``mode="easy"``: the lowest); ``labels=None`` ranks
    all samples as one group."""
    from darel.selection import select_by_loss

    return select_by_loss(np.asarray(losses, dtype=np.float64), None if labels is None else np.asarray(labels), alpha,
                          mode)


def selection(method: str, *, n_samples: int, batch_size: int, seed: int = 0, epochs: int = 1,
              score_batch: int | None = None, device: Any = "cpu", **settings: Any):
    """The online selection of ``method`` (darel.methods: "darel", "uniform-online",
    "selective-backprop", "infobatch", "rs2", a method of your own, or "baseline": every
    sample every epoch) over ``n_samples`` samples, as a policy for your loop:
    ``batches(epoch, score)`` yields (positions, loss weights or None) and calls
    ``score(positions) -> per-sample losses`` (no grad) where the method scores;
    ``observe(positions, losses)`` takes each step's per-sample training losses;
    ``state_dict``/``load_state_dict`` resume it. ``settings`` are the fields of the
    method's selection (e.g. darel: keep_fraction, eta, warmup_epochs, history_size,
    bins); ``epochs``: the run's length (the baseline's warm-up covers it all)."""
    chosen = methods.get(method)
    if chosen.selection_type is None:
        raise ValueError(f"method {method} selects nothing online (it trains on all data with a schedule of its own)")
    accepted = {f.name for f in fields(chosen.selection_type)} - {"rule"}  # the rule is the method's
    unknown = sorted(set(settings) - accepted)
    if unknown:
        raise ValueError(f"method {method}: unknown setting(s) {unknown}; its selection takes {sorted(accepted)}")
    loop = Loop(batch=batch_size, seed=seed, epochs=epochs, score_batch=score_batch)
    return chosen.make_selection(**settings).policy(loop, n_samples, _device(device))


def _device(device: Any):
    import torch

    return torch.device(device)
