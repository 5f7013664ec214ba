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
import json
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
from darel.step import TrainStep, adamw, autocast, half_dtype, resolve_precision

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
        # safetensors only: a pickled checkpoint (.bin) is never loaded.
        return AutoModelForCausalLM.from_pretrained(config_or_name, dtype=torch.float32, revision=revision,
                                                    use_safetensors=True)
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
                f"pair {index} (source {_excerpt(source)}): source takes {len(prompt)} tokens with the separator, "
                f"leaving no room for the target within max_length={max_length}"
            )
        target_ids = _text_ids(tokenizer, " " + target.strip()) + [end_id]
        ids = prompt + target_ids
        if len(ids) > max_length:
            if not truncate:
                raise ValueError(
                    f"pair {index} (source {_excerpt(source)}): source + target take {len(ids)} tokens, more than "
                    f"max_length={max_length} (pass truncate=True to cut the target)"
                )
            ids = ids[:max_length]
        encoded.append((ids, len(prompt)))
    return encoded


def _excerpt(text: str, limit: int = 80) -> str:
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


def derive_lengths(tokenizer, pairs: Sequence[tuple[str, str]], sources: Sequence[str], max_new_tokens: int) -> dict:
    """Sequence settings that the data cannot exceed: ``max_length`` = the longest
    encoded training pair (source, separator, target, end of text), ``n_positions`` =
    that, or the longest prompt to decode plus ``max_new_tokens`` if longer."""
    if not pairs:
        raise ValueError("derive_lengths needs at least one training pair")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    end = 1  # the end-of-text token after the target
    longest_pair = max(len(prompt_ids(tokenizer, s)) + len(_text_ids(tokenizer, " " + t.strip())) + end
                       for s, t in pairs)
    longest_prompt = max((len(prompt_ids(tokenizer, s)) for s in sources), default=0)
    return {"max_length": longest_pair, "longest_prompt": longest_prompt, "max_new_tokens": max_new_tokens,
            "n_positions": max(longest_pair, longest_prompt + max_new_tokens)}


def read_lengths(tokenizer_dir: str | os.PathLike) -> dict:
    """The ``derive_lengths`` record the tokenizer stage wrote beside the tokenizer."""
    import json

    path = Path(tokenizer_dir) / "lengths.json"
    if not path.is_file():
        raise ValueError(f"{path}: missing (the tokenizer stage writes it; rerun it)")
    record = json.loads(path.read_text(encoding="utf-8"))
    return {key: value for key, value in record.items() if key not in ("files_sha256", "record_sha256")}


def max_length_of(finetune: dict, tokenizer_dir: str | os.PathLike) -> int:
    """``finetune.max_length``, or with ``auto`` the longest encoded training pair."""
    value = finetune["max_length"]
    return read_lengths(tokenizer_dir)["max_length"] if value == "auto" else value


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


def target_positions(labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat indices (into batch x length) of the positions whose next token is under the
    loss, and those next tokens: position p of a row predicts token p + 1."""
    following = labels[:, 1:]
    rows, cols = (following != IGNORE_INDEX).nonzero(as_tuple=True)
    return rows * labels.shape[1] + cols, following[rows, cols]


class TargetLoss(torch.nn.Module):
    """Next-token cross-entropy on the target positions only.

    The transformer runs on the whole batch, but the LM head (and the float32 copy of
    its logits that the loss needs) only on the hidden states of the positions whose
    next token carries a loss: never on the prompt or the padding. ``forward`` returns
    the per-target losses (``reduction='none'``) or their sum. Half-precision logits are
    cast to float32 for the loss; float32/float64 ones are used as they are.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        backbone = getattr(base, getattr(base, "base_model_prefix", ""), None)
        head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
        if backbone is None or head is None:
            raise ValueError(f"{type(base).__name__}: expected a causal LM with a transformer body and an LM head")
        # Plain attributes, not submodules: their parameters are the model's, registered once.
        self.__dict__["_parts"] = (backbone, head)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor,
                targets: torch.Tensor, label_smoothing: float = 0.0, reduction: str = "sum") -> torch.Tensor:
        backbone, head = self._parts
        hidden = backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        logits = head(hidden.reshape(-1, hidden.shape[-1]).index_select(0, positions))
        if logits.dtype in (torch.float16, torch.bfloat16):
            logits = logits.float()
        return F.cross_entropy(logits, targets, label_smoothing=label_smoothing, reduction=reduction)


