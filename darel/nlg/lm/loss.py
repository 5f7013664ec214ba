"""The loss on target positions only (the LM head runs there alone) and the per-sample
LM loss that ranks pairs for Algorithm 2 without classes."""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from darel.step import autocast, half_dtype, resolve_precision
from darel.nlg.lm.encoding import IGNORE_INDEX, _pad_token_id, collate_pairs, encode_pair_ids
from darel.nlg.lm.model import _model_max_positions


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
