"""Beam-search decoding with the paper's settings, batched to the memory the fine-tuning
measured, with the outputs cut at the new-token limit counted."""

from __future__ import annotations

from typing import Sequence

import torch

from darel.step import autocast, resolve_precision
from darel.nlg.lm.encoding import _end_token_id, _pad_token_id, prompt_ids
from darel.nlg.lm.loss import _batched, _device, hold_frozen_in_half
from darel.nlg.lm.model import _model_max_positions


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
    padding does not shift them: the batching changes only the rounding of the scores
    (a batch's width sets the shapes of its matrix products), and a changed output needs
    a near tie that the rounding flips (on the quick profile's 40 E2E-format test inputs,
    batches of 1, 5 and 8 give the same 40 outputs).

    Ties: the search is transformers' beam search (the pinned version), which ranks
    candidates with ``torch.topk``: the 2 x ``num_beams`` best (beam, token) continuations
    of every step, then the ``num_beams`` best of them that did not end, then the best
    finished hypotheses. Exactly equal scores come out in the order ``torch.topk`` returns
    them: always the same for the same scores, device, thread count and torch build (the
    stages run under torch's deterministic algorithms, on the profile's fixed threads),
    but not by index (on a CPU, the order its selection algorithm leaves). Another
    decoder matches this one token for token where it computes the same scores and
    breaks no tie differently; the quick profile's decoding above met no tie at any
    top-k boundary (8,568 ``torch.topk`` calls).
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