def _shifted_token_losses(logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float) -> torch.Tensor:
    """Per-position cross-entropy of next-token prediction from full logits (0 where
    labels are -100): the straightforward computation, kept as the reference."""
    shift_logits = logits[:, :-1, :]
    if shift_logits.dtype in (torch.float16, torch.bfloat16):
        shift_logits = shift_logits.float()
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


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def hold_frozen_in_half(model: torch.nn.Module, precision: str, device: torch.device | str) -> None:
    """On a GPU under fp16/bf16, store the frozen (non-trainable) weights in that dtype,
    so autocast does not re-cast the float32 base on every forward; the trainable LoRA
    weights stay float32 (the optimiser's master weights). A no-op on CPU / fp32."""
    dtype = half_dtype(resolve_precision(precision, device))
    if dtype is None:
        return
    with torch.no_grad():
        for param in model.parameters():
            if not param.requires_grad and param.is_floating_point() and param.dtype != dtype:
                param.data = param.data.to(dtype)


def next_batch_size(current: int, base_bytes: int, peak_bytes: int, budget_bytes: int, remaining: int) -> int:
    """The next chunk's size, from what the last chunk of ``current`` items used: its
    peak over the memory held before it (``base_bytes``) gives the memory per item, and
    the next chunk holds as many as fit ``budget_bytes`` (items come longest first, so a
    later item needs no more), at most twice ``current`` and at most ``remaining``."""
    per_item = max(peak_bytes - base_bytes, 1) / current
    fits = int((budget_bytes - base_bytes) // per_item)
    return max(1, min(2 * current, fits, remaining))


def _batched(order: list[int], work: Callable[[list[int]], None], *, batch_size: int,
             memory_budget: int | None, device: torch.device) -> list[int]:
    """Run ``work`` on consecutive chunks of ``order``. Without a memory budget, or off
    a GPU, every chunk has ``batch_size`` items; with one, the first has ``batch_size``
    and the next ones grow to the largest that fits the budget (``next_batch_size``).
    Returns the chunk sizes used."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    adaptive = memory_budget is not None and device.type == "cuda"
    sizes, start, size = [], 0, batch_size
    while start < len(order):
        chunk = order[start:start + size]
        if adaptive:
            base = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
        work(chunk)
        sizes.append(len(chunk))
        start += len(chunk)
        if adaptive and start < len(order):
            size = next_batch_size(len(chunk), base, torch.cuda.max_memory_allocated(device), int(memory_budget),
                                   len(order) - start)
    return sizes


@torch.no_grad()
def per_sample_lm_loss(
    model: torch.nn.Module,
    tokenizer,
    pairs: Sequence[tuple[str, str]],
    batch_size: int = 8,
    device: str | torch.device = "cpu",
    max_length: int | None = None,
    precision: str = "fp32",
    memory_budget: int | None = None,
) -> np.ndarray:
    """Mean token cross-entropy of each target given its source (eval mode, no label
    smoothing): Algorithm 2's offline score for the language tasks. Pairs are batched
    longest first (``_batched``: ``batch_size``, growing to fill ``memory_budget``
    bytes on a GPU); the result is in the order of ``pairs``."""
    device = _device(device)
    precision = resolve_precision(precision, device)
    max_length = max_length or _model_max_positions(model)
    if max_length is None:
        raise ValueError("max_length not given and the model config has no n_positions")
    encoded = encode_pair_ids(tokenizer, pairs, max_length)
    pad_id = _pad_token_id(tokenizer)
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i][0]), reverse=True)
    scores = np.empty(len(encoded), dtype=np.float64)
    was_training = model.training
    model.to(device).eval()
    hold_frozen_in_half(model, precision, device)
    loss_module = TargetLoss(model)

    def work(chunk: list[int]) -> None:
        batch = collate_pairs([encoded[i] for i in chunk], pad_id)
        positions, targets = target_positions(batch["labels"])
        width = batch["labels"].shape[1]
        with autocast(device, precision):
            losses = loss_module(batch["input_ids"].to(device), batch["attention_mask"].to(device),
                                 positions.to(device), targets.to(device), reduction="none")
        rows = (positions // width).to(device)
        sums = torch.zeros(len(chunk), dtype=torch.float64, device=device).index_add_(0, rows, losses.double())
        counts = torch.bincount(rows, minlength=len(chunk)).double()
        scores[chunk] = (sums / counts).cpu().numpy()

    try:
        _batched(order, work, batch_size=batch_size, memory_budget=memory_budget, device=device)
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
    optimizer = adamw(params, lr=lr, betas=(0.9, 0.999), weight_decay=weight_decay, device=device)
    steps_per_epoch = math.ceil(len(encoded) / batch_size)
    total_steps = epochs * steps_per_epoch
    scheduler = get_linear_schedule_with_warmup(optimizer, max(1, total_steps // 20), total_steps)
    # The project's one training step, in float32 (the quick profile runs on a CPU).
    train_step = TrainStep(model, optimizer, device=device, precision="fp32",
                           assemble=lambda pairs, count: _assemble(pairs, pad_id, device, count),
                           loss_fn=_loss_fn(0.0, 1), forward_module=TargetLoss(model))
    curve: list[float] = []
    start = time.perf_counter()
    for epoch in range(epochs):
        order = _epoch_order(len(encoded), seed, epoch).tolist()
        loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        token_count = 0
        for first in range(0, len(order), batch_size):
            pairs = [encoded[i] for i in order[first : first + batch_size]]
            # the loss is the token mean of the batch: pass the batch's target count
            count = sum(len(ids) - 1 for ids, _ in pairs)
            loss_sum += train_step(pairs, count).double()
            scheduler.step()
            token_count += count
        curve.append(float(loss_sum) / token_count)
    _sync(device)
    return {"train_loss": curve, "epochs": epochs, "steps": total_steps, "time_s": time.perf_counter() - start}


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


# The reference for the CPU memory count: every step counted where it runs (tests compare).
COUNT_EVERY_STEP_IN_PLACE = False


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
    precision: str = "fp32",
    progress: bool = True,
    on_epoch_end: Callable[[int, dict], None] | None = None,
    max_steps: int | None = None,
    checkpoint_path: str | os.PathLike | None = None,
    energy=None,
    fingerprint_extra: dict | None = None,
) -> dict:
    """The training loop of ``finetune`` on already encoded pairs (see there)."""
    from darel.measure import StepMemoryMeter, TimedWork, preserved_training_state

    device = _device(device)
    precision = resolve_precision(precision, device)
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
    target_counts = [len(ids) - prompt_len for ids, prompt_len in encoded]
    filler: EncodedPair = ([pad_token_id, pad_token_id], 2)  # no loss: a process whose share of a short last batch is empty
    steps_per_epoch = math.ceil(len(encoded) / batch_size)
    total_steps = epochs * steps_per_epoch if max_steps is None else min(max_steps, epochs * steps_per_epoch)
    checkpoint = Path(checkpoint_path) if checkpoint_path else None
    # Before the frozen base changes dtype: what a resumed run must match.
    fingerprint = None if checkpoint is None else _run_fingerprint(
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
    scheduler = get_linear_schedule_with_warmup(optimizer, warmup_steps, total_steps)
    # The project's one training step: assembly, forward + loss under the precision,
    # backward, (scaled) optimiser step.
    train_step = TrainStep(model, optimizer, device=device, precision=precision,
                           assemble=lambda pairs, count: _assemble(pairs, pad_token_id, device, count),
                           loss_fn=_loss_fn(label_smoothing, world.size), forward_module=forward_module)
    # The memory definition of Table 1: torch's peak per step (+ NVML) on a GPU, tensor
    # accounting on CPU.
    memory = StepMemoryMeter(model, optimizer, device)
    # On a CPU the meter counts live tensors with Python work per operator: counting every
    # step inside the clock doubled a small model's measured time. A step's count depends
    # only on its padded shape and grows with rows and with width, so only a shape that no
    # counted shape dominates is counted, replayed after the epoch's timed interval with
    # the training state put back. Under torchrun every process keeps counting in place:
    # replays that differ between processes would pair up the wrong collectives.
    defer_count = device.type == "cpu" and not world.is_distributed and not COUNT_EVERY_STEP_IN_PLACE
    counted_shapes: list[tuple[int, int]] = []

    def metered(pairs: list[EncodedPair], count: int) -> contextlib.AbstractContextManager:
        if not defer_count:
            return memory.step()
        rows, width = len(pairs), max(len(ids) for ids, _ in pairs)
        if any(r >= rows and w >= width for r, w in counted_shapes):
            return contextlib.nullcontext()
        counted_shapes.append((rows, width))
        return memory.step(key=(rows, width), replay=lambda: train_step(pairs, count))

    history: dict = {"train_loss": [], "lr": [], "epoch_time_s": [], "tokens_per_s": [], "steps_per_epoch": []}
    tokens_trained = target_tokens = step = first_epoch = 0
    peak_before, resumed_from = 0, None
    # Time and energy over the same intervals (each epoch's steps; checkpoint writes in neither).
    work = TimedWork(energy if world.is_main else None, device)
    saved = None
    if checkpoint is not None:
        from darel import checkpoint as checkpoints

        # Process 0 verifies (and sets aside what it cannot trust); the others read the file it chose.
        if world.is_main:
            saved = checkpoints.load(checkpoint, fingerprint, lambda line: print(f"checkpoint {checkpoint}: {line}",
                                                                                   file=sys.stderr))
        chosen = distributed.all_gather_object(None if saved is None else saved["checkpoint_file"], world)[0]
        if saved is None and chosen is not None:
            saved = checkpoints.loads(Path(chosen).read_bytes())
        if saved is not None:
            trainable = dict(model.named_parameters())
            with torch.no_grad():
                for name, value in saved["trainable"].items():
                    trainable[name].copy_(value.to(device))
            optimizer.load_state_dict(saved["optimizer"])
            scheduler.load_state_dict(saved["scheduler"])
            train_step.load_state_dict(saved["train_step"])
            _set_rng_state(saved["rng"][world.rank], device)
            history, step, first_epoch = saved["history"], saved["step"], saved["epoch"]
            tokens_trained, target_tokens = saved["tokens_trained"], saved["target_tokens"]
            peak_before, resumed_from = saved["peak_mem_bytes"], first_epoch
            work.load_state_dict(saved["work"])
            if world.is_main:
                print(f"resumed at epoch {first_epoch} ({work.time_s:.1f} s already trained)", file=sys.stderr)
    for epoch in range(first_epoch, epochs):
        if step >= total_steps:
            break
        with work.interval():
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
                last_lr = scheduler.get_last_lr()[0]  # the rate this step uses
                with metered(mine, global_count):
                    loss_total = train_step(mine, global_count)
                scheduler.step()
                loss_sum += loss_total.double()
                # Known from the encoded pairs (the filler counts nothing).
                epoch_targets += sum(target_counts[i] for i in mine_indices)
                epoch_tokens += sum(len(encoded[i][0]) for i in mine_indices)
                epoch_steps += 1
                step += 1
            loss_sum, epoch_targets, epoch_tokens = distributed.all_reduce(
                [float(loss_sum), epoch_targets, epoch_tokens], world)
        memory.flush(around=lambda: preserved_training_state(model, optimizer, train_step, device))
        epoch_targets, epoch_tokens = int(epoch_targets), int(epoch_tokens)
        elapsed = work.last_interval_s
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
            rng = distributed.all_gather_object(_rng_state(device), world)
            if world.is_main:
                checkpoints.save(checkpoint, {
                    "fingerprint": fingerprint, "epoch": epoch + 1, "step": step, "history": history,
                    "trainable": {n: p.detach().cpu() for n, p in model.named_parameters() if p.requires_grad},
                    "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                    "train_step": train_step.state_dict(), "rng": rng, "tokens_trained": tokens_trained,
                    "target_tokens": target_tokens, "peak_mem_bytes": max(peak_before, memory.peak_bytes),
                    # training time and energy so far (all segments), without checkpoint writes
                    "work": work.state_dict(),
                })
        if on_epoch_end is not None:
            on_epoch_end(epoch, record)
    total_time = work.time_s
    if energy is not None and world.is_main:
        history["energy"] = work.energy_record(energy.stop(), energy.pue)
        history["energy_covers"] = history["energy"].get("energy_covers")
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
    precision: str = "fp32",
    memory_budget: int | None = None,
) -> list[list[int]]:
    """Beam search from token-id prompts; returns only the new ids of each prompt.

    Prompts are left-padded (generation appends on the right) and batched longest
    first: ``batch_size`` prompts per batch, or on a GPU with ``memory_budget`` (bytes,
    e.g. the fine-tuning's measured peak) batches that grow to the largest that fits it
    (``next_batch_size``). The model's position ids follow the attention mask, so
    padding does not shift them, and the outputs do not depend on the batching.
    """
    device = _device(device)
    precision = resolve_precision(precision, device)
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
    hold_frozen_in_half(model, precision, device)

    def work(chunk: list[int]) -> None:
        width = max(len(prompts[i]) for i in chunk)
        input_ids = torch.full((len(chunk), width), pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for row, i in enumerate(chunk):
            input_ids[row, width - len(prompts[i]) :] = torch.tensor(prompts[i], dtype=torch.long)
            attention_mask[row, width - len(prompts[i]) :] = 1
        with autocast(device, precision):
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

    try:
        _batched(order, work, batch_size=batch_size, memory_budget=memory_budget, device=device)
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
    precision: str = "fp32",
    memory_budget: int | None = None,
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
        precision=precision,
        memory_budget=memory_budget,
    )
    texts = [tokenizer.decode(ids, skip_special_tokens=True).strip() for ids in new_ids]
    return texts, [len(ids) >= max_new_tokens for ids in new_ids]
