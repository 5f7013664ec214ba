"""Training: the tiny models' pretraining and the LoRA fine-tuning on the project's epoch
skeleton (darel.epochs) with its one training step (darel.step.TrainStep)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
from typing import Callable, Sequence

import numpy as np
import torch
from darel import distributed
from darel.epochs import EpochEnd, nothing_to_restore, run_epochs
from darel.schedules import LrSchedule, StepAt, lr_at, set_rate
from darel.runtime import seeded
from darel.step import TrainStep, adamw, resolve_precision
from darel.nlg.lm.encoding import EncodedPair, _end_token_id, _pad_token_id, _text_ids, collate_pairs, encode_pair_ids
from darel.nlg.lm.loss import TargetLoss, _device, hold_frozen_in_half, target_positions
from darel.nlg.lm.model import _model_max_positions


def _epoch_order(count: int, seed: int, epoch: int) -> torch.Tensor:
    # One generator per (seed, epoch): an epoch's order does not depend on earlier ones.
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(count, generator=generator)


def pretrain_lm(
    model: torch.nn.Module,
    tokenizer,
    texts: Sequence[str],
    epochs: int = 1,
    batch_size: int = 16,
    lr: float = 1e-3,
    device: str | torch.device = "cpu",
    seed: int = 0,
    max_length: int | None = None,
    weight_decay: float = 0.01,
) -> dict:
    """Short full-parameter causal-LM training on whole texts (loss on every token),
    so that the quick profile's LoRA adapts a model that already knows the language.
    AdamW, linear warm-up over 5 % of the steps then linear decay, on the epoch skeleton
    (darel.epochs; no checkpoints: it takes seconds)."""
    device = _device(device)
    if not texts:
        raise ValueError("pretrain_lm needs at least one text")
    if not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs must be a positive integer, got {epochs!r}")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    max_length = max_length or _model_max_positions(model)
    end_id = _end_token_id(tokenizer)
    encoded: list[EncodedPair] = []
    for index, text in enumerate(texts):
        ids = _text_ids(tokenizer, text) + [end_id]
        if max_length is not None and len(ids) > max_length:
            raise ValueError(f"text {index} takes {len(ids)} tokens, more than max_length={max_length}")
        # A prompt length of 0 puts every token under the loss.
        encoded.append((ids, 0))
    pad_id = _pad_token_id(tokenizer)

    model.to(device).train()
    params = [param for param in model.parameters() if param.requires_grad]
    optimizer = adamw(params, lr=lr, betas=(0.9, 0.999), weight_decay=weight_decay, device=device)
    total_steps = epochs * math.ceil(len(encoded) / batch_size)
    rate = LrSchedule("warmup_linear", lr, warmup_steps=max(1, total_steps // 20), total_steps=total_steps)
    # The project's one training step, in float32 (the quick profile runs on a CPU).
    train_step = TrainStep(model, optimizer, device=device, precision="fp32",
                           assemble=lambda pairs, count: _assemble(pairs, pad_id, device, count),
                           loss_fn=_loss_fn(0.0, 1), forward_module=TargetLoss(model))
    from darel.measure import StepMemoryMeter, TimedWork

    body = _PretrainEpochs(encoded=encoded, batch_size=batch_size, seed=seed, rate=rate, optimizer=optimizer,
                           train_step=train_step, device=device)
    # Dropout draws from torch's default generator (nn.Dropout takes none): seeded here,
    # put back after, so the masks depend on ``seed`` alone.
    with seeded(seed, device):
        result = run_epochs(body, epochs=epochs, work=TimedWork(None, device),
                            meter=StepMemoryMeter(model, optimizer, device))
    return {"train_loss": result.curves["train_loss"], "epochs": epochs, "steps": total_steps,
            "time_s": result.wall_time_s}


class _PretrainEpochs:
    """The per-batch body of ``pretrain_lm`` for ``darel.epochs.run_epochs``: each epoch's
    batches in a (seed, epoch) order through the one training step, the loss the token
    mean of every target of the epoch."""

    def __init__(self, *, encoded, batch_size, seed, rate, optimizer, train_step, device) -> None:
        self.encoded, self.batch_size, self.seed, self.rate = encoded, batch_size, seed, rate
        self.optimizer, self.train_step, self.device = optimizer, train_step, device
        self.step = 0

    def train_epoch(self, epoch: int) -> dict:
        order = _epoch_order(len(self.encoded), self.seed, epoch).tolist()
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        token_count = 0
        for first in range(0, len(order), self.batch_size):
            pairs = [self.encoded[i] for i in order[first : first + self.batch_size]]
            # the loss is the token mean of the batch: pass the batch's target count
            count = sum(len(ids) - 1 for ids, _ in pairs)
            set_rate(self.optimizer, lr_at(self.rate, StepAt(epoch, self.step)))
            loss_sum += self.train_step(pairs, count).double()
            self.step += 1
            token_count += count
        return {"loss_sum": loss_sum, "tokens": token_count}

    def end_epoch(self, epoch: int, timed: dict, seconds: float, last_planned: bool) -> EpochEnd:
        return EpochEnd({"train_loss": float(timed["loss_sum"]) / timed["tokens"]})

    def preserved_state(self):
        return nothing_to_restore()

    def state_dict(self) -> dict:
        return {"step": self.step}

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state["step"])


def _assemble(pairs: Sequence[EncodedPair], pad_token_id: int, device: torch.device, global_count: int) -> dict:
    """A training batch on the device: ids, mask, the target positions and tokens, and
    the number of targets of the global batch (the loss is their mean)."""
    batch = collate_pairs(pairs, pad_token_id)
    positions, targets = target_positions(batch["labels"])
    moved = {key: value.to(device, non_blocking=True) for key, value in
             (("input_ids", batch["input_ids"]), ("attention_mask", batch["attention_mask"]),
              ("positions", positions), ("targets", targets))}
    return {**moved, "global_count": max(global_count, 1)}


def _loss_fn(label_smoothing: float, world_size: int) -> Callable:
    """``loss_fn`` of ``TrainStep``: the summed target loss, scaled so that the (DDP-
    averaged) gradient is that of the global batch's token mean. Reports the sum."""

    def loss_fn(module: torch.nn.Module, inputs: dict) -> tuple[torch.Tensor, torch.Tensor]:
        total = module(inputs["input_ids"], inputs["attention_mask"], inputs["positions"], inputs["targets"],
                       label_smoothing)
        return total * (world_size / inputs["global_count"]), total.detach()

    return loss_fn


