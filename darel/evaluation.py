"""Evaluation passes of an image model: every sample's loss (Algorithm 2's scoring and
Algorithm 3's refresh), predictions and top-1 accuracy, the pooled features IDS clusters.

Eval mode, no augmentation, ``batch`` samples at a time under the run's precision; a
pass handed a ``StepMemoryMeter`` is metered batch by batch like the training steps
(counted after the timed interval on a CPU with ``defer_count``).
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import torch
import torch.nn as nn
import torch.nn.functional as F

from darel.measure import StepMemoryMeter
from darel.step import autocast, prepare_input, resolve_precision


@contextlib.contextmanager
def without_algorithm_search() -> Iterator[None]:
    """cuDNN picks its convolution algorithms by heuristics inside this block instead of
    timing candidates on the first call of each shape (``cudnn.benchmark``). That search
    allocates workspaces as large as the free memory allows, once per shape; on the
    paper-shaped ResNet18-HC (224 px) a run's first evaluation at batch 1024 peaked far
    above the calibration's probe of the same pass, metered after a warm-up call, so the
    budget the probe fitted did not hold in the run (the GPU run in docs/measurements.md,
    "Measurement").
    Off in every evaluation pass, the probe and the run meter the same pass; training
    steps keep the search (their hot path; there it added under 0.2 % to the peak) unless
    the profile turns it off (``cudnn_benchmark``, darel.runtime.configure_runtime)."""
    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = False
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = before


@torch.no_grad()
def _eval_batches(model: nn.Module, images: torch.Tensor, normalise: Callable, batch: int, precision: str,
                  head: Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor], *,
                  rows: torch.Tensor | None = None, meter: StepMemoryMeter | None = None,
                  kind: str = "eval", defer_count: bool = False) -> torch.Tensor:
    """Run ``head(model, x, idx)`` over the samples ``rows`` (default: all) in eval mode, no
    augmentation, ``batch`` at a time, each batch metered as a pass of ``kind`` (counted
    later, outside the clock, with ``defer_count``)."""
    was_training = model.training
    model.eval()
    device = images.device
    n = len(images) if rows is None else len(rows)
    precision = resolve_precision(precision, device)
    outputs = []

    def one_batch(idx: torch.Tensor) -> torch.Tensor:
        x = prepare_input(normalise(images[idx]), device)
        with autocast(device, precision):
            return head(model, x, idx).float()

    def replay(idx: torch.Tensor):
        # The same pass again after a timed interval, for the CPU memory count (eval mode,
        # no gradient: nothing changes).
        def run() -> None:
            mode = model.training
            model.eval()
            with torch.no_grad():
                one_batch(idx)
            model.train(mode)
        return run

    with without_algorithm_search():
        for start in range(0, n, batch):
            span = torch.arange(start, min(start + batch, n), device=device)
            idx = span if rows is None else rows[span]
            if meter is None:
                outputs.append(one_batch(idx))
                continue
            with meter.step(key=len(idx), kind=kind, replay=replay(idx) if defer_count else None):
                outputs.append(one_batch(idx))
    model.train(was_training)
    return torch.cat(outputs) if outputs else torch.zeros(0, device=device)


def per_sample_losses(model: nn.Module, images: torch.Tensor, labels: torch.Tensor,
                      normalise: Callable[[torch.Tensor], torch.Tensor], batch: int, precision: str = "fp32", *,
                      rows: torch.Tensor | None = None, meter: StepMemoryMeter | None = None,
                      defer_count: bool = False) -> torch.Tensor:
    """Cross-entropy of every sample (of ``rows``), eval mode, no augmentation (Algorithms 2, 3)."""
    return _eval_batches(model, images, normalise, batch, precision,
                         lambda m, x, idx: F.cross_entropy(m(x).float(), labels[idx], reduction="none"),
                         rows=rows, meter=meter, kind="score", defer_count=defer_count)


def predictions(model: nn.Module, images: torch.Tensor, normalise: Callable, batch: int,
                precision: str = "fp32", *, meter: StepMemoryMeter | None = None) -> torch.Tensor:
    return _eval_batches(model, images, normalise, batch, precision, lambda m, x, idx: m(x).argmax(1),
                         meter=meter).long()


def penultimate_features(model: nn.Module, images: torch.Tensor, normalise: Callable, batch: int,
                         precision: str = "fp32") -> torch.Tensor:
    """Pooled features before the classifier (eval mode, no augmentation), for IDS."""
    return _eval_batches(model, images, normalise, batch, precision, lambda m, x, idx: m.features(x))


def top1_percent(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, normalise: Callable,
                 batch: int, precision: str = "fp32", *, meter: StepMemoryMeter | None = None) -> float:
    pred = predictions(model, images, normalise, batch, precision, meter=meter)
    return accuracy_percent(pred, labels)


def accuracy_percent(pred: torch.Tensor, labels: torch.Tensor) -> float:
    """The share of ``pred`` equal to ``labels``, in percent."""
    return 100.0 * (pred == labels).float().mean().item()


def rare_and_common_top1(pred: torch.Tensor, labels: torch.Tensor, rare_classes: list[int]) -> dict[str, float]:
    """Top-1 (percent) on the test images of the rare classes and on the others: where a
    selection that starves the loss tail would show first (the generated benchmark's
    test set is balanced, so each figure is a mean over its classes' images)."""
    rare = torch.isin(labels, torch.as_tensor(list(rare_classes), dtype=labels.dtype, device=labels.device))
    if not bool(rare.any()) or bool(rare.all()):
        raise ValueError(f"rare classes {list(rare_classes)} leave no test image on one side")
    return {"top1_rare": accuracy_percent(pred[rare], labels[rare]),
            "top1_common": accuracy_percent(pred[~rare], labels[~rare])}


def training_set_fit(pred: torch.Tensor, labels: torch.Tensor, category: torch.Tensor | None = None
                     ) -> dict[str, float]:
    """How well a model fits its own training set: top-1 (percent) of its eval-mode
    predictions on every training sample against the observed labels (``train_top1``),
    and, where the data records per-sample categories (the generated benchmark), apart on
    the clean samples and on the label-noise ones against their wrong label (a model that
    fits its training set has memorised those too; NaN where a group is empty)."""
    if len(pred) != len(labels):
        raise ValueError(f"{len(pred)} predictions for {len(labels)} training labels")
    right = pred == labels
    fit = {"train_top1": accuracy_percent(pred, labels)}
    if category is not None:
        from darel.synth import CLEAN, NOISY

        for key, code in (("train_clean_top1", CLEAN), ("train_noisy_top1", NOISY)):
            chosen = category == code
            fit[key] = 100.0 * right[chosen].float().mean().item() if bool(chosen.any()) else float("nan")
    return fit


@torch.no_grad()
def reestimate_batchnorm(model: nn.Module, images: torch.Tensor, normalise: Callable, batch: int) -> int:
    """Every BatchNorm layer's running statistics replaced by their equal-weight average over
    ``images`` (train-mode forward, ``batch`` at a time, no augmentation, weights untouched):
    what a model's test pass would use without the noise of the last training batches. A
    diagnostic of the bench scripts, never part of a training. Returns the layers reset;
    each layer's momentum and the model's mode are restored."""
    layers = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    momentum = [m.momentum for m in layers]
    for layer in layers:
        layer.reset_running_stats()
        layer.momentum = None  # cumulative average over the pass
    was_training = model.training
    model.train()
    for start in range(0, len(images), batch):
        model(prepare_input(normalise(images[start:start + batch]), images.device))
    for layer, value in zip(layers, momentum):
        layer.momentum = value
    model.train(was_training)
    return len(layers)
