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


class TrainStep:
    """``step(*args)``: assemble a batch from ``args``, compute the loss, back-propagate,
    update. Returns the detached statistics ``loss_fn`` reports (device tensors, never read
    on the host here, so a step makes no host synchronisation of its own).

    ``loss_fn(module, inputs) -> (loss, stats)``; ``module`` is ``forward_module`` (e.g. a
    DistributedDataParallel wrapper) or the model. With ``compile=True`` the forward and
    loss are compiled once with ``torch.compile`` (static shapes: online batches all have
    one shape, so it does not recompile after warm-up).
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, *, device: torch.device | str,
                 precision: str, assemble: Callable[..., Any], loss_fn: Callable[[nn.Module, Any], tuple],
                 forward_module: nn.Module | None = None, compile: bool = False) -> None:
        self.model = model
        self.optimizer = optimizer
        self.device = torch.device(device)
        self.precision = resolve_precision(precision, self.device)
        self.assemble = assemble
        self.loss_fn = loss_fn
        self.forward_module = forward_module if forward_module is not None else model
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.precision == "fp16")
        self.compiled = bool(compile)
        self._forward_loss = torch.compile(self._forward, dynamic=False) if compile else self._forward

    def _forward(self, inputs: Any) -> tuple:
        with autocast(self.device, self.precision):
            return self.loss_fn(self.forward_module, inputs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        inputs = self.assemble(*args, **kwargs)
        loss, stats = self._forward_loss(inputs)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        # Gradients are freed right after the update: they do not sit in memory through
        # the next forward, an evaluation or a scoring pass.
        self.optimizer.zero_grad(set_to_none=True)
        return stats

    # The scaler's state belongs in checkpoints beside the optimiser's.
    def state_dict(self) -> dict:
        return {"scaler": self.scaler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.scaler.load_state_dict(state["scaler"])


def sgd(params, *, lr: float, momentum: float, weight_decay: float, device: torch.device | str) -> torch.optim.SGD:
    """The paper's SGD; fused on a GPU (one kernel, and GradScaler needs no host sync)."""
    fused = torch.device(device).type == "cuda"
    return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay, fused=fused or None)


def adamw(params, *, lr: float, betas: tuple[float, float], weight_decay: float,
          device: torch.device | str) -> torch.optim.AdamW:
    """AdamW of the LoRA protocol; fused on a GPU for the same reasons as ``sgd``."""
    fused = torch.device(device).type == "cuda"
    return torch.optim.AdamW(params, lr=lr, betas=tuple(betas), weight_decay=weight_decay, fused=fused or None)
