"""Calibration of one budgeted cell: every measurement of Algorithm 1, equations 2-5 and
the time plan, taken with the run's own training step in one session.

The probes call the same ``TrainStep`` the training loop calls (gather, augmentation,
memory format, precision, optimiser, the profile's ``compile`` setting) and the same
scoring forward, on the same data on the same device:

1. memory: one metered step at b = 1, 2, 4, ... (after untimed warm-up steps) until the
   peak reaches m_max or b reaches the baseline batch B (Algorithm 1's loop);
2. the scoring/evaluation batch: the largest power of two up to the profile's eval batch
   whose no-grad pass stays within m_max (the scoring pass is metered like the steps);
3. time, in interleaved rounds of one session: a step at every probed b and at B, and a
   scoring batch; then, once alpha and A are known, the planning of an online epoch
   against a step at B again. Only ratios to the step at B are used, so the load of the
   machine at calibration time cancels;
4. equations 2-5 (``darel.budget.calibrate``), the epoch cost model and the plan.

No file is read or written here; ``stages/calibrate.py`` does that.
"""

from __future__ import annotations

import contextlib
import logging
import math
from typing import Callable

import numpy as np
import torch

from darel import budget, evaluation, image_training
from darel.measure import PROBE_CLOCK, StepMemoryMeter, preserved_training_state, time_passes
from darel.methods.darel import online_epoch_plan
from darel.plans import RunPlan
from darel.sampler import OnlineSampler
from darel.selection import kept_count
from darel.sgd import Optimizer

log = logging.getLogger("darel.calibration")

_STREAM_PROBE = 7


def kept_total(labels: np.ndarray, alpha: float) -> int:
    """Size of Algorithm 2's subset: the sum over classes of ceil(alpha * class size)."""
    _, counts = np.unique(np.asarray(labels), return_counts=True)
    return int(sum(kept_count(alpha, int(c)) for c in counts))


def seconds_per_probe_second(time_s: float, baseline_steps: int, t_ref_s: float) -> float:
    """The baseline run's seconds per probe second: its time T over its steps at the
    baseline batch, each as long as the probe's step at that batch (t_B)."""
    return float(time_s) / (int(baseline_steps) * float(t_ref_s))


def pow2_at_most(x: int) -> int:
    return 1 << (int(x).bit_length() - 1)


