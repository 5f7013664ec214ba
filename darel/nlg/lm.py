"""GPT-2 + LoRA for data-to-text: encoding, fine-tuning, decoding and per-sample loss.

Sequence layout (the GPT-2 LoRA recipe's): ``source tokens, separator, " " + target
tokens, end of text``. The separator is the tokenizer's ``sep_token`` when it has one
(the locally trained tokenizer) and otherwise its beginning-of-text token, which for
pretrained GPT-2 is ``<|endoftext|>`` - what the LoRA authors put after the context.
The loss covers the target tokens and the final end-of-text only: source, separator and
padding carry the label -100.

Nothing here truncates a reference silently: a pair that does not fit ``max_length``
is an error unless the caller passes ``truncate=True``.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, GPT2Config, PretrainedConfig, get_linear_schedule_with_warmup
from transformers.pytorch_utils import Conv1D

from darel import distributed

IGNORE_INDEX = -100

# (token ids, number of leading ids that are source + separator)
EncodedPair = tuple[list[int], int]


# ---------------------------------------------------------------------------
# Models


def tiny_gpt2_config(
    vocab_size: int,
    n_positions: int = 128,
    n_embd: int = 64,
    n_layer: int = 2,
    n_head: int = 2,
    eos_token_id: int | None = None,
    pad_token_id: int | None = None,
) -> GPT2Config:
    """A small GPT-2 configuration for the quick profile and tests."""
    for name, value in (("vocab_size", vocab_size), ("n_positions", n_positions), ("n_embd", n_embd),
                        ("n_layer", n_layer), ("n_head", n_head)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if n_embd % n_head:
        raise ValueError(f"n_embd={n_embd} must be divisible by n_head={n_head}")
    return GPT2Config(
        vocab_size=vocab_size,
        n_positions=n_positions,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        # GPT-2's end-of-text doubles as beginning-of-text.
        bos_token_id=eos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
    )


def resolve_hub_revision(name: str, revision: str | None = None) -> str | None:
    """The commit hash that a hub model name (at ``revision``: branch, tag or commit;
    None for the default branch) points to now, so that a run can record it and a later
    run can pin it. None for a local folder, or when the hub cannot be reached (the
    loader then reports its own error or falls back to its cache)."""
    if Path(name).is_dir():
        return None
    from huggingface_hub import HfApi

    try:
        return HfApi().model_info(name, revision=revision).sha
    except Exception:  # offline, unknown repo: loading will say what is wrong
        return None


def build_lm(config_or_name: PretrainedConfig | str | os.PathLike, seed: int | None = None,
             revision: str | None = None) -> torch.nn.Module:
    """A causal LM: randomly initialised from a config, or loaded in float32 from a
    model name / local folder (``from_pretrained``, at ``revision`` for a hub name)."""
    if seed is not None:
        torch.manual_seed(seed)
    if isinstance(config_or_name, PretrainedConfig):
        return AutoModelForCausalLM.from_config(config_or_name)
    if isinstance(config_or_name, os.PathLike):
        config_or_name = os.fspath(config_or_name)
    if isinstance(config_or_name, str) and config_or_name:
        # float32 master weights; half precision comes from autocast during training.
        return AutoModelForCausalLM.from_pretrained(config_or_name, dtype=torch.float32, revision=revision)
    raise ValueError(f"expected a transformers config or a model name/folder, got {config_or_name!r}")


def load_with_adapter(model_dir: str | os.PathLike, adapter_dir: str | os.PathLike) -> torch.nn.Module:
    """A base model folder plus the LoRA adapter that ``save_pretrained`` wrote for it."""
    from peft import PeftModel

    adapter_dir = Path(adapter_dir)
    if not (adapter_dir / "adapter_config.json").is_file():
        raise ValueError(f"{adapter_dir}: no adapter_config.json (not a saved LoRA adapter)")
    base = build_lm(model_dir)
    with _without_peft_deprecation_warning():
        return PeftModel.from_pretrained(base, str(adapter_dir))


@contextlib.contextmanager
def _without_peft_deprecation_warning() -> Iterator[None]:
    # peft 0.21 still calls transformers' deprecated is_gradient_checkpointing.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


def _model_max_positions(model: torch.nn.Module) -> int | None:
    config = getattr(model, "config", None)
    return getattr(config, "n_positions", None) or getattr(config, "max_position_embeddings", None)


def add_lora(
    model: torch.nn.Module,
    r: int = 4,
    alpha: int = 32,
    dropout: float = 0.1,
    target_modules: Sequence[str] = ("c_attn",),
) -> torch.nn.Module:
    """Wrap ``model`` with LoRA adapters (peft) on ``target_modules``; everything else
    is frozen. GPT-2's projections are ``Conv1D`` (weights stored in x out), which peft
    must be told with ``fan_in_fan_out``."""
    from peft import LoraConfig, get_peft_model

    if not isinstance(r, int) or r < 1:
        raise ValueError(f"LoRA rank r must be a positive integer, got {r!r}")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"LoRA dropout must lie in [0, 1), got {dropout!r}")
    targets = list(target_modules)
    matched = [
        module for name, module in model.named_modules() if any(name.split(".")[-1] == target for target in targets)
    ]
    if not matched:
        raise ValueError(f"no module of the model is named any of target_modules={targets!r}")
    fan_in_fan_out = all(isinstance(module, Conv1D) for module in matched)
    config = LoraConfig(
        r=r,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=targets,
        fan_in_fan_out=fan_in_fan_out,
        bias="none",
        task_type="CAUSAL_LM",
    )
    with _without_peft_deprecation_warning():
        return get_peft_model(model, config)


def trainable_parameter_names(model: torch.nn.Module) -> list[str]:
    return [name for name, param in model.named_parameters() if param.requires_grad]


# ---------------------------------------------------------------------------
# Encoding


def separator_token_id(tokenizer) -> int:
    for token_id in (tokenizer.sep_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id):
        if token_id is not None:
            return int(token_id)
    raise ValueError("tokenizer has no sep, bos or eos token to mark where the target begins")


def _end_token_id(tokenizer) -> int:
    if tokenizer.eos_token_id is None:
        raise ValueError("tokenizer has no eos_token; the target needs an end-of-text token")
    return int(tokenizer.eos_token_id)


def _pad_token_id(tokenizer) -> int:
    # Pretrained GPT-2 has no padding token; padded positions are masked anyway.
    token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if token_id is None:
        raise ValueError("tokenizer has neither a pad_token nor an eos_token to pad with")
    return int(token_id)


def _text_ids(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def prompt_ids(tokenizer, source: str) -> list[int]:
    """The ids the model sees before it writes the target: source + separator."""
    return _text_ids(tokenizer, source) + [separator_token_id(tokenizer)]


def encode_pair_ids(
    tokenizer, pairs: Sequence[tuple[str, str]], max_length: int, truncate: bool = False
) -> list[EncodedPair]:
    """Token ids of each (source, target) pair and its prompt length, unpadded.

    A prompt that leaves no room for a target token is always an error; a target that
    runs past ``max_length`` is an error unless ``truncate`` (then it is cut, and its
    end-of-text may be lost)."""
    if not isinstance(max_length, int) or max_length < 2:
        raise ValueError(f"max_length must be an integer >= 2, got {max_length!r}")
    end_id = _end_token_id(tokenizer)
    encoded: list[EncodedPair] = []
    for index, (source, target) in enumerate(pairs):
        prompt = prompt_ids(tokenizer, source)
        if len(prompt) >= max_length:
            raise ValueError(
                f"pair {index}: source takes {len(prompt)} tokens with the separator, "
                f"leaving no room for the target within max_length={max_length}"
            )
        target_ids = _text_ids(tokenizer, " " + target.strip()) + [end_id]
        ids = prompt + target_ids
        if len(ids) > max_length:
            if not truncate:
                raise ValueError(
                    f"pair {index}: source + target take {len(ids)} tokens, more than max_length={max_length} "
                    "(pass truncate=True to cut the target)"
                )
            ids = ids[:max_length]
        encoded.append((ids, len(prompt)))
    return encoded


def collate_pairs(encoded: Sequence[EncodedPair], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-pad to the longest sequence; labels are -100 on the prompt and padding."""
    if not encoded:
        raise ValueError("cannot collate an empty batch")
    width = max(len(ids) for ids, _ in encoded)
    input_ids = torch.full((len(encoded), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(encoded), width), dtype=torch.long)
    labels = torch.full((len(encoded), width), IGNORE_INDEX, dtype=torch.long)
    for row, (ids, prompt_length) in enumerate(encoded):
        tokens = torch.tensor(ids, dtype=torch.long)
        input_ids[row, : len(ids)] = tokens
        attention_mask[row, : len(ids)] = 1
        labels[row, prompt_length : len(ids)] = tokens[prompt_length:]
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def encode_pairs(
    tokenizer, pairs: Sequence[tuple[str, str]], max_length: int, truncate: bool = False
) -> dict[str, torch.Tensor]:
    """``input_ids``, ``attention_mask`` and ``labels`` (loss on the target only) for
    ``pairs``, right-padded to the longest pair. See ``encode_pair_ids`` for errors."""
    return collate_pairs(encode_pair_ids(tokenizer, pairs, max_length, truncate), _pad_token_id(tokenizer))


