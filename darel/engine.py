"""The training loop shared by every training stage (baseline/scorer, DAREL online).

Data stays on the device as uint8 tensors and is augmented in batches there; the
online selection (Algorithm 3) decides which indices form each training batch.
A plain run is the same loop with every epoch treated as a warm-up epoch, so the
baseline and the DAREL cells time exactly the same code path.

Resumability: after every epoch the full state (weights, optimiser, scheduler,
sampler, curves, elapsed time) is checkpointed atomically. All randomness inside
an epoch comes from generators seeded by (seed, epoch), so a run restarted from
the last checkpoint replays the interrupted epoch bit for bit on the CPU.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from tqdm import tqdm

from darel.io import torch_save
from darel.measure import StepMemoryMeter
from darel.sampler import OnlineSampler

log = logging.getLogger("darel.engine")

# Independent random streams per epoch.
_STREAM_AUGMENT = 1


@dataclass(frozen=True)
class OnlineSettings:
    """Algorithm 3 parameters of one run."""

    keep_fraction: float  # A
    eta: int
    warmup_epochs: int  # omega
    history_size: int  # gamma
    bins: int


@dataclass(frozen=True)
class RunPlan:
    epochs: int
    batch: int
    lr: float
    momentum: float
    weight_decay: float
    schedule: str  # "multistep" | "cosine"
    milestones: tuple[int, ...]
    lr_gamma: float
    seed: int
    amp: bool = False
    eval_batch: int = 512
    time_budget_s: float | None = None
    schedule_epochs: int | None = None  # compress the LR schedule to this many epochs ("rescale")
    online: OnlineSettings | None = None
    extra: dict = field(default_factory=dict)  # recorded in the fingerprint only

    def fingerprint(self, n_samples: int) -> str:
        blob = json.dumps({"plan": asdict(self), "n": n_samples}, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("the profile asks for device 'cuda' but torch sees no CUDA device; "
                           "use the quick profile or set the profile's device to cpu/auto")
    return torch.device(name)


def configure_runtime(device: torch.device, threads: int) -> None:
    torch.set_num_threads(threads)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True


def epoch_generator(seed: int, epoch: int, stream: int, device: torch.device) -> torch.Generator:
    gen = torch.Generator(device=device)
    gen.manual_seed((seed * 1_000_003 + epoch * 101 + stream) % (2**63))
    return gen


def make_optimizer(model: nn.Module, plan: RunPlan) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=plan.lr, momentum=plan.momentum, weight_decay=plan.weight_decay)


def make_scheduler(optimizer: torch.optim.Optimizer, plan: RunPlan) -> torch.optim.lr_scheduler.LRScheduler:
    span = plan.schedule_epochs or plan.epochs
    if plan.schedule == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=span)
    scale = span / plan.epochs
    milestones = sorted({max(1, round(m * scale)) for m in plan.milestones})
    return torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=milestones, gamma=plan.lr_gamma)


def _autocast(device: torch.device, amp: bool):
    return torch.autocast(device_type=device.type, dtype=torch.float16, enabled=amp and device.type == "cuda")


def _prepare(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    return x.contiguous(memory_format=torch.channels_last) if device.type == "cuda" else x


@torch.no_grad()
def _eval_batches(model: nn.Module, images: torch.Tensor, normalise: Callable, batch: int, amp: bool,
                  head: Callable[[nn.Module, torch.Tensor, slice], torch.Tensor]) -> torch.Tensor:
    """Run `head` over the data in eval mode, no augmentation, batch by batch; restore the mode."""
    was_training = model.training
    model.eval()
    outputs = []
    for start in range(0, len(images), batch):
        rows = slice(start, start + batch)
        x = _prepare(normalise(images[rows]), images.device)
        with _autocast(images.device, amp):
            outputs.append(head(model, x, rows).float())
    model.train(was_training)
    return torch.cat(outputs)


def per_sample_losses(model: nn.Module, images: torch.Tensor, labels: torch.Tensor,
                      normalise: Callable[[torch.Tensor], torch.Tensor], batch: int, amp: bool = False) -> torch.Tensor:
    """Cross-entropy of every sample, eval mode, no augmentation (Algorithms 2 and 3)."""
    return _eval_batches(model, images, normalise, batch, amp,
                         lambda m, x, rows: F.cross_entropy(m(x).float(), labels[rows], reduction="none"))


def predictions(model: nn.Module, images: torch.Tensor, normalise: Callable, batch: int,
                amp: bool = False) -> torch.Tensor:
    return _eval_batches(model, images, normalise, batch, amp, lambda m, x, rows: m(x).argmax(1)).long()


def penultimate_features(model: nn.Module, images: torch.Tensor, normalise: Callable, batch: int,
                         amp: bool = False) -> torch.Tensor:
    """Pooled features before the classifier (eval mode, no augmentation), for IDS."""
    return _eval_batches(model, images, normalise, batch, amp, lambda m, x, rows: m.features(x))


def top1_percent(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, normalise: Callable,
                 batch: int, amp: bool = False) -> float:
    pred = predictions(model, images, normalise, batch, amp)
    return 100.0 * (pred == labels).float().mean().item()


def train(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, augment: Callable,
          normalise: Callable, plan: RunPlan, device: torch.device, *,
          checkpoint_path: str | Path | None = None,
          eval_data: tuple[torch.Tensor, torch.Tensor] | None = None,
          progress: bool = True,
          on_epoch_end: Callable[[int, dict], None] | None = None) -> dict:
    """Train in place; return the run summary (times, memory, curves, epochs)."""
    n = len(labels)
    if n == 0:
        raise ValueError("the training set is empty")
    model.to(device)
    if device.type == "cuda":
        model.to(memory_format=torch.channels_last)
    optimizer = make_optimizer(model, plan)
    scheduler = make_scheduler(optimizer, plan)
    scaler = torch.amp.GradScaler(device.type, enabled=plan.amp and device.type == "cuda")
    online = plan.online
    sampler = OnlineSampler(
        n_samples=n, batch_size=plan.batch,
        keep_fraction=online.keep_fraction if online else 1.0,
        eta=online.eta if online else 1,
        warmup_epochs=online.warmup_epochs if online else plan.epochs,
        history_size=online.history_size if online else 1,
        bins=online.bins if online else 2,
        seed=plan.seed, device=device,
    )
    meter = StepMemoryMeter(model, optimizer, device)
    fingerprint = plan.fingerprint(n)

    state = {"epoch": 0, "elapsed_s": 0.0, "curves": {}, "stopped_by_budget": False,
             "epoch_kind_time": {}, "resumed_from_epoch": None, "peak_mem_bytes": 0}
    ckpt = Path(checkpoint_path) if checkpoint_path else None
    if ckpt and ckpt.exists():
        saved = torch.load(ckpt, map_location=device, weights_only=False)
        if saved.get("fingerprint") == fingerprint:
            model.load_state_dict(saved["model"])
            optimizer.load_state_dict(saved["optimizer"])
            scheduler.load_state_dict(saved["scheduler"])
            scaler.load_state_dict(saved["scaler"])
            sampler.load_state_dict(saved["sampler"])
            state = saved["state"]
            state["resumed_from_epoch"] = state["epoch"]
            log.info("resumed from %s at epoch %d (%.1f s already trained)", ckpt, state["epoch"], state["elapsed_s"])
        else:
            log.warning("ignoring checkpoint %s: it belongs to a different run configuration", ckpt)

    curves = state["curves"]
    steps_total = state.get("steps", 0)
    bar = tqdm(total=plan.epochs, initial=state["epoch"], desc="epochs", disable=not progress, mininterval=2)
    model.train()
    while state["epoch"] < plan.epochs and not state["stopped_by_budget"]:
        epoch = state["epoch"]
        kind = "warmup" if sampler.is_warmup(epoch) else ("refresh" if sampler.needs_refresh(epoch) else "reuse")
        _sync(device)
        started = time.perf_counter()
        if kind == "refresh":
            sampler.update_losses(epoch, per_sample_losses(model, images, labels, normalise, plan.eval_batch, plan.amp))
            model.train()
        batches = sampler.plan_epoch(epoch)
        gen = epoch_generator(plan.seed, epoch, _STREAM_AUGMENT, device)
        loss_sum = torch.zeros((), device=device)
        correct = torch.zeros((), device=device, dtype=torch.long)
        seen = 0
        for idx in batches:
            x = _prepare(augment(images[idx], gen), device)
            y = labels[idx]
            with meter.step():
                with _autocast(device, plan.amp):
                    logits = model(x)
                    loss = F.cross_entropy(logits, y)
                optimizer.zero_grad(set_to_none=True)
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            loss_sum += loss.detach().float() * len(y)
            correct += (logits.detach().argmax(1) == y).sum()
            seen += len(y)
        scheduler.step()
        _sync(device)
        epoch_time = time.perf_counter() - started
        state["elapsed_s"] += epoch_time
        steps_total += len(batches)
        state["epoch_kind_time"][kind] = epoch_time
        record = {
            "train_loss": (loss_sum / max(seen, 1)).item(),
            "train_top1": 100.0 * correct.item() / max(seen, 1),
            "lr": optimizer.param_groups[0]["lr"],
            "epoch_time_s": epoch_time,
            "samples_trained": seen,
            "kept_fraction": seen / n,
            "loss_refreshed": 1.0 if kind == "refresh" else 0.0,
        }
        if eval_data is not None:
            record["test_top1"] = top1_percent(model, eval_data[0], eval_data[1], normalise, plan.eval_batch, plan.amp)
            model.train()
        for key, value in record.items():
            curves.setdefault(key, []).append(value)
        state["epoch"] = epoch + 1
        state["steps"] = steps_total
        state["peak_mem_bytes"] = max(state["peak_mem_bytes"], meter.peak_bytes)
        if plan.time_budget_s is not None and state["epoch"] < plan.epochs:
            nxt = state["epoch"]
            next_kind = "warmup" if sampler.is_warmup(nxt) else ("refresh" if sampler.needs_refresh(nxt) else "reuse")
            times = state["epoch_kind_time"]
            predicted = times.get(next_kind, max(times.values()))
            if state["elapsed_s"] + predicted > plan.time_budget_s:
                state["stopped_by_budget"] = True
                log.info("time budget: %.1f s used, next %s epoch needs ~%.1f s of %.1f s allowed; stopping after "
                         "%d epochs", state["elapsed_s"], next_kind, predicted, plan.time_budget_s, state["epoch"])
        if ckpt:
            torch_save(ckpt, {"fingerprint": fingerprint, "model": model.state_dict(),
                              "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                              "scaler": scaler.state_dict(), "sampler": sampler.state_dict(), "state": state})
        log.info("epoch %d/%d %s: loss %.4f train top1 %.2f%% %s%.2f s (%d samples)", state["epoch"], plan.epochs,
                 kind, record["train_loss"], record["train_top1"],
                 f"test top1 {record['test_top1']:.2f}% " if "test_top1" in record else "", epoch_time, seen)
        bar.set_postfix(loss=f"{record['train_loss']:.3f}", kind=kind)
        bar.update(1)
        if on_epoch_end:
            on_epoch_end(epoch, record)
    bar.close()
    return {
        "epochs_completed": state["epoch"],
        "epochs_planned": plan.epochs,
        "stopped_by_budget": state["stopped_by_budget"],
        "time_s": state["elapsed_s"],
        "time_budget_s": plan.time_budget_s,
        "steps": steps_total,
        "samples_trained": int(sum(curves.get("samples_trained", []))),
        "peak_mem_bytes": int(max(state["peak_mem_bytes"], meter.peak_bytes)),
        "memory_source": meter.source,
        "nvml_peak_bytes": getattr(meter, "nvml_peak_bytes", None),
        "nvml_status": getattr(meter, "nvml_status", None),
        "sampler": sampler.stats(),
        "resumed_from_epoch": state["resumed_from_epoch"],
        "curves": curves,
        "fingerprint": fingerprint,
    }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