def calibrate_cell(*, model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor, augment: Callable,
                   normalise: Callable, device: torch.device, plan: RunPlan, baseline: dict, t: float,
                   m: float, alpha_default: float, A_min: float, A_max: float, warmup_epochs: int,
                   history_size: int, bins: int, probe_warmup: int, probe_repeats: int, probe_rounds: int,
                   enforce: str) -> dict:
    """Measure, then choose batch, alpha, A, eta, the scoring batch and the epoch plan.

    ``plan`` is the baseline's run plan (batch B, protocol epochs, precision, eval batch);
    ``baseline`` its train.json (time_s = T, peak_mem_bytes = M, steps).
    """
    if enforce not in image_training.ENFORCEMENTS:
        raise ValueError(f"enforce must be one of {image_training.ENFORCEMENTS}, got {enforce!r}")
    n = len(labels)
    B = plan.batch
    model = model.to(device)
    if device.type == "cuda":
        model.to(memory_format=torch.channels_last)
    optimizer = image_training.make_optimizer(model, plan, device)
    precision = plan.precision
    # The run's own step and scoring forward, compiled as the run compiles them: a compiled
    # step compiles (and under "graphs" records) each new batch shape in its probe's
    # untimed warm-up steps, so the timed steps are the run's steady step.
    step = image_training.image_train_step(model, optimizer, images, labels, augment, device, precision,
                                           plan.compile)
    scoring_model = image_training.scoring_forward(model, plan.compile)
    gen = image_training.epoch_generator(plan.seed, 0, _STREAM_PROBE, device)
    m_max = m * float(baseline["peak_mem_bytes"])

    def random_rows(b: int) -> torch.Tensor:
        return torch.randint(0, n, (b,), generator=gen, device=device)

    def train_step(b: int) -> None:
        step(random_rows(b), gen)

    def score_batch_pass(e: int, meter: StepMemoryMeter | None = None) -> None:
        # Metered per batch inside per_sample_losses, exactly as the run meters its scoring pass.
        evaluation.per_sample_losses(scoring_model, images, labels, normalise, e, precision, rows=random_rows(e),
                                     meter=meter)

    with preserved_training_state(model, optimizer, step, device), _compilation_room(step, B, plan.eval_batch):
        model.train()

        measure_memory = _memory_probe(step, train_step, model, optimizer, device, random_rows, gen, probe_warmup)
        session: dict = {}

        def time_batches(batches: list[int]) -> dict[int, float]:
            # The scoring batch is chosen now (memory of the no-grad pass, after the
            # steps above created gradients and optimiser state, as in a run).
            e, score_peaks = _score_batch_within(model, optimizer, device, plan.eval_batch, m_max, score_batch_pass)
            session.update(score_batch=e, score_probe_peaks=score_peaks)
            passes = {("train", b): (lambda b=b: train_step(b)) for b in batches}
            passes[("score", e)] = lambda: score_batch_pass(e)
            times = time_passes(passes, device, warmup=probe_warmup, repeats=probe_repeats, rounds=probe_rounds)
            session["t_score_s"] = times[("score", e)]
            for b in batches:
                log.info("time probe b=%d: %.5f s/step", b, times[("train", b)])
            return {b: times[("train", b)] for b in batches}

        result = budget.calibrate(measure_memory, time_batches, T_full_s=baseline["time_s"],
                                  M_full_bytes=baseline["peak_mem_bytes"], t=t, m=m, n_samples=n,
                                  epochs=plan.epochs, max_batch=B, alpha_default=alpha_default, A_min=A_min,
                                  A_max=A_max)
        batch, A, eta = result["batch"], result["A"], int(result["eta"])
        n_kept = kept_total(labels.cpu().numpy(), result["alpha"])
        planner = OnlineSampler(n_samples=n_kept, batch_size=batch, keep_fraction=A, eta=eta, warmup_epochs=0,
                                history_size=history_size, bins=bins, seed=plan.seed, device=device)
        loss_gen = torch.Generator(device=device).manual_seed(plan.seed)
        planner.update_losses(0, torch.rand(n_kept, generator=loss_gen, device=device) * 5)
        plan_times = time_passes({"plan": lambda: planner.plan_epoch(1), "ref": lambda: train_step(B)}, device,
                                 warmup=1, repeats=probe_repeats, rounds=probe_rounds)
    result["compile"] = plan.compile
    result["step"] = step.kind  # the step the probes timed: the run's (its train.json says which it ran)
    _add_plan(result, session, plan_times, baseline, n_kept=n_kept, warmup_epochs=warmup_epochs,
              epochs=plan.epochs, enforce=enforce, probe_settings={"warmup": probe_warmup,
              "repeats": probe_repeats, "rounds": probe_rounds}, device=device)
    return result


def _memory_probe(step, train_step: Callable[[int], None], model: torch.nn.Module, optimizer: Optimizer,
                  device: torch.device, random_rows: Callable[[int], torch.Tensor], gen: torch.Generator,
                  warmup_steps: int) -> Callable[[int], int]:
    """Algorithm 1's memory probe: ``measure(b)`` runs ``warmup_steps`` steps at batch ``b``
    (``train_step(b)``, the probes' own step on rows it draws),
    then one metered step on rows drawn outside it (as the run's sampler draws them), and
    returns the peak bytes; on a GPU a compiled step's first call at ``b`` is metered too
    (``_meters_first_call``)."""

    def measure(b: int) -> int:
        meter = StepMemoryMeter(model, optimizer, device)
        for warmup in range(warmup_steps):
            metered = warmup == 0 and _meters_first_call(step, device)
            with meter.step(kind="train") if metered else contextlib.nullcontext():
                train_step(b)
        rows = random_rows(b)
        with meter.step(kind="train"):
            step(rows, gen)
        log.info("memory probe b=%d: %.2f MiB", b, meter.peak_bytes / 2**20)
        return meter.peak_bytes

    return measure


def _meters_first_call(step, device: torch.device) -> bool:
    """Whether a memory probe meters its size's first call too: for a compiled step on a GPU,
    whose run meters its first step of each shape in place (the check against eager mode and,
    under graphs, the recording, whose memory the caching allocator sees; a replayed graph
    allocates nothing it counts). A CPU run counts a replay of each step after its interval,
    when the shape is compiled and checked, so there the probe meters steady steps only."""
    return step.compiled and device.type == "cuda"


