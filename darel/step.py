"""One training step, the single place where forward, loss, backward and the optimiser
step happen, for every training path of the project: the ResNet training loop, Algorithm
1's calibration probes, the controls of the study, and the LoRA fine-tuning.

A step is ``assemble`` (batch assembly: gathering samples, augmentation, moving them to
the device in the run's memory format) followed by ``loss_fn`` under the run's precision,
then backward and the optimiser step. Timing a step therefore times exactly what the run
executes, batch assembly included. The learning-rate schedule is stepped by the caller.

Precision is one of ``fp32``, ``fp16`` (autocast + GradScaler, the paper's mixed
precision) or ``bf16`` (autocast, no scaler); ``auto`` resolves to bf16 where the device
supports it and fp16 elsewhere on a GPU. On a CPU every precision runs in float32, so the
quick profile's numbers do not depend on the CPU's half-precision support.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_map

from darel.sgd import Optimizer, PlainSGD

PRECISIONS = ("fp32", "fp16", "bf16", "auto")
_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def resolve_precision(name: str, device: torch.device | str) -> str:
    """The precision a run really uses on ``device`` (what gets recorded)."""
    if name not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {name!r}")
    device = torch.device(device)
    if device.type != "cuda":
        return "fp32"
    if name == "auto":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return name


def autocast(device: torch.device | str, precision: str) -> contextlib.AbstractContextManager:
    """Autocast context for a resolved precision (a no-op for fp32)."""
    device = torch.device(device)
    if precision == "fp32" or device.type != "cuda":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=_DTYPES[precision])


def half_dtype(precision: str) -> torch.dtype | None:
    """The autocast dtype of a resolved precision, None for fp32."""
    return _DTYPES.get(precision)


# How far a compiled step may lie from eager mode on one batch: the relative L2 distance of
# the whole gradient (all trainable parameters) and the relative difference of the loss.
# Not a rounding bound: ResNet18 at initialisation is ill-conditioned (width 64, batch 8,
# CPU: eager float32 is 0.4 % from float64, inductor 0.9 %, inductor vs eager 0.8 %), so
# the check is set to catch gross compiler defects (torch 2.13's CPU defect described in
# docs/gpu.md is 36-62 % off) without stopping sound runs. Half precision is looser.
COMPILE_TOLERANCE = {"fp32": 0.1, "fp16": 0.3, "bf16": 0.3}


class CompiledGradientMismatch(RuntimeError):
    """torch.compile computed a loss or a gradient that differs from eager mode."""


def check_compiled_gradients(model: nn.Module, eager: Callable[[Any], tuple], compiled: Callable[[Any], tuple],
                             inputs: Any, *, tolerance: float) -> dict:
    """Compare ``compiled(inputs)`` with ``eager(inputs)`` (each returning ``(loss, stats)``):
    the loss, and the gradient of every trainable parameter of ``model`` (by
    ``torch.autograd.grad``, so ``.grad`` is not touched), as relative L2 distances. The
    model's buffers (batch-norm statistics) and the random number state are put back, so
    the check changes nothing the run depends on. Raises ``CompiledGradientMismatch``
    (naming the parameter with the largest difference) when a distance exceeds
    ``tolerance`` or is not finite; returns the comparison otherwise."""
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    (eager_loss, eager_grads), (compiled_loss, compiled_grads) = _runs_undone(model, (eager, compiled), inputs)
    eager_loss, compiled_loss = eager_loss.double(), compiled_loss.double()
    loss_diff = ((compiled_loss - eager_loss).abs() / eager_loss.abs().clamp_min(1e-12)).item()
    eager_sq = diff_sq = 0.0
    worst_name, worst_sq = None, 0.0
    for (name, _), g_eager, g_compiled in zip(named, eager_grads, compiled_grads):
        if g_eager is None and g_compiled is None:
            continue
        if g_eager is None or g_compiled is None:
            raise CompiledGradientMismatch(f"torch.compile and eager mode disagree on whether {name} gets a gradient")
        g_eager, g_compiled = g_eager.double(), g_compiled.double()  # exact: the widening rounds nothing
        sq = (g_compiled - g_eager).square().sum().item()
        eager_sq += g_eager.square().sum().item()
        diff_sq += sq
        if not sq <= worst_sq:  # NaN included
            worst_name, worst_sq = name, sq
    grad_diff = (diff_sq / eager_sq) ** 0.5 if eager_sq > 0 else (0.0 if diff_sq == 0 else float("inf"))
    record = {"loss_rel_diff": loss_diff, "grad_rel_diff": grad_diff, "largest_difference_in": worst_name,
              "tolerance": tolerance}
    if not (loss_diff <= tolerance and grad_diff <= tolerance):
        raise CompiledGradientMismatch(
            f"torch.compile's step differs from eager mode on the first batch of its shape: gradient off by {grad_diff:.3g} "
            f"(relative L2 over all parameters; largest part in {worst_name}), loss off by {loss_diff:.3g} "
            f"(tolerance {tolerance:g}; torch {torch.__version__}). Set compile: false in params.yaml's profile "
            f"for this device.")
    return record


def _runs_undone(model: nn.Module, fns, inputs: Any, keep: bool = True) -> list[tuple]:
    """Each of ``fns`` on ``inputs``: its loss and every trainable parameter's gradient (by
    ``torch.autograd.grad``, so ``.grad`` is not touched), as computed (the caller widens
    them one at a time, so a check holds two sets of gradients at their own precision and
    not in float64), or nothing with ``keep=False``; the model's buffers (batch-norm
    statistics) are put back after each and the random number state after all: nothing the
    run depends on changes."""
    params = [p for p in model.parameters() if p.requires_grad]
    saved = [b.detach().clone() for b in model.buffers()]
    results = []
    cuda = [p.device.index or 0 for p in params[:1] if p.device.type == "cuda"]
    with torch.random.fork_rng(devices=cuda):
        for fn in fns:
            loss, _ = fn(inputs)
            grads = torch.autograd.grad(loss, params, allow_unused=True)
            if keep:
                results.append((loss.detach(), [None if g is None else g.detach() for g in grads]))
            del loss, grads
            with torch.no_grad():
                for buffer, value in zip(model.buffers(), saved):
                    buffer.copy_(value)
    return results


# Calls of a new shape's graphed step made before it trains, beyond the check's: torch's CUDA
# graph trees run a function once to warm it up and record its graphs on the next call, so
# after the check (the warm-up) and these, the first training step of the shape replays.
GRAPH_REHEARSALS = 2


def check_compiled_outputs(eager: torch.Tensor, compiled: torch.Tensor, *, tolerance: float, what: str) -> dict:
    """The forward-only counterpart of ``check_compiled_gradients`` (e.g. the per-sample
    losses of a compiled scoring pass against eager mode): relative L2 distance."""
    eager, compiled = eager.detach().double(), compiled.detach().double()
    norm = eager.norm().item()
    diff = (compiled - eager).norm().item()
    rel = diff / norm if norm > 0 else (0.0 if diff == 0 else float("inf"))
    if not rel <= tolerance:
        raise CompiledGradientMismatch(
            f"torch.compile's {what} differs from eager mode by {rel:.3g} (relative L2; tolerance {tolerance:g}; "
            f"torch {torch.__version__}). Set compile: false in params.yaml's profile for this device.")
    return {"rel_diff": rel, "tolerance": tolerance}


# ``compile`` settings: off, torch.compile, or torch.compile with CUDA graphs ("graphs").
COMPILE_SETTINGS = (False, True, "graphs")


def uses_cuda_graphs(compile: bool | str, device: torch.device | str, precision: str) -> bool:
    """Whether a step with this ``compile`` setting replays CUDA graphs: "graphs" on a CUDA
    device, except under fp16, whose GradScaler changes its scale between steps on the
    host's say (that step stays compiled without graphs). Off a GPU "graphs" is plain
    torch.compile: a CPU run trains exactly what ``compile: true`` trains."""
    if compile not in COMPILE_SETTINGS:
        raise ValueError(f"compile must be one of {COMPILE_SETTINGS}, got {compile!r}")
    return compile == "graphs" and torch.device(device).type == "cuda" and precision != "fp16"


def step_kind(compile: bool | str, device: torch.device | str, precision: str) -> str:
    """What a step with this ``compile`` setting runs on ``device`` at the resolved
    ``precision``: "eager", "compiled" (torch.compile) or "graphs" (torch.compile replaying
    CUDA graphs). Recorded by the training and the calibration, so a reader (and a test of
    every profile) sees that the probes timed the step the run trained with."""
    if uses_cuda_graphs(compile, device, precision):
        return "graphs"
    return "compiled" if compile else "eager"


class TrainStep:
    """``step(*args)``: assemble a batch from ``args``, compute the loss, back-propagate,
    update. Returns the detached statistics ``loss_fn`` reports (device tensors, never read
    on the host here, so a step makes no host synchronisation of its own).

    ``compile="graphs"`` (the fast path on a GPU) compiles like ``compile=True`` with
    torch.compile's "reduce-overhead" mode: the forward and the backward of a batch shape
    are recorded once as CUDA graphs and replayed, so a step launches a few graphs instead
    of hundreds of kernels, one by one from Python (the bound of a ResNet18 step at batch
    128 on an H100, bench/README.md). Batch assembly (gather, augmentation) and the fused
    optimiser step stay outside the graphs: the learning rate and the augmentation's random
    numbers change between steps. A graph's outputs are overwritten by its next replay, so
    the statistics a step returns are copies.

    ``loss_fn(module, inputs) -> (loss, stats)``; ``module`` is ``forward_module`` (e.g. a
    DistributedDataParallel wrapper) or the model. With ``compile=True`` the forward and
    loss are compiled once with ``torch.compile`` (static shapes: online batches all have
    one shape, so it does not recompile after warm-up), and the first step checks the
    compiled loss and gradients against eager mode on its own batch before it trains
    (``check_compiled_gradients``): a compiler defect stops the run with an error instead
    of silently training another model. ``compiler`` replaces ``torch.compile`` (tests).

    Compilation is not training: a compiled step compiles on the first batch of each new
    shape (``dynamic=False``: a plain epoch's short last batch is one), and that call is
    made first as the check against eager mode, inside ``untimed()`` (the training loop
    sets it to its ``TimedWork.excluded``, so the compilation leaves the epoch's time and
    energy; the check puts back everything it touches, so the trained model is the same).
    Under graphs the same window then calls the compiled step ``GRAPH_REHEARSALS`` more
    times on that batch, undone the same way, so the shape's CUDA graphs are recorded
    there too and its first training step replays them. ``compile_calls`` counts the
    shapes compiled so far.
    """

    def __init__(self, model: nn.Module, optimizer: Optimizer, *, device: torch.device | str,
                 precision: str, assemble: Callable[..., Any], loss_fn: Callable[[nn.Module, Any], tuple],
                 forward_module: nn.Module | None = None, compile: bool | str = False,
                 compiler: Callable[[Callable], Callable] | None = None) -> None:
        self.model = model
        self.optimizer = optimizer
        self.device = torch.device(device)
        self.precision = resolve_precision(precision, self.device)
        self.assemble = assemble
        self.loss_fn = loss_fn
        self.forward_module = forward_module if forward_module is not None else model
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.precision == "fp16")
        self.kind = step_kind(compile, self.device, self.precision)
        self.graphs = self.kind == "graphs"
        self.compiled = bool(compile)
        if self.compiled and self.forward_module is not model:
            # The check differentiates with torch.autograd.grad, which a DDP wrapper's
            # gradient hooks do not see; no path of the project compiles under one.
            raise ValueError("TrainStep: compile=True is not supported with a forward_module wrapper "
                             "(distributed training runs eager)")
        mode = "reduce-overhead" if self.graphs else None
        compiler = compiler or (lambda fn: torch.compile(fn, dynamic=False, mode=mode))
        self._forward_loss = compiler(self._forward) if compile else self._forward
        self.compile_check: dict | None = None  # the first compiled step's comparison with eager
        self.untimed: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
        self._shapes_compiled: set[tuple] = set()

    def _forward(self, inputs: Any) -> tuple:
        with autocast(self.device, self.precision):
            return self.loss_fn(self.forward_module, inputs)

    def _rehearse(self, inputs: Any) -> tuple:
        torch.compiler.cudagraph_mark_step_begin()  # a step of its own, as in training
        return self._forward_loss(inputs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        inputs = self.assemble(*args, **kwargs)
        if self.compiled:
            shapes = _shapes(inputs)
            if shapes not in self._shapes_compiled:
                with self.untimed():  # torch.compile compiles this shape here, outside the training's time
                    check = check_compiled_gradients(self.model, self._forward, self._forward_loss, inputs,
                                                     tolerance=COMPILE_TOLERANCE[self.precision])
                    if self.graphs:  # ... and records its CUDA graphs, undone like the check
                        _runs_undone(self.model, [self._rehearse] * GRAPH_REHEARSALS, inputs, keep=False)
                self._shapes_compiled.add(shapes)
                self.compile_check = self.compile_check or check
        if self.graphs:
            torch.compiler.cudagraph_mark_step_begin()  # one step = one forward and one backward replay
        loss, stats = self._forward_loss(inputs)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        # Gradients are freed right after the update: they do not sit in memory through
        # the next forward, an evaluation or a scoring pass.
        self.optimizer.zero_grad(set_to_none=True)
        if self.graphs:
            stats = tree_map(lambda value: value.clone() if isinstance(value, torch.Tensor) else value, stats)
        return stats

    @property
    def compile_calls(self) -> int:
        return len(self._shapes_compiled)

    # The scaler's state belongs in checkpoints beside the optimiser's.
    def state_dict(self) -> dict:
        return {"scaler": self.scaler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.scaler.load_state_dict(state["scaler"])


def _shapes(inputs: Any) -> tuple:
    """What a static-shape compilation is specialised on: each tensor's shape and dtype, and
    where the inputs hold no tensor (None weights), that value's type."""
    leaves, spec = tree_flatten(inputs)  # the spec is hashable: no string built per step
    return (spec, *((tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else type(x) for x in leaves))


def sgd(params, *, lr: float, momentum: float, weight_decay: float,
        device: torch.device | str) -> torch.optim.SGD | PlainSGD:
    """The paper's SGD: torch's fused SGD on a GPU (one kernel, and GradScaler needs no host
    sync); elsewhere ``PlainSGD``, the same arithmetic as torch's CPU path bit for bit
    without importing torch's compiler into every job (darel/sgd.py)."""
    if torch.device(device).type == "cuda":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay, fused=True)
    return PlainSGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)


def adamw(params, *, lr: float, betas: tuple[float, float], weight_decay: float,
          device: torch.device | str) -> torch.optim.AdamW:
    """AdamW of the LoRA protocol; fused on a GPU for the same reasons as ``sgd``."""
    fused = torch.device(device).type == "cuda"
    return torch.optim.AdamW(params, lr=lr, betas=tuple(betas), weight_decay=weight_decay, fused=fused or None)


def prepare_input(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The memory format the model runs in (channels-last on a GPU)."""
    return x.contiguous(memory_format=torch.channels_last) if device.type == "cuda" else x