def pair_texts(tokenizer, pairs: Sequence[tuple[str, str]]) -> list[str]:
    """Each pair as one text in the fine-tuning layout (for ``pretrain_lm``)."""
    separator = tokenizer.convert_ids_to_tokens(separator_token_id(tokenizer))
    return [f"{source}{separator} {target.strip()}" for source, target in pairs]


# ---------------------------------------------------------------------------
# Loss


def _shifted_token_losses(logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float) -> torch.Tensor:
    """Per-position cross-entropy of next-token prediction (0 where labels are -100)."""
    shift_logits = logits[:, :-1, :].float()
    shift_labels = labels[:, 1:]
    losses = F.cross_entropy(
        shift_logits.reshape(-1, shift_logits.shape[-1]),
        shift_labels.reshape(-1),
        ignore_index=IGNORE_INDEX,
        label_smoothing=label_smoothing,
        reduction="none",
    )
    return losses.view(shift_labels.shape)


def _device(device: str | torch.device) -> torch.device:
    return device if isinstance(device, torch.device) else torch.device(device)


def _check_amp(amp: bool, device: torch.device) -> None:
    if amp and device.type != "cuda":
        raise ValueError(f"amp (float16 autocast) needs a CUDA device, got device={device}")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def per_sample_lm_loss(
    model: torch.nn.Module,
    tokenizer,
    pairs: Sequence[tuple[str, str]],
    batch_size: int = 8,
    device: str | torch.device = "cpu",
    max_length: int | None = None,
    amp: bool = False,
) -> np.ndarray:
    """Mean token cross-entropy of each target given its source (eval mode, no label
    smoothing): Algorithm 2's offline score for the language tasks. Pairs are batched
    by length to save padding; the result is in the order of ``pairs``."""
    device = _device(device)
    _check_amp(amp, device)
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    max_length = max_length or _model_max_positions(model)
    if max_length is None:
        raise ValueError("max_length not given and the model config has no n_positions")
    encoded = encode_pair_ids(tokenizer, pairs, max_length)
    pad_id = _pad_token_id(tokenizer)
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i][0]), reverse=True)
    scores = np.empty(len(encoded), dtype=np.float64)
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            batch = {key: value.to(device) for key, value in collate_pairs([encoded[i] for i in chunk], pad_id).items()}
            with torch.autocast(device.type, dtype=torch.float16, enabled=amp):
                logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            losses = _shifted_token_losses(logits, batch["labels"], 0.0)
            counts = (batch["labels"][:, 1:] != IGNORE_INDEX).sum(dim=1)
            scores[chunk] = (losses.sum(dim=1) / counts).double().cpu().numpy()
    finally:
        model.train(was_training)
    return scores