def _compilation_room(step, batch: int, eval_batch: int) -> contextlib.AbstractContextManager:
    """For a compiled step, torch's recompilation limit (8 by default) raised above the sizes
    the probes compile (the steps' 1, 2, 4, ... ``batch``; the scoring forward's powers of
    two down from the eval batch), for the probes only: past the limit torch would run the
    further sizes eagerly, with a warning in the log."""
    if not step.compiled:
        return contextlib.nullcontext()
    sizes = max(int(batch).bit_length(), pow2_at_most(eval_batch).bit_length())
    return torch._dynamo.config.patch(recompile_limit=max(torch._dynamo.config.recompile_limit, sizes + 4))


def _add_plan(result: dict, session: dict, plan_times: dict, baseline: dict, *, n_kept: int, warmup_epochs: int,
              epochs: int, enforce: str, probe_settings: dict, device: torch.device) -> None:
    """Complete the calibration ``result`` (budget.calibrate's) in place: the probes of the
    session (``session``: the scoring batch and its time; ``plan_times``: planning an epoch
    beside a step at B) in baseline seconds, and DAREL's epoch plan from them."""
    batch, A, eta = result["batch"], result["A"], int(result["eta"])
    # Everything in units of the step at B of the same session, then in baseline seconds.
    t_plan = plan_times["plan"] * result["t_ref_s"] / plan_times["ref"]
    speed = seconds_per_probe_second(baseline["time_s"], baseline["steps"], result["t_ref_s"])
    terms = dict(seconds_per_probe_second=speed, t_b_s=result["t_b_s"], batch=batch, A=A, eta=eta,
                 t_score_s=session["t_score_s"], score_batch=session["score_batch"], t_plan_s=t_plan,
                 t_max_s=result["t_max_s"])
    # DAREL's plan (darel.methods.darel), the same a study's DAREL run trains at this calibration.
    planned = online_epoch_plan(terms, n_kept=n_kept, warmup_epochs=warmup_epochs, epochs=epochs)
    planned.pop("epoch_samples")
    result.update(
        enforce=enforce, n_kept=n_kept, warmup_epochs=warmup_epochs, score_batch=session["score_batch"],
        score_probe_peaks=session["score_probe_peaks"], t_score_s=session["t_score_s"],
        t_plan_s=t_plan, t_plan_raw_s=plan_times["plan"], t_ref_plan_session_s=plan_times["ref"],
        baseline_steps=int(baseline["steps"]), seconds_per_probe_second=speed, **planned,
        probe_settings=probe_settings,
        probe_clock=PROBE_CLOCK["cuda" if device.type == "cuda" else "cpu"],
    )
    log.info("calibration: batch %d, alpha %.3f, A %.3f, eta %d, scoring batch %d; plan %d of %d epochs, "
             "predicted %.1f s of t_max %.1f s", batch, result["alpha"], A, eta, session["score_batch"],
             planned["planned_epochs"], epochs, planned["predicted_time_s"], result["t_max_s"])


def _score_batch_within(model: torch.nn.Module, optimizer: Optimizer, device: torch.device,
                        eval_batch: int, m_max: float, run: Callable[..., None]) -> tuple[int, dict]:
    """Largest power of two <= eval_batch whose scoring pass peaks within m_max (1 at least)."""
    peaks: dict[int, int] = {}
    e = pow2_at_most(eval_batch)
    while True:
        run(e)  # warm-up (cudnn's algorithm search allocates workspaces on the first call)
        meter = StepMemoryMeter(model, optimizer, device)
        run(e, meter)
        peaks[e] = meter.peak_bytes
        if meter.peak_bytes <= m_max or e == 1:
            return e, peaks
        e //= 2


def infeasible_message(model: str, t: float, m: float, measured_bytes: int, M_bytes: float) -> str:
    """What an infeasible memory budget tells the user: the key, and the least m that fits."""
    need = measured_bytes / M_bytes
    return (f"params: budget [{t}, {m}] of {model} (profiles.<profile>.table1.{model}, or study.table1.budgets): "
            f"m = {m} allows {m * M_bytes / 2**20:.2f} MiB, but one "
            f"training step at batch 1 measured {measured_bytes / 2**20:.2f} MiB; the smallest feasible m for "
            f"this model is {math.ceil(need * 100) / 100:.2f} (M = {M_bytes / 2**20:.2f} MiB, the baseline's peak)")
