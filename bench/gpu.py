"""Paper-profile Table 1 at GPU speed: the figures of issue 11, measured in one run.

For the paper-profile ResNet18 (width 64, CIFAR stem, 32 px) and ResNet18-HC (width 64,
dual algebra, ImageNet stem, CIFAR images resized to 224 px on the device), batch 128,
SGD as in params.yaml, on synthetic CIFAR-shaped uint8 data (50,000 x 3 x 32 x 32 on a
GPU), built from the project's own pieces: ``darel.step.TrainStep`` (precision, fused
SGD on a GPU, optional ``torch.compile``), ``darel.models.build_model``,
``darel.augment.DeviceAugment`` (through ``darel.stagekit.transforms``, as the runs use
it) and ``darel.sampler.OnlineSampler``. It prints:

1. Device operations dispatched (aten operations seen by a ``TorchDispatchMode``,
   views excluded as they launch nothing), eager mode, on any device, so CI prints them:
   * per training step (batch assembly + augmentation, forward, loss, backward, SGD);
   * per planned online epoch: the batched planner against the per-chunk reference
     (the old loop; it also drew one Bernoulli tensor per chunk, which is replaced in
     both by the one shared draw, so the old code's real count was slightly higher),
     at several batch sizes to show that the new count does not grow with the chunks.
2. Host synchronisations per training step and per planned epoch (CUDA:
   ``torch.cuda.set_sync_debug_mode("warn")`` warnings counted; CPU: n/a).
3. Recompilations of ``torch.compile`` after warm-up (dynamo's unique-graph counter;
   compile is on by default on a GPU, off on CPU; ``--compile on`` counts them on CPU),
   and how far the compiled step lay from eager mode on its first batch (the check every
   compiled run makes, ``darel.step.check_compiled_gradients``).
4. Timings, GPU only: images/s of the training step; images/s of a whole epoch with
   augmentation and planning (a full epoch, and an online epoch at A = 0.3 reusing
   stored losses, with the planning's share of it); the projected 200-epoch baseline
   (200 full epochs, no evaluation or checkpoints) next to the paper's figure and the
   arithmetic floor: 2 x 3 x MACs per image (forward + backward = 3 forwards, 2 FLOP a
   MAC) x 50,000 x 200 epochs at ``--peak-tflops`` (800: about what an H100 sustains on
   dense bf16 matrix products). ResNet18: 555.5 M MACs, 3.33 GFLOP, floor 41.7 s.

5. The previous step and the new one side by side (``--variants``, default on CUDA
   ``eager,jitter,graphs,graphs_full,graphs_opt``): each variant starts from the same initial model and
   trains ``--curve-steps`` (200) steps on the same batches and augmentation draws (its
   loss curve), then is timed as in 4 (``jitter`` is not timed), and torch.profiler says per step: wall time, kernel time on the device
   (busy share), host launches (kernels, graph replays, copies) and the top kernels.
   ``compile`` is the step of 2026-11-25 (torch.compile); ``graphs`` is ``compile:
   graphs`` (torch.compile's reduce-overhead mode: forward and backward replayed as CUDA
   graphs), the paper profile's step; ``graphs_opt`` adds the optimiser step to the
   graphs (``make_step``'s ``optimizer_in_graph``), the first part of the host gap (issue
   52 item 2); ``graphs_full`` also moves the batch's gather and augmentation into the
   compiled forward (``augment_in_graph``; the random draws stay outside), the second
   part. A variant that fails is reported and the others still run.

   Same losses: eager mode is the reference curve, and ``jitter`` (eager from the initial
   model with every weight moved by one bf16 rounding, a relative 2^-9 of either sign)
   measures how far rounding alone moves a curve over those steps. A variant's curve is
   "within rounding noise" of eager's when its median absolute difference from eager's
   losses is at most ``NOISE_FACTOR`` (2) times jitter's (``curve_check``), declared here
   before any GPU run of it.

Operation counts do not depend on the batch or the image size (same graph), so
``--quick`` counts them at batch 8 and a 64-px HC input, which takes about a minute
on two CPU cores.

Usage: python bench/gpu.py [--device auto|cpu|cuda] [--quick] [--models resnet18,resnet18_hc]
       [--n 50000] [--batch 128] [--precision auto] [--compile auto|on|off] [--steps 50]
       [--variants eager,jitter,graphs,graphs_full,graphs_opt|none] [--curve-steps 200] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]

import torch
import torch.nn.functional as F
import yaml
from torch.utils._python_dispatch import TorchDispatchMode

from darel import stagekit
from darel.augment import DeviceAugment
from darel.data import CIFAR100_MEAN, CIFAR100_STD
from darel.models import build_model
from darel.models.hypercomplex import count_macs_per_image
from darel.sampler import OnlineSampler
from darel.step import TrainStep, prepare_input, sgd

PAPER_BASELINE_S = {"resnet18": 2458.0, "resnet18_hc": 12682.0}  # the paper's Table 1 baselines (one 16 GB GPU)
EPOCHS = 200
N_CIFAR = 50_000
CLASSES = 100


# --- counting ----------------------------------------------------------------------------


class OpCounter(TorchDispatchMode):
    """Counts the aten operations dispatched inside the context (after autograd, so the
    backward's operations count too); views are counted apart, as they launch nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0
        self.views = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.is_view:
            self.views += 1
        else:
            self.ops += 1
        return func(*args, **(kwargs or {}))


def count_ops(fn: Callable[[], object]) -> int:
    """Non-view aten operations that ``fn()`` dispatches."""
    with OpCounter() as counter:
        fn()
    return counter.ops


def count_syncs(device: torch.device, fn: Callable[[], object]) -> int | None:
    """Host synchronisations ``fn()`` makes on a CUDA device (None elsewhere)."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def compiled_graphs() -> int:
    """Graphs torch.compile has built so far in this process (each recompilation adds one)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def planning_sampler(n: int, batch: int, history: int, bins: int, keep_fraction: float, planner: str,
                     device: torch.device) -> OnlineSampler:
    """An online sampler in steady state: losses stored, buffer full, a carry-over waiting."""
    sampler = OnlineSampler(n_samples=n, batch_size=batch, keep_fraction=keep_fraction, eta=1, warmup_epochs=0,
                            history_size=history, bins=bins, seed=0, device=device, planner=planner)
    gen = torch.Generator(device=device).manual_seed(0)
    # Cross-entropy-like losses: mostly small, a long tail.
    sampler.update_losses(0, torch.empty(n, device=device).exponential_(1.0, generator=gen))
    sampler.plan_epoch(0)
    return sampler


def planning_ops(n: int, batch: int, history: int, bins: int, keep_fraction: float, planner: str,
                 device: torch.device) -> int:
    """Device operations of planning one steady-state online epoch."""
    sampler = planning_sampler(n, batch, history, bins, keep_fraction, planner, device)
    return count_ops(lambda: sampler.plan_epoch(1))


# --- the paper-profile training step --------------------------------------------------------


def paper_settings() -> dict:
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    return {"protocols": params["protocols"], "augment": params["datasets"]["cifar100"]["augment"],
            "history_size": params["darel"]["history_size"], "bins": params["darel"]["bins"]}


def make_step(name: str, proto: dict, augment_cfg: dict, images: torch.Tensor, labels: torch.Tensor,
              device: torch.device, precision: str, compile: bool | str, input_size: int | None,
              jitter: float = 0.0, optimizer_in_graph: bool = False, augment_in_graph: bool = False) -> TrainStep:
    """The training step of ``name`` from its fixed initial model; ``jitter`` moves every
    weight by that relative amount, each of a random sign (fixed draws): the noise yardstick.
    ``optimizer_in_graph`` (issue 52 item 2, an experiment of this bench, in no profile yet):
    the optimiser step compiled too, with the step's mode (under graphs it replays as a CUDA
    graph of its own after the backward's), the learning rate a device tensor (a replay
    reads whatever value it holds, so a schedule can change it without a new graph) and
    torch's multi-tensor SGD, the implementation torch.compile's optimiser support traces.
    ``augment_in_graph`` (the experiment's second move): the batch's gather, augmentation and
    memory format run inside the compiled forward (``augmented_batch_step``)."""
    torch.manual_seed(0)
    extra = {key: proto[key] for key in ("algebra", "stem") if key in proto}
    model = build_model(name, num_classes=CLASSES, in_channels=3, width=proto["width"], **extra).to(device)
    if jitter:
        signs = torch.Generator().manual_seed(7)
        with torch.no_grad():
            for param in model.parameters():
                sign = torch.randint(0, 2, param.shape, generator=signs).to(device, param.dtype) * 2 - 1
                param.mul_(1 + jitter * sign)
    if device.type == "cuda":
        model = model.to(memory_format=torch.channels_last)
    if optimizer_in_graph:
        optimizer = torch.optim.SGD(model.parameters(), lr=torch.tensor(float(proto["lr"]), device=device),
                                    momentum=proto["momentum"], weight_decay=proto["weight_decay"], foreach=True)
    else:
        optimizer = sgd(model.parameters(), lr=proto["lr"], momentum=proto["momentum"],
                        weight_decay=proto["weight_decay"], device=device)
    meta = {"mean": list(CIFAR100_MEAN), "std": list(CIFAR100_STD), "image_size": images.shape[-1]}
    augment, _ = stagekit.transforms(meta, augment_cfg, input_size)
    if augment_in_graph:
        assemble, loss_fn = augmented_batch_step(augment, images, labels, device)
    else:
        assemble, loss_fn = assembled_batch_step(augment, images, labels, device)
    step = TrainStep(model, optimizer, device=device, precision=precision, assemble=assemble, loss_fn=loss_fn,
                     compile=compile)
    if optimizer_in_graph:
        optimizer.step = torch.compile(optimizer.step, mode="reduce-overhead" if step.graphs else None)
    return step


def batch_loss(module: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple:
    logits = module(x)
    loss = F.cross_entropy(logits, y)
    return loss, {"loss_sum": loss.detach().float() * len(y), "correct": (logits.detach().argmax(1) == y).sum()}


def assembled_batch_step(augment: Callable, images: torch.Tensor, labels: torch.Tensor,
                         device: torch.device) -> tuple[Callable, Callable]:
    """(assemble, loss_fn) of the runs' step: the batch is gathered, augmented and put in
    the run's memory format before the (compiled) forward."""

    def assemble(idx: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        return prepare_input(augment(images[idx], gen), device), labels[idx]

    return assemble, lambda module, inputs: batch_loss(module, *inputs)


def augmented_batch_step(augment: Callable, images: torch.Tensor, labels: torch.Tensor,
                         device: torch.device) -> tuple[Callable, Callable]:
    """(assemble, loss_fn) with the batch assembled inside the forward: ``assemble`` only
    draws the augmentation's random numbers (``DeviceAugment.draw``: every variant gets the
    same draws from the same generator; torch.compile does not trace a device generator),
    and the gather, the augmentation's arithmetic (``from_draws``, in float32 with autocast
    off, as it runs outside) and the memory format run in the compiled forward, so under
    graphs they replay with it. The data set's tensors and the augmentation's constants
    (made here, before any tracing) are marked static: a CUDA graph reads them in place
    rather than copying them into its input buffers at every replay."""
    if not isinstance(augment, DeviceAugment):
        raise ValueError("augmentation in the graph is written for a model at the data's own size (resnet18); "
                         "this model's input is resized after the augmentation")
    for tensor in (images, labels, *augment.constants(images.device, *images.shape[-2:])):
        torch._dynamo.mark_static_address(tensor)

    def assemble(idx: torch.Tensor, gen: torch.Generator) -> tuple[dict, torch.Tensor]:
        return augment.draw(len(idx), gen), idx

    def loss_fn(module: torch.nn.Module, inputs: tuple[dict, torch.Tensor]) -> tuple:
        draws, idx = inputs
        with torch.autocast(device.type, enabled=False):
            x = augment.from_draws(images[idx], draws)
        return batch_loss(module, prepare_input(x, device), labels[idx])

    return assemble, loss_fn


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_epoch(step: TrainStep, sampler: OnlineSampler, epoch: int, device: torch.device) -> tuple[int, float]:
    """Plan and train one epoch; returns (images trained, planning seconds)."""
    gen = torch.Generator(device=device).manual_seed(1000 + epoch)
    sync(device)
    start = time.perf_counter()
    batches = sampler.plan_epoch(epoch)
    sync(device)
    planning = time.perf_counter() - start
    for idx in batches:
        step(idx, gen)
    return sum(idx.numel() for idx in batches), planning


def floor_seconds(macs_per_image: int, n: int, epochs: int, peak_tflops: float) -> float:
    return 2 * 3 * macs_per_image * n * epochs / (peak_tflops * 1e12)


# --- report -------------------------------------------------------------------------------


def bench_planning(args: argparse.Namespace, settings: dict, device: torch.device) -> None:
    history, bins = settings["history_size"], settings["bins"]
    print(f"\n== planning one online epoch: n {args.plan_n:,}, gamma {history}, {bins} bins, A {args.keep_fraction}; "
          "device ops (views excluded)")
    print(f"{'batch':>7}{'chunks':>8}{'per-chunk (old)':>17}{'batched (new)':>15}{'ratio':>9}{'old/chunk':>11}"
          f"{'host syncs (new)':>18}")
    for batch in args.plan_batches:
        chunks = -(-args.plan_n // batch)
        old = planning_ops(args.plan_n, batch, history, bins, args.keep_fraction, "per_chunk", device)
        new = planning_ops(args.plan_n, batch, history, bins, args.keep_fraction, "batched", device)
        sampler = planning_sampler(args.plan_n, batch, history, bins, args.keep_fraction, "batched", device)
        syncs = count_syncs(device, lambda: sampler.plan_epoch(1))
        print(f"{batch:>7}{chunks:>8}{old:>17,}{new:>15,}{old / new:>8.0f}x{old / chunks:>11.1f}"
              f"{'n/a (CPU)' if syncs is None else syncs:>18}")


def bench_model(name: str, args: argparse.Namespace, settings: dict, device: torch.device,
                results: dict | None = None) -> None:
    results = {} if results is None else results
    proto = settings["protocols"][name]
    batch = args.batch
    real_side = proto.get("input_size") or 32
    input_size = args.hc_size if proto.get("input_size") and args.hc_size else proto.get("input_size")
    side = input_size or 32
    gen = torch.Generator(device=device).manual_seed(0)
    images = torch.randint(0, 256, (args.n, 3, 32, 32), dtype=torch.uint8, generator=gen, device=device)
    labels = torch.randint(0, CLASSES, (args.n,), generator=gen, device=device)
    use_compile = args.compile == "on" or (args.compile == "auto" and device.type == "cuda")
    step = make_step(name, proto, settings["augment"], images, labels, device, args.precision, False, input_size)
    macs = count_macs_per_image(build_model(name, num_classes=CLASSES, in_channels=3, width=proto["width"],
                                             **{k: proto[k] for k in ("algebra", "stem") if k in proto}),
                                 (3, real_side, real_side))
    floor = floor_seconds(macs, N_CIFAR, EPOCHS, args.peak_tflops)
    desc = ", ".join(f"{k} {proto[k]}" for k in ("width", "stem", "algebra") if k in proto)
    shown = f"input {side} px" + (f" (paper: {real_side} px)" if side != real_side else "")
    print(f"\n== {name} ({desc}; {shown}; batch {batch}; precision {step.precision}; "
          f"compile {'on' if use_compile else 'off'}) ==")
    print(f"MACs per image at {real_side} px {macs / 1e6:.1f} M = {6 * macs / 1e9:.2f} GFLOP forward + backward; "
          f"arithmetic floor for {EPOCHS} epochs x {N_CIFAR:,} at {args.peak_tflops:.0f} TFLOP/s: {floor:.1f} s")

    # Operation count of one steady-state eager step (the first steps create optimiser state).
    idx = torch.randperm(args.n, generator=gen, device=device)[:batch]
    step_gen = torch.Generator(device=device).manual_seed(1)
    for _ in range(2):
        step(idx, step_gen)
    ops = count_ops(lambda: step(idx, step_gen))
    syncs = count_syncs(device, lambda: [step(idx, step_gen) for _ in range(3)])
    print(f"device ops per training step (eager: assembly + augmentation, forward, loss, backward, SGD): {ops:,}")
    print(f"host syncs per training step: {'n/a (CPU)' if syncs is None else f'{syncs / 3:g}'}")
    if device.type != "cuda" and not use_compile and not args.variants:
        print("recompilations: n/a (torch.compile is off on CPU; --compile on to count them)")
        print("timings (images/s, epochs, 200-epoch projection): need a GPU; run with --device cuda")
        return

    if args.variants:
        bench_variants(name, args, settings, device, images, labels, idx, input_size, macs, floor, results)
        return

    if use_compile:
        step = make_step(name, proto, settings["augment"], images, labels, device, args.precision, True, input_size)
        # Warm-up: compile for the two batch shapes an epoch has (full, and the remainder).
        shapes = [batch] + ([args.n % batch] if args.n % batch else [])
        for size in shapes:
            for _ in range(3):
                step(idx[:size], step_gen)
        sync(device)
    graphs_before = compiled_graphs() if use_compile else 0
    if device.type != "cuda":
        for _ in range(3):  # steps after warm-up, for the recompilation count
            step(idx, step_gen)
        print("timings (images/s, epochs, 200-epoch projection): need a GPU; run with --device cuda")
    if use_compile:
        check = step.compile_check
        print(f"recompilations after warm-up: {compiled_graphs() - graphs_before}; compiled step vs eager on the "
              f"first batch: gradient {check['grad_rel_diff']:.1e}, loss {check['loss_rel_diff']:.1e} "
              f"(relative L2; the run stops above {check['tolerance']:g})")


# --- the previous step and the new one, side by side ----------------------------------------

VARIANTS = {
    "eager": (False, "eager (no compile): the reference loss curve"),
    "jitter": (False, "eager, weights moved by one bf16 rounding (noise)"),
    "compile": (True, "torch.compile (the step of 2026-11-25)"),
    "graphs": ("graphs", "torch.compile + CUDA graphs (compile: graphs, the paper profile's)"),
    "graphs_opt": ("graphs", "new: graphs + the optimiser step compiled into graphs"),
    "graphs_full": ("graphs", "new: graphs_opt + gather and augmentation in graphs"),
}
# The variants whose optimiser step is compiled too (make_step's optimizer_in_graph), and
# those whose batch assembly runs inside the compiled forward (augment_in_graph).
OPTIMIZER_IN_GRAPH = {"graphs_opt", "graphs_full"}
AUGMENT_IN_GRAPH = {"graphs_full"}
LABEL_WIDTH = max(len(label) for _, label in VARIANTS.values()) + 1  # the tables' first column
# On a GPU: the references, the paper profile's step, then the new variants, the one that
# moves most first (a part cut short by its time box loses the last).
DEFAULT_GPU_VARIANTS = ("eager", "jitter", "graphs", "graphs_full", "graphs_opt")
JITTER = 2.0 ** -9  # half a bf16 ulp (7 stored mantissa bits), relative: one rounding of a weight
NOISE_FACTOR = 2.0  # a curve within this many times jitter's distance from eager's is within rounding noise


def curve_check(curves: dict[str, list[float]], factor: float = NOISE_FACTOR) -> dict[str, dict]:
    """Each curve against eager's: the median and largest absolute loss difference over the
    steps, the ratio of the median to jitter's, and whether it is within rounding noise
    (at most ``factor`` times jitter's median). Empty without both reference curves."""
    if "eager" not in curves or "jitter" not in curves:
        return {}

    def distance(curve: list[float]) -> tuple[float, float]:
        diffs = sorted(abs(a - b) for a, b in zip(curve, curves["eager"]))
        return diffs[len(diffs) // 2], diffs[-1]

    noise, _ = distance(curves["jitter"])
    checks = {}
    for key, curve in curves.items():
        if key == "eager":
            continue
        median, largest = distance(curve)
        ratio = median / noise if noise > 0 else (0.0 if median == 0 else float("inf"))
        checks[key] = {"median_abs_diff": median, "max_abs_diff": largest, "x_noise": ratio,
                       "within_noise": ratio <= factor}
    return checks


def loss_curve(step: TrainStep, images: torch.Tensor, steps: int, batch: int, device: torch.device) -> list[float]:
    """Losses of the first ``steps`` steps from the step's initial model, on a fixed batch
    sequence and fixed augmentation draws (the same for every variant); read once at the end."""
    order = torch.Generator(device=device).manual_seed(123)
    aug = torch.Generator(device=device).manual_seed(456)
    losses = torch.zeros(steps, device=device)
    for k in range(steps):
        idx = torch.randint(0, len(images), (batch,), generator=order, device=device)
        losses[k] = step(idx, aug)["loss_sum"] / batch
    return losses.tolist()


def profile_steps(step: TrainStep, idx: torch.Tensor, gen: torch.Generator, device: torch.device,
                  steps: int = 10, top: int = 10) -> dict:
    """torch.profiler over ``steps`` steps: wall time, device time (kernels) and kernel
    launches per step, and the kernels that take the most device time."""
    from torch.profiler import ProfilerActivity, profile

    sync(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            step(idx, gen)
        sync(device)
        wall = (time.perf_counter() - start) / steps
    events = prof.events()
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    launches = sum(e.name in LAUNCH_CALLS for e in events if e.device_type == torch.autograd.DeviceType.CPU)
    device_us = sum(e.time_range.elapsed_us() for e in kernels)
    table: dict[str, list[float]] = {}
    for e in kernels:
        entry = table.setdefault(e.name, [0.0, 0])
        entry[0] += e.time_range.elapsed_us() / 1e3 / steps
        entry[1] += 1
    ranked = sorted(table.items(), key=lambda kv: -kv[1][0])[:top]
    device_ms = device_us / 1e3 / steps
    return {"wall_ms": wall * 1e3, "device_ms": device_ms, "kernels_per_step": len(kernels) / steps,
            "launches_per_step": launches / steps, "busy": device_ms / (wall * 1e3) if wall > 0 else float("nan"),
            "top": [(name[:70], ms, calls / steps) for name, (ms, calls) in ranked]}


def host_phases(step: TrainStep, idx: torch.Tensor, gen: torch.Generator, device: torch.device,
                steps: int = 50) -> dict:
    """Where a step's host time goes (issue 52 item 2, the host gap): the milliseconds per
    step the host spends issuing each part, read on the host clock with no device
    synchronisation inside the steps (what a host-bound step waits for): batch assembly
    (gather, augmentation, memory format), the forward (a graph replay under graphs), the
    optimiser step, zeroing the gradients, and the rest (the backward's launch, the
    statistics' copies, GradScaler's calls). The parts are timed by wrapping the step's own
    callables for these steps only; the total is the steps' host time, so the rest is what
    the wrapped parts leave of it."""
    spent = {"assembly": 0.0, "forward": 0.0, "optimizer": 0.0, "zero_grad": 0.0}

    def timed(part: str, fn):
        def run(*args, **kwargs):
            began = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[part] += time.perf_counter() - began
        return run

    wrapped = {"assemble": ("assembly", step, step.assemble), "_forward_loss": ("forward", step, step._forward_loss),
               "step": ("optimizer", step.optimizer, step.optimizer.step),
               "zero_grad": ("zero_grad", step.optimizer, step.optimizer.zero_grad)}
    missing = object()
    own = {name: vars(owner).get(name, missing) for name, (_, owner, _) in wrapped.items()}  # instance attributes
    for name, (part, owner, fn) in wrapped.items():
        setattr(owner, name, timed(part, fn))
    try:
        sync(device)
        began = time.perf_counter()
        for _ in range(steps):
            step(idx, gen)
        host = time.perf_counter() - began  # before the closing sync: host time only
        sync(device)
    finally:
        for name, (_, owner, _) in wrapped.items():
            if own[name] is missing:
                delattr(owner, name)  # the class's method again
            else:
                setattr(owner, name, own[name])
    phases = {part: 1e3 * seconds / steps for part, seconds in spent.items()}
    phases["rest"] = max(0.0, 1e3 * host / steps - sum(phases.values()))
    phases["total"] = 1e3 * host / steps
    return phases


# Host calls that start device work: one per kernel launched from Python, one per graph replay.
LAUNCH_CALLS = {"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch",
                "cudaMemcpyAsync", "cudaMemsetAsync"}


def bench_variants(name: str, args: argparse.Namespace, settings: dict, device: torch.device,
                   images: torch.Tensor, labels: torch.Tensor, idx: torch.Tensor, input_size: int | None,
                   macs: int, floor: float, results: dict) -> None:
    """Each variant from the same initial model: the loss curve of its first
    ``--curve-steps`` steps, then (GPU) images/s of the step, a full and an online epoch,
    the 200-epoch projection and a profiler breakdown; the ratios against the previous step."""
    proto, batch = settings["protocols"][name], args.batch
    on_gpu = device.type == "cuda"
    rows: dict[str, dict] = {}
    curves: dict[str, list[float]] = {}
    for key in args.variants:
        compile, label = VARIANTS[key]
        print(f"\n-- {label}")
        try:
            started = time.perf_counter()
            step = make_step(name, proto, settings["augment"], images, labels, device, args.precision, compile,
                             input_size, jitter=JITTER if key == "jitter" else 0.0,
                             optimizer_in_graph=key in OPTIMIZER_IN_GRAPH, augment_in_graph=key in AUGMENT_IN_GRAPH)
            curves[key] = loss_curve(step, images, args.curve_steps, batch, device)
            if key == "jitter":  # a yardstick of the curves only: the same step as eager's, not timed
                continue
            row = {"variant": label, "graphs": step.graphs, "first_steps_s": time.perf_counter() - started}
            if step.compile_check:
                row["compile_check"] = step.compile_check
            # Warm-up for both batch shapes of an epoch (a graph is recorded per shape).
            step_gen = torch.Generator(device=device).manual_seed(1)
            for size in [batch] + ([args.n % batch] if args.n % batch else []):
                for _ in range(3):
                    step(idx[:size], step_gen)
            graphs_before = compiled_graphs() if compile else 0
            if on_gpu or args.cpu_timings:
                sync(device)
                start = time.perf_counter()
                for _ in range(args.steps):
                    step(idx, step_gen)
                sync(device)
                row["step_images_per_s"] = args.steps * batch / (time.perf_counter() - start)
                syncs = count_syncs(device, lambda: [step(idx, step_gen) for _ in range(3)])
                row["host_syncs_per_step"] = None if syncs is None else syncs / 3
                full = OnlineSampler(n_samples=args.n, batch_size=batch, keep_fraction=1.0, eta=1,
                                     warmup_epochs=1 << 30, history_size=1, bins=2, seed=0, device=device)
                sync(device)
                start = time.perf_counter()
                trained, _ = run_epoch(step, full, 0, device)
                sync(device)
                row["full_epoch_s"] = time.perf_counter() - start
                online = planning_sampler(args.n, batch, settings["history_size"], settings["bins"],
                                          args.keep_fraction, "batched", device)
                sync(device)
                start = time.perf_counter()
                kept, plan_s = run_epoch(step, online, 1, device)
                sync(device)
                row["online_epoch_s"], row["online_images"] = time.perf_counter() - start, kept
                row["projected_200_epochs_s"] = EPOCHS * row["full_epoch_s"] * N_CIFAR / args.n
                row["profile"] = profile_steps(step, idx, step_gen, device)
                row["host_ms"] = host_phases(step, idx, step_gen, device)
            else:
                for _ in range(2):
                    step(idx, step_gen)
            row["recompilations_after_warmup"] = (compiled_graphs() - graphs_before) if compile else 0
            rows[key] = row
            print(json.dumps({k: v for k, v in row.items() if k != "profile"}, default=str))
        except Exception as err:  # noqa: BLE001 - one variant's failure must not lose the others
            rows[key] = {"variant": label, "error": f"{type(err).__name__}: {err}"}
            print(f"FAILED: {type(err).__name__}: {err}")
        finally:
            torch._dynamo.reset()  # each variant compiles afresh (its own graphs and CUDA-graph pool)

    print(f"\n== {name}: previous step vs new step (batch {batch}, {args.precision} resolved per variant)")
    if on_gpu or args.cpu_timings:
        print(f"{'variant':<{LABEL_WIDTH}}{'images/s':>10}{'x prev':>8}{'epoch s':>9}{'200 ep s':>10}{'x floor':>9}"
              f"{'TFLOP/s':>9}{'% peak':>8}{'busy':>7}{'launch/st':>10}")
        # The previous step: the paper profile's (graphs) where a new variant is beside it.
        prev = rows.get("graphs" if (OPTIMIZER_IN_GRAPH | AUGMENT_IN_GRAPH) & set(rows) else "compile", {}).get(
            "step_images_per_s")
        for key, row in rows.items():
            if "error" in row:
                print(f"{row['variant']:<{LABEL_WIDTH}} FAILED: {row['error'][:80]}")
                continue
            rate = row["step_images_per_s"]
            ratio = f"{rate / prev:.2f}" if prev else "n/a"
            # The floor is the run's arithmetic at peak, so floor / projected is the share of peak reached.
            share = floor / row["projected_200_epochs_s"]
            print(f"{row['variant']:<{LABEL_WIDTH}}{rate:>10,.0f}{ratio:>8}{row['full_epoch_s']:>9.2f}"
                  f"{row['projected_200_epochs_s']:>10,.0f}{1 / share:>9.1f}{share * args.peak_tflops:>9.1f}"
                  f"{100 * share:>7.1f}%{100 * row['profile']['busy']:>6.0f}%"
                  f"{row['profile']['launches_per_step']:>10.0f}")
        print(f"paper baseline {PAPER_BASELINE_S[name]:,.0f} s; arithmetic floor {floor:.1f} s at "
              f"{args.peak_tflops:.0f} TFLOP/s (--peak-tflops); earlier runs: bench/results/gpu_*/")
        for key, row in rows.items():
            if "profile" in row:
                prof = row["profile"]
                print(f"\nprofile, {row['variant']}: {prof['wall_ms']:.2f} ms wall per step, "
                      f"{prof['device_ms']:.2f} ms of kernels ({100 * prof['busy']:.0f} % busy), "
                      f"{prof['kernels_per_step']:.0f} kernels and {prof['launches_per_step']:.0f} host launches "
                      f"(kernels, graphs, copies) per step; top kernels (ms per step, runs per step):")
                for kernel, ms, calls in prof["top"]:
                    print(f"  {ms:8.3f} {calls:5.0f}  {kernel}")
            if "host_ms" in row:
                host = row["host_ms"]
                print(f"host time per step, {row['variant']}: " + ", ".join(
                    f"{part} {host[part]:.3f} ms" for part in ("assembly", "forward", "optimizer", "zero_grad", "rest"))
                    + f"; total {host['total']:.3f} ms (the host's side of the step, no sync inside)")
    checks = curve_check(curves)
    if len(curves) >= 2:
        print(f"\nloss curves over the first {args.curve_steps} steps (same initial model, batches and draws; "
              f"reference: eager; noise: jitter, weights moved by {JITTER:.2g} relative):")
        tail = max(1, len(next(iter(curves.values()))) // 4)
        for key, curve in curves.items():
            line = f"  {VARIANTS[key][1]:<{LABEL_WIDTH}} mean of last {tail}: {sum(curve[-tail:]) / tail:.4f}"
            if key in checks:
                check = checks[key]
                line += (f"; |vs eager| median {check['median_abs_diff']:.2e}, max {check['max_abs_diff']:.2e}, "
                         f"{check['x_noise']:.2f} x noise: "
                         + ("within rounding noise" if check["within_noise"] else
                            f"NOT within rounding noise (above {NOISE_FACTOR:g} x)"))
            print(line)
    results[name] = {"rows": rows, "curves": curves, "curve_check": checks, "floor_s": floor, "macs_per_image": macs}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    ap.add_argument("--quick", action="store_true", help="small shapes for a CPU run of about a minute")
    ap.add_argument("--models", default="resnet18,resnet18_hc")
    ap.add_argument("--n", type=int, help="synthetic training images (default 50,000 on GPU, 1,024 on CPU)")
    ap.add_argument("--batch", type=int, help="training batch (default 128; --quick: 8)")
    ap.add_argument("--hc-size", type=int, help="ResNet18-HC input side (default params.yaml's 224; --quick: 64)")
    ap.add_argument("--precision", default="auto", choices=["auto", "bf16", "fp16", "fp32"])
    ap.add_argument("--compile", default="auto", choices=["auto", "on", "off"], help="auto: on for CUDA")
    ap.add_argument("--steps", type=int, default=50, help="timed training steps (GPU)")
    ap.add_argument("--keep-fraction", type=float, default=0.3)
    ap.add_argument("--plan-n", type=int, default=N_CIFAR, help="samples per planned epoch in the op count")
    ap.add_argument("--plan-batches", help="comma-separated batch sizes for the planning count "
                                           "(default 32,128,512)")
    ap.add_argument("--peak-tflops", type=float, default=800.0, help="device peak for the arithmetic floor")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--variants", default=None,
                    help="comma-separated steps to compare side by side from one initial model: eager, jitter "
                         "(eager with every weight moved by one bf16 rounding: the noise of the curves), compile "
                         "(torch.compile), graphs (the paper profile's step), graphs_opt (graphs with the optimiser "
                         "step in graphs too), graphs_full (graphs_opt with the batch's gather and augmentation in "
                         "graphs too); default on CUDA: " + ",".join(DEFAULT_GPU_VARIANTS) + "; "
                         "'none' for the single-step report")
    ap.add_argument("--curve-steps", type=int, default=200, help="steps of each variant's loss curve")
    ap.add_argument("--cpu-timings", action="store_true",
                    help="time the variants on a CPU too (a check of the script; CPU figures are not the point)")
    ap.add_argument("--out", help="also write the comparison as JSON here")
    args = ap.parse_args(argv)
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    on_gpu = args.device.startswith("cuda")
    args.n = args.n or (N_CIFAR if on_gpu and not args.quick else 1024)
    args.batch = args.batch or (8 if args.quick else 128)
    if args.hc_size is None and args.quick:
        args.hc_size = 64
    if args.variants is None:
        args.variants = ",".join(DEFAULT_GPU_VARIANTS) if on_gpu else "none"
    args.variants = [] if args.variants == "none" else args.variants.split(",")
    unknown = set(args.variants) - set(VARIANTS)
    if unknown:
        ap.error(f"unknown variants {sorted(unknown)}; choose from {sorted(VARIANTS)}")
    batches = args.plan_batches or "32,128,512"
    args.plan_batches = [int(b) for b in batches.split(",")]
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    settings = paper_settings()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"torch {torch.__version__} on {name}; {args.n:,} synthetic CIFAR-shaped images"
          f"{' (--quick)' if args.quick else ''}")
    bench_planning(args, settings, device)
    results: dict = {"device": name, "torch": torch.__version__, "n": args.n, "batch": args.batch}
    for model_name in args.models.split(","):
        bench_model(model_name, args, settings, device, results)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2, default=str) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