# ---------------------------------------------------------------------------
# Training


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
    AdamW, linear warm-up over 5 % of the steps then linear decay."""
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

    torch.manual_seed(seed)
    model.to(device).train()
    params = [param for param in model.parameters() if param.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    steps_per_epoch = math.ceil(len(encoded) / batch_size)
    total_steps = epochs * steps_per_epoch
    scheduler = get_linear_schedule_with_warmup(optimizer, max(1, total_steps // 20), total_steps)
    curve: list[float] = []
    start = time.perf_counter()
    for epoch in range(epochs):
        order = _epoch_order(len(encoded), seed, epoch).tolist()
        loss_sum, token_count = 0.0, 0
        for first in range(0, len(order), batch_size):
            batch = collate_pairs([encoded[i] for i in order[first : first + batch_size]], pad_id)
            batch = {key: value.to(device) for key, value in batch.items()}
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            losses = _shifted_token_losses(logits, batch["labels"], 0.0)
            count = int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())
            loss = losses.sum() / count
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            loss_sum += float(loss.detach()) * count
            token_count += count
        curve.append(loss_sum / token_count)
    _sync(device)
    return {"train_loss": curve, "epochs": epochs, "steps": total_steps, "time_s": time.perf_counter() - start}


def finetune_encoded(
    model: torch.nn.Module,
    encoded: Sequence[EncodedPair],
    pad_token_id: int,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    betas: tuple[float, float],
    weight_decay: float,
    warmup_steps: int,
    label_smoothing: float,
    device: str | torch.device,
    seed: int,
    amp: bool,
    progress: bool = True,
    on_epoch_end: Callable[[int, dict], None] | None = None,
    max_steps: int | None = None,
    checkpoint_path: str | os.PathLike | None = None,
) -> dict:
    """The training loop of ``finetune`` on already encoded pairs (see there)."""
    from darel.measure import StepMemoryMeter

    device = _device(device)
    _check_amp(amp, device)
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

    world = distributed.current(device)
    if batch_size % world.size:
        raise ValueError(f"batch_size={batch_size} (the global batch) does not split over {world.size} processes")
    # Dropout masks (LoRA and GPT-2): rank 0 draws what a single process would.
    torch.manual_seed(seed + world.rank)
    model.to(device).train()
    params = [param for param in model.parameters() if param.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters (call add_lora first?)")
    # Under torchrun every process takes every world.size-th pair of each global batch;
    # DDP averages the gradients, and the loss below is scaled so that the average
    # equals the single-process gradient of the global batch's token mean.
    train_model = model
    if world.is_distributed:
        train_model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
    target_counts = [len(ids) - prompt_len for ids, prompt_len in encoded]
    filler: EncodedPair = ([pad_token_id, pad_token_id], 2)  # no loss: a process whose share of a short last batch is empty
    optimizer = torch.optim.AdamW(params, lr=lr, betas=tuple(betas), weight_decay=weight_decay)
    steps_per_epoch = math.ceil(len(encoded) / batch_size)
    total_steps = epochs * steps_per_epoch if max_steps is None else min(max_steps, epochs * steps_per_epoch)
    scheduler = get_linear_schedule_with_warmup(optimizer, warmup_steps, total_steps)
    scaler = torch.amp.GradScaler("cuda", enabled=amp)
    # The memory definition of Table 1: torch's peak per step (+ NVML) on a GPU, tensor
    # accounting on CPU.
    memory = StepMemoryMeter(model, optimizer, device)

    history: dict = {"train_loss": [], "lr": [], "epoch_time_s": [], "tokens_per_s": [], "steps_per_epoch": []}
    tokens_trained = target_tokens = step = first_epoch = 0
    time_before, peak_before, resumed_from = 0.0, 0, None
    checkpoint = Path(checkpoint_path) if checkpoint_path else None
    fingerprint = None if checkpoint is None else _run_fingerprint(
        model, encoded, world.size, epochs=epochs, batch_size=batch_size, lr=lr, betas=list(betas),
        weight_decay=weight_decay, warmup_steps=warmup_steps, label_smoothing=label_smoothing, seed=seed, amp=amp,
        max_steps=max_steps)
    if checkpoint is not None and checkpoint.exists():
        saved = torch.load(checkpoint, map_location="cpu", weights_only=False)
        if saved["fingerprint"] == fingerprint:
            trainable = dict(model.named_parameters())
            with torch.no_grad():
                for name, value in saved["trainable"].items():
                    trainable[name].copy_(value.to(device))
            optimizer.load_state_dict(saved["optimizer"])
            scheduler.load_state_dict(saved["scheduler"])
            scaler.load_state_dict(saved["scaler"])
            _set_rng_state(saved["rng"][world.rank], device)
            history, step, first_epoch = saved["history"], saved["step"], saved["epoch"]
            tokens_trained, target_tokens = saved["tokens_trained"], saved["target_tokens"]
            time_before, peak_before, resumed_from = saved["time_s"], saved["peak_mem_bytes"], first_epoch
            if world.is_main:
                print(f"resumed from {checkpoint} at epoch {first_epoch} ({time_before:.1f} s already trained)",
                      file=sys.stderr)
        elif world.is_main:
            warnings.warn(f"ignoring checkpoint {checkpoint}: it belongs to another run (data, base model or "
                          "settings differ)", stacklevel=2)
    checkpoint_s = 0.0  # checkpoint writes are not training time
    run_start = time.perf_counter()
    for epoch in range(first_epoch, epochs):
        if step >= total_steps:
            break
        _sync(device)
        epoch_start = time.perf_counter()
        order = _epoch_order(len(encoded), seed, epoch).tolist()
        # Summed on the device and read once per epoch: no host sync inside the step loop.
        loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        epoch_targets = epoch_tokens = epoch_steps = 0
        last_lr = scheduler.get_last_lr()[0]
        for first in range(0, len(order), batch_size):
            if step >= total_steps:
                break
            global_batch = order[first : first + batch_size]
            global_count = sum(target_counts[i] for i in global_batch)
            mine_indices = global_batch[world.rank :: world.size]
            mine = [encoded[i] for i in mine_indices] or [filler]
            batch = collate_pairs(mine, pad_token_id)
            batch = {key: value.to(device, non_blocking=True) for key, value in batch.items()}
            with memory.step():
                with torch.autocast(device.type, dtype=torch.float16, enabled=amp):
                    logits = train_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
                losses = _shifted_token_losses(logits, batch["labels"], label_smoothing)
                loss_total = losses.sum()
                loss = loss_total * (world.size / max(global_count, 1))
                optimizer.zero_grad(set_to_none=True)
                scaler.scale(loss).backward()
                last_lr = scheduler.get_last_lr()[0]  # the rate this step uses
                scaler.step(optimizer)
                scaler.update()
            scheduler.step()
            loss_sum += loss_total.detach().double()
            # Known from the encoded pairs (the filler counts nothing).
            epoch_targets += sum(target_counts[i] for i in mine_indices)
            epoch_tokens += sum(len(encoded[i][0]) for i in mine_indices)
            epoch_steps += 1
            step += 1
        _sync(device)
        loss_sum, epoch_targets, epoch_tokens = distributed.all_reduce(
            [float(loss_sum), epoch_targets, epoch_tokens], world)
        epoch_targets, epoch_tokens = int(epoch_targets), int(epoch_tokens)
        elapsed = time.perf_counter() - epoch_start
        record = {
            "epoch": epoch,
            "train_loss": loss_sum / max(epoch_targets, 1),
            "lr": last_lr,
            "epoch_time_s": elapsed,
            "tokens_per_s": epoch_tokens / elapsed if elapsed > 0 else float("nan"),
            "steps": epoch_steps,
        }
        history["train_loss"].append(record["train_loss"])
        history["lr"].append(record["lr"])
        history["epoch_time_s"].append(elapsed)
        history["tokens_per_s"].append(record["tokens_per_s"])
        history["steps_per_epoch"].append(epoch_steps)
        tokens_trained += epoch_tokens
        target_tokens += epoch_targets
        if progress and world.is_main:
            print(
                f"epoch {epoch + 1}/{epochs}: loss {record['train_loss']:.4f}, lr {last_lr:.3g}, "
                f"{elapsed:.1f} s, {record['tokens_per_s']:.0f} tokens/s",
                file=sys.stderr,
            )
        if checkpoint is not None:
            write_start = time.perf_counter()
            rng = distributed.all_gather_object(_rng_state(device), world)
            if world.is_main:
                from darel.io import torch_save

                torch_save(checkpoint, {
                    "fingerprint": fingerprint, "epoch": epoch + 1, "step": step, "history": history,
                    "trainable": {n: p.detach().cpu() for n, p in model.named_parameters() if p.requires_grad},
                    "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                    "scaler": scaler.state_dict(), "rng": rng, "tokens_trained": tokens_trained,
                    "target_tokens": target_tokens, "peak_mem_bytes": max(peak_before, memory.peak_bytes),
                    # training time so far: earlier segments + this one, without checkpoint writes
                    "time_s": time_before + (write_start - run_start) - checkpoint_s,
                })
            checkpoint_s += time.perf_counter() - write_start
        if on_epoch_end is not None:
            on_epoch_end(epoch, record)
    total_time = time_before + time.perf_counter() - run_start - checkpoint_s
    history.update(
        {
            "total_time_s": total_time,
            "time_s": total_time,  # the same value under the name the workflow stages read
            "tokens_trained": tokens_trained,  # non-padding tokens through forward + backward
            "target_tokens": target_tokens,  # tokens under the loss
            "steps": step,
            "epochs_completed": len(history["train_loss"]),
            "n_pairs": len(encoded),
            "resumed_from_epoch": resumed_from,  # None: one uninterrupted run
            "peak_mem_bytes": max(peak_before, memory.peak_bytes),  # this process's device
            "memory_source": memory.source,
            "nvml_peak_bytes": memory.nvml_peak_bytes,
            "nvml_status": memory.nvml_status,
            "process_peak_rss_bytes": memory.rss_peak_bytes,
        }
    )
    return history


def _run_fingerprint(model: torch.nn.Module, encoded: Sequence[EncodedPair], world_size: int, **settings) -> dict:
    """What a checkpoint must match to be resumed: the settings, the process count, the
    exact training pairs and the frozen base weights (a cheap checksum of them)."""
    import hashlib

    data = hashlib.sha256()
    for ids, prompt_length in encoded:
        data.update(np.asarray(ids + [prompt_length, -1], dtype=np.int64).tobytes())
    with torch.no_grad():
        frozen = sum(float(p.double().sum()) for p in model.parameters() if not p.requires_grad)
    return {**settings, "world_size": world_size, "pairs_sha256": data.hexdigest(), "base_checksum": f"{frozen:.10e}"}


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
    weight_decay, warmup_steps, label_smoothing, device, seed, amp, ...). The paper's
    protocol: AdamW, linear warm-up for
    ``warmup_steps`` then linear decay to zero at the last step, label-smoothed
    cross-entropy on target tokens (token mean per batch), float16 autocast with loss
    scaling when ``amp``. Each epoch visits the pairs in an order drawn from a
    generator seeded by (seed, epoch). ``max_steps`` stops early (benchmarks, tests).
    With ``checkpoint_path`` the trainable weights, optimiser, schedule, loss scaler,
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


# ---------------------------------------------------------------------------
# Decoding


@torch.no_grad()
def generate_ids(
    model: torch.nn.Module,
    prompts: Sequence[list[int]],
    *,
    pad_token_id: int,
    eos_token_id: int,
    num_beams: int = 10,
    length_penalty: float = 0.9,
    no_repeat_ngram_size: int = 4,
    max_new_tokens: int = 64,
    batch_size: int = 8,
    device: str | torch.device = "cpu",
    amp: bool = False,
) -> list[list[int]]:
    """Beam search from token-id prompts; returns only the new ids of each prompt.

    Prompts are left-padded (generation appends on the right) and batched by length;
    the model's position ids follow the attention mask, so padding does not shift them.
    """
    device = _device(device)
    _check_amp(amp, device)
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    limit = _model_max_positions(model)
    for index, prompt in enumerate(prompts):
        if not prompt:
            raise ValueError(f"prompt {index} is empty")
        if limit is not None and len(prompt) + max_new_tokens > limit:
            raise ValueError(
                f"prompt {index} has {len(prompt)} tokens; with max_new_tokens={max_new_tokens} it exceeds "
                f"the model's {limit} positions"
            )
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]), reverse=True)
    outputs: list[list[int]] = [[] for _ in prompts]
    was_training = model.training
    model.to(device).eval()
    try:
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            width = max(len(prompts[i]) for i in chunk)
            input_ids = torch.full((len(chunk), width), pad_token_id, dtype=torch.long)
            attention_mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for row, i in enumerate(chunk):
                input_ids[row, width - len(prompts[i]) :] = torch.tensor(prompts[i], dtype=torch.long)
                attention_mask[row, width - len(prompts[i]) :] = 1
            with torch.autocast(device.type, dtype=torch.float16, enabled=amp):
                generated = model.generate(
                    input_ids=input_ids.to(device),
                    attention_mask=attention_mask.to(device),
                    num_beams=num_beams,
                    length_penalty=length_penalty,
                    no_repeat_ngram_size=no_repeat_ngram_size,
                    max_new_tokens=max_new_tokens,
                    do_sample=False,
                    eos_token_id=eos_token_id,
                    pad_token_id=pad_token_id,
                )
            for row, i in enumerate(chunk):
                new_ids = generated[row, width:].tolist()
                # Finished beams are padded; cut at the first end of text.
                if eos_token_id in new_ids:
                    new_ids = new_ids[: new_ids.index(eos_token_id)]
                outputs[i] = new_ids
    finally:
        model.train(was_training)
    return outputs


def generate(model: torch.nn.Module, tokenizer, sources: Sequence[str], **decoding) -> list[str]:
    """One beam-search output per source (the paper's decoding: 10 beams, length
    penalty 0.9; no_repeat_ngram_size 4 and 64 new tokens from the LoRA recipe),
    decoded from the new tokens only, special tokens dropped, whitespace stripped.
    ``decoding``: the keyword arguments of ``generate_with_cuts``."""
    return generate_with_cuts(model, tokenizer, sources, **decoding)[0]


def generate_with_cuts(
    model: torch.nn.Module,
    tokenizer,
    sources: Sequence[str],
    *,
    num_beams: int = 10,
    length_penalty: float = 0.9,
    no_repeat_ngram_size: int = 4,
    max_new_tokens: int = 64,
    batch_size: int = 8,
    device: str | torch.device = "cpu",
    amp: bool = False,
) -> tuple[list[str], list[bool]]:
    """``generate``'s outputs and, per output, whether it was cut: it used all
    ``max_new_tokens`` without emitting end of text, so it may stop mid-sentence."""
    prompts = [prompt_ids(tokenizer, source) for source in sources]
    new_ids = generate_ids(
        model,
        prompts,
        pad_token_id=_pad_token_id(tokenizer),
        eos_token_id=_end_token_id(tokenizer),
        num_beams=num_beams,
        length_penalty=length_penalty,
        no_repeat_ngram_size=no_repeat_ngram_size,
        max_new_tokens=max_new_tokens,
        batch_size=batch_size,
        device=device,
        amp=amp,
    )
    texts = [tokenizer.decode(ids, skip_special_tokens=True).strip() for ids in new_ids]
    return texts, [len(ids) >= max_new_tokens for ids in new_ids]