MEMORY_COUNTS = ("deferred", "in_place")


class _LoraEpochs:
    """The per-batch body of LoRA fine-tuning for ``darel.epochs.run_epochs``: each global
    batch split over the processes, the one training step, the learning rate set per step;
    the loss sum and token counts reduced over the processes inside the interval."""

    def __init__(self, *, model, encoded, target_counts, filler, batch_size, seed, total_steps, world, optimizer,
                 rate, train_step, memory, device, defer_count, progress, epochs) -> None:
        self.model, self.encoded, self.target_counts, self.filler = model, encoded, target_counts, filler
        self.batch_size, self.seed, self.total_steps, self.world = batch_size, seed, total_steps, world
        self.optimizer, self.rate, self.train_step, self.memory = optimizer, rate, train_step, memory
        self.device, self.defer_count, self.progress, self.epochs = device, defer_count, progress, epochs
        self.step = self.tokens_trained = self.target_tokens = 0
        # On a CPU the meter counts live tensors with Python work per operator: counting every
        # step inside the clock doubled a small model's measured time. A step's count depends
        # only on its padded shape and grows with rows and with width, so only a shape that no
        # counted shape dominates is counted, replayed after the epoch's timed interval with
        # the training state put back. Under torchrun every process keeps counting in place:
        # replays that differ between processes would pair up the wrong collectives.
        self.counted_shapes: list[tuple[int, int]] = []

    def _metered(self, pairs: list[EncodedPair], count: int) -> contextlib.AbstractContextManager:
        if not self.defer_count:
            return self.memory.step()
        rows, width = len(pairs), max(len(ids) for ids, _ in pairs)
        if any(r >= rows and w >= width for r, w in self.counted_shapes):
            return contextlib.nullcontext()
        self.counted_shapes.append((rows, width))
        return self.memory.step(key=(rows, width), replay=lambda: self.train_step(pairs, count))

    def train_epoch(self, epoch: int) -> dict:
        world = self.world
        order = _epoch_order(len(self.encoded), self.seed, epoch).tolist()
        # Summed on the device and read once per epoch: no host sync inside the step loop.
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        epoch_targets = epoch_tokens = epoch_steps = 0
        last_lr = lr_at(self.rate, StepAt(epoch, self.step))
        for first in range(0, len(order), self.batch_size):
            if self.step >= self.total_steps:
                break
            global_batch = order[first : first + self.batch_size]
            global_count = sum(self.target_counts[i] for i in global_batch)
            mine_indices = global_batch[world.rank :: world.size]
            mine = [self.encoded[i] for i in mine_indices] or [self.filler]
            last_lr = lr_at(self.rate, StepAt(epoch, self.step))  # the rate this step uses
            set_rate(self.optimizer, last_lr)
            with self._metered(mine, global_count):
                loss_total = self.train_step(mine, global_count)
            loss_sum += loss_total.double()
            # Known from the encoded pairs (the filler counts nothing).
            epoch_targets += sum(self.target_counts[i] for i in mine_indices)
            epoch_tokens += sum(len(self.encoded[i][0]) for i in mine_indices)
            epoch_steps += 1
            self.step += 1
        loss_sum, epoch_targets, epoch_tokens = distributed.all_reduce(
            [float(loss_sum), epoch_targets, epoch_tokens], world)
        return {"loss_sum": loss_sum, "targets": int(epoch_targets), "tokens": int(epoch_tokens),
                "steps": epoch_steps, "lr": last_lr}

    def end_epoch(self, epoch: int, timed: dict, seconds: float, last_planned: bool) -> EpochEnd:
        self.tokens_trained += timed["tokens"]
        self.target_tokens += timed["targets"]
        record = {
            "train_loss": timed["loss_sum"] / max(timed["targets"], 1),
            "lr": timed["lr"],
            "epoch_time_s": seconds,
            "tokens_per_s": timed["tokens"] / seconds if seconds > 0 else float("nan"),
            "steps_per_epoch": timed["steps"],
        }
        if self.progress and self.world.is_main:
            print(f"epoch {epoch + 1}/{self.epochs}: loss {record['train_loss']:.4f}, lr {timed['lr']:.3g}, "
                  f"{seconds:.1f} s, {record['tokens_per_s']:.0f} tokens/s", file=sys.stderr)
        return EpochEnd(record, stop=self.step >= self.total_steps)

    def preserved_state(self):
        from darel.measure import preserved_training_state

        return preserved_training_state(self.model, self.optimizer, self.train_step, self.device)

    def state_dict(self) -> dict:
        rng = distributed.all_gather_object(_rng_state(self.device), self.world)  # every process's random state
        return {"trainable": {n: p.detach().cpu() for n, p in self.model.named_parameters() if p.requires_grad},
                "optimizer": self.optimizer.state_dict(),
                "train_step": self.train_step.state_dict(), "rng": rng, "step": self.step,
                "tokens_trained": self.tokens_trained, "target_tokens": self.target_tokens}

    def load_state_dict(self, state: dict) -> None:
        trainable = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, value in state["trainable"].items():
                trainable[name].copy_(value.to(self.device))
        self.optimizer.load_state_dict(state["optimizer"])
        self.train_step.load_state_dict(state["train_step"])
        _set_rng_state(state["rng"][self.world.rank], self.device)
        self.step = state["step"]
        self.tokens_trained, self.target_tokens = state["tokens_trained"], state["target_tokens"]


def _check_settings(encoded: Sequence[EncodedPair], epochs: int, batch_size: int, warmup_steps: int,
                    label_smoothing: float, max_steps: int | None, memory_count: str) -> None:
    """One line naming the first bad setting of finetune_encoded, before any work."""
    if not encoded:
        raise ValueError("finetune needs at least one training pair")
    for name, value in (("epochs", epochs), ("batch_size", batch_size)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if not isinstance(warmup_steps, int) or warmup_steps < 0:
        raise ValueError(f"warmup_steps must be a non-negative integer, got {warmup_steps!r}")
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing must lie in [0, 1), got {label_smoothing!r}")
    if max_steps is not None and (not isinstance(max_steps, int) or max_steps < 1):
        raise ValueError(f"max_steps must be a positive integer or None, got {max_steps!r}")
    if memory_count not in MEMORY_COUNTS:
        raise ValueError(f"memory_count must be one of {MEMORY_COUNTS}, got {memory_count!r}")


def _history(result, body: _LoraEpochs, memory, work, n_pairs: int) -> dict:
    """What finetune_encoded returns: the curves of run_epochs' ``result``, its time, energy
    and memory, and the run's counts."""
    history: dict = {key: result.curves.get(key, []) for key in ("train_loss", "lr", "epoch_time_s", "tokens_per_s",
                                                                  "steps_per_epoch")}
    if result.energy is not None:
        history["energy"] = result.energy
        history["energy_covers"] = result.energy.get("energy_covers")
    history.update(
        {
            "total_time_s": result.time_s,
            "time_s": result.time_s,  # the same value under the name the workflow stages read
            "wall_time_s": result.wall_time_s,
            "clock": work.clock_name,
            "tokens_trained": body.tokens_trained,  # non-padding tokens through forward + backward
            "target_tokens": body.target_tokens,  # tokens under the loss
            "steps": body.step,
            "epochs_completed": len(history["train_loss"]),
            "n_pairs": n_pairs,
            "resumed_from_epoch": result.resumed_from_epoch,  # None: one uninterrupted run
            "peak_mem_bytes": result.peak_mem_bytes,  # this process's device
            "memory_source": memory.source,
            "nvml_peak_bytes": memory.nvml_peak_bytes,
            "nvml_status": memory.nvml_status,
            "process_peak_rss_bytes": memory.rss_peak_bytes,
        }
    )
    return history


def finetune_encoded(model: torch.nn.Module, encoded: Sequence[EncodedPair], pad_token_id: int, *, epochs: int,
                     batch_size: int, lr: float, betas: tuple[float, float], weight_decay: float, warmup_steps: int,
                     label_smoothing: float, device: str | torch.device, seed: int, precision: str = "fp32",
                     progress: bool = True, on_epoch_end: Callable[[int, dict], None] | None = None,
                     max_steps: int | None = None, checkpoint_path: str | os.PathLike | None = None, energy=None,
                     fingerprint_extra: dict | None = None, memory_count: str = "deferred") -> dict:
    """The training loop of ``finetune`` on already encoded pairs (see there).
    ``memory_count``: "deferred" (on a CPU, the undominated shapes counted after each
    epoch's interval) or "in_place" (every step counted where it runs: the reference)."""
    from darel.measure import StepMemoryMeter, TimedWork

    device = _device(device)
    precision = resolve_precision(precision, device)
    _check_settings(encoded, epochs, batch_size, warmup_steps, label_smoothing, max_steps, memory_count)

    world = distributed.current(device)
    if batch_size % world.size:
        raise ValueError(f"batch_size={batch_size} (the global batch) does not split over {world.size} processes")
    # Dropout masks (LoRA and GPT-2) come from torch's default generator (nn.Dropout takes
    # none), seeded at the start of every call, so they depend on (seed, rank) alone; rank 0
    # draws what a single process would. A resumed run restores the state it saved.
    torch.manual_seed(seed + world.rank)
    model.to(device).train()
    params = [param for param in model.parameters() if param.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters (call add_lora first?)")
    target_counts = [len(ids) - prompt_len for ids, prompt_len in encoded]
    # No loss: the filler of a process whose share of a short last batch is empty.
    filler: EncodedPair = ([pad_token_id, pad_token_id], 2)
    steps_per_epoch = math.ceil(len(encoded) / batch_size)
    total_steps = epochs * steps_per_epoch if max_steps is None else min(max_steps, epochs * steps_per_epoch)
    # Before the frozen base changes dtype: what a resumed run must match.
    fingerprint = None if checkpoint_path is None else _run_fingerprint(
        model, encoded, world.size, epochs=epochs, batch_size=batch_size, lr=lr, betas=list(betas),
        weight_decay=weight_decay, warmup_steps=warmup_steps, label_smoothing=label_smoothing, seed=seed,
        precision=precision, max_steps=max_steps, extra=fingerprint_extra or {})
    hold_frozen_in_half(model, precision, device)
    # Under torchrun every process takes every world.size-th pair of each global batch;
    # DDP averages the gradients, and the loss is scaled so that the average equals the
    # single-process gradient of the global batch's token mean.
    loss_module = TargetLoss(model)
    forward_module = loss_module
    if world.is_distributed:
        forward_module = torch.nn.parallel.DistributedDataParallel(
            loss_module, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = adamw(params, lr=lr, betas=tuple(betas), weight_decay=weight_decay, device=device)
    rate = LrSchedule("warmup_linear", lr, warmup_steps=warmup_steps, total_steps=total_steps)
    # The project's one training step: assembly, forward + loss under the precision,
    # backward, (scaled) optimiser step.
    train_step = TrainStep(model, optimizer, device=device, precision=precision,
                           assemble=lambda pairs, count: _assemble(pairs, pad_token_id, device, count),
                           loss_fn=_loss_fn(label_smoothing, world.size), forward_module=forward_module)
    # The memory definition of Table 1: torch's peak per step (+ NVML) on a GPU, tensor
    # accounting on CPU.
    memory = StepMemoryMeter(model, optimizer, device)
    body = _LoraEpochs(model=model, encoded=encoded, target_counts=target_counts, filler=filler,
                       batch_size=batch_size, seed=seed, total_steps=total_steps, world=world, optimizer=optimizer,
                       rate=rate, train_step=train_step, memory=memory, device=device,
                       defer_count=(device.type == "cpu" and not world.is_distributed and memory_count == "deferred"),
                       progress=progress, epochs=epochs)
    # Time and energy over the same intervals (each epoch's steps; checkpoint writes in neither).
    work = TimedWork(energy if world.is_main else None, device)

    def report(epoch: int, record: dict) -> None:  # the figures the live MLflow run has always received
        on_epoch_end(epoch, {"epoch": epoch, **{k: v for k, v in record.items() if k != "steps_per_epoch"},
                             "steps": record["steps_per_epoch"]})

    result = run_epochs(body, epochs=epochs, work=work, meter=memory, energy=energy if world.is_main else None,
                        checkpoint=checkpoint_path, fingerprint=fingerprint,
                        say=lambda line: print(line, file=sys.stderr), world=world,
                        gather=lambda obj: distributed.all_gather_object(obj, world),
                        on_epoch_end=report if on_epoch_end is not None else None)
    return _history(result, body, memory, work, len(encoded))


def _run_fingerprint(model: torch.nn.Module, encoded: Sequence[EncodedPair], world_size: int, **settings) -> dict:
    """What a checkpoint must match to be resumed: the settings, the process count, the
    exact training pairs and the frozen base weights (sha256 of their names, dtypes,
    shapes and bytes)."""
    import hashlib

    data = hashlib.sha256()
    for ids, prompt_length in encoded:
        data.update(np.asarray(ids + [prompt_length, -1], dtype=np.int64).tobytes())
    base = hashlib.sha256()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if not param.requires_grad:
                base.update(f"{name}:{param.dtype}:{tuple(param.shape)}".encode())
                base.update(param.detach().cpu().reshape(-1).view(torch.uint8).numpy().tobytes())

    def plain(value):  # sets (e.g. target_modules) in a fixed order: the fingerprint must not vary by process
        if isinstance(value, (set, frozenset)):
            return sorted(plain(v) for v in value)
        if isinstance(value, dict):
            return {str(k): plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        return value if isinstance(value, (int, float, str, bool, type(None))) else str(value)

    adapter = {name: plain(config.to_dict()) for name, config in sorted(getattr(model, "peft_config", {}).items())}
    # In plain JSON values only (no enums of peft's): checkpoints hold tensors and plain values.
    return json.loads(json.dumps({**settings, "world_size": world_size, "pairs_sha256": data.hexdigest(),
                                  "base_sha256": base.hexdigest(), "adapter": adapter}, sort_keys=True, default=str))


def _rng_state(device: torch.device) -> dict:
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def finetune(
    model: torch.nn.Module,
    tokenizer,
    pairs: Sequence[tuple[str, str]],
    *,
    max_length: int,
    truncate: bool = False,
    **training,
) -> dict:
    """Fine-tune the trainable parameters (the LoRA adapters after ``add_lora``) on
    (source, target) pairs, encoded with ``max_length`` / ``truncate``; ``training`` are
    the keyword arguments of ``finetune_encoded`` (epochs, batch_size, lr, betas,
    weight_decay, warmup_steps, label_smoothing, device, seed, precision, ...). The
    paper's protocol: AdamW (fused on a GPU), linear warm-up for ``warmup_steps`` then
    linear decay to zero at the last step, label-smoothed cross-entropy on target
    tokens (token mean per batch; the LM head runs on the target positions only,
    ``TargetLoss``). Every step is ``darel.step.TrainStep`` under ``precision``
    (``fp32``, ``fp16`` = autocast + GradScaler as in the paper, ``bf16``, or ``auto``
    = bf16 where the GPU supports it; always float32 on a CPU); under fp16/bf16 the
    frozen base is held in that dtype on the GPU. Each epoch visits the pairs in an order drawn from a
    generator seeded by (seed, epoch). ``max_steps`` stops early (benchmarks, tests).
    With ``checkpoint_path`` the trainable weights, optimiser, loss scaler,
    random state and curves are written there after every epoch (checkpoint writes are
    not counted as training time), and a later call with the same settings, pairs and
    base weights resumes after the last saved epoch with the same result as an
    uninterrupted run; a checkpoint of another run is ignored with a warning.

    Returns per-epoch curves (train_loss, lr, epoch_time_s, tokens_per_s,
    steps_per_epoch) and total_time_s (also as time_s), tokens_trained,
    target_tokens, steps, epochs_completed, n_pairs, and the peak memory of a step as
    Table 1 measures it (``darel.measure.StepMemoryMeter``: peak_mem_bytes,
    memory_source, nvml_peak_bytes, nvml_status, process_peak_rss_bytes).
    """
    encoded = encode_pair_ids(tokenizer, pairs, max_length, truncate)
    return finetune_encoded(model, encoded, _pad_token_id(tokenizer), **training)
