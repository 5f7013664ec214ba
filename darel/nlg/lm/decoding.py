"""Beam-search decoding with the paper's settings, batched to the memory the fine-tuning
measured, with the outputs cut at the new-token limit counted."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from darel.step import autocast, resolve_precision
from darel.nlg.lm.encoding import _end_token_id, _pad_token_id, prompt_ids
from darel.nlg.lm.loss import _batched, _device, hold_frozen_in_half
from darel.nlg.lm.model import _model_max_positions


def _check_prompts(model: torch.nn.Module, prompts: Sequence[list[int]], max_new_tokens: int) -> None:
    limit = _model_max_positions(model)
    for index, prompt in enumerate(prompts):
        if not prompt:
            raise ValueError(f"prompt {index} is empty")
        if limit is not None and len(prompt) + max_new_tokens > limit:
            raise ValueError(
                f"prompt {index} has {len(prompt)} tokens; with max_new_tokens={max_new_tokens} it exceeds "
                f"the model's {limit} positions"
            )


@dataclass(frozen=True)
class DecodingSettings:
    """The keyword settings every decoder here takes, with their defaults in this one place:
    the search (the paper's 10 beams and length penalty 0.9; no_repeat_ngram_size 4 and 64
    new tokens from the LoRA recipe) and how it runs: ``batch_size`` prompts per batch, or
    on a GPU with ``memory_budget`` (bytes, e.g. the fine-tuning's measured peak) batches
    that grow to the largest that fits it (``next_batch_size``), on ``device`` in
    ``precision``. A keyword that is none of these is refused (TypeError naming it)."""

    num_beams: int = 10
    length_penalty: float = 0.9
    no_repeat_ngram_size: int = 4
    max_new_tokens: int = 64
    batch_size: int = 8
    device: str | torch.device = "cpu"
    precision: str = "fp32"
    memory_budget: int | None = None


@torch.no_grad()
def generate_ids(
    model: torch.nn.Module,
    prompts: Sequence[list[int]],
    *,
    pad_token_id: int,
    eos_token_id: int,
    **settings,
) -> list[list[int]]:
    """Beam search from token-id prompts; returns only the new ids of each prompt.
    ``settings``: the fields of ``DecodingSettings`` (its defaults where not given).

    Prompts are left-padded (generation appends on the right) and batched longest
    first (``DecodingSettings``' batch size or memory budget). The model's position ids
    follow the attention mask, so padding does not shift them: the batching changes only the rounding of the scores
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
    decoding = DecodingSettings(**settings)
    device = _device(decoding.device)
    precision = resolve_precision(decoding.precision, device)
    _check_prompts(model, prompts, decoding.max_new_tokens)

    def work(chunk: list[int]) -> list[list[int]]:
        width, input_ids, attention_mask = _left_padded(prompts, chunk, pad_token_id)
        with autocast(device, precision):
            generated = model.generate(
                input_ids=input_ids.to(device),
                attention_mask=attention_mask.to(device),
                num_beams=decoding.num_beams,
                length_penalty=decoding.length_penalty,
                no_repeat_ngram_size=decoding.no_repeat_ngram_size,
                max_new_tokens=decoding.max_new_tokens,
                do_sample=False,
                eos_token_id=eos_token_id,
                pad_token_id=pad_token_id,
            )
        outputs = []
        for row in range(len(chunk)):
            new_ids = generated[row, width:].tolist()
            # Finished beams are padded; cut at the first end of text.
            if eos_token_id in new_ids:
                new_ids = new_ids[: new_ids.index(eos_token_id)]
            outputs.append(new_ids)
        return outputs

    return _decode_in_batches(model, prompts, work, device=device, precision=precision, decoding=decoding)


def _left_padded(prompts: Sequence[list[int]], chunk: list[int], pad_token_id: int
                 ) -> tuple[int, torch.Tensor, torch.Tensor]:
    """(width, input ids, attention mask) of the prompts at ``chunk``, left-padded to the
    longest (generation appends on the right)."""
    width = max(len(prompts[i]) for i in chunk)
    input_ids = torch.full((len(chunk), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(chunk), width), dtype=torch.long)
    for row, i in enumerate(chunk):
        input_ids[row, width - len(prompts[i]):] = torch.tensor(prompts[i], dtype=torch.long)
        attention_mask[row, width - len(prompts[i]):] = 1
    return width, input_ids, attention_mask


def _decode_in_batches(model: torch.nn.Module, prompts: Sequence[list[int]],
                       decode: Callable[[list[int]], list[list[int]]], *, device: torch.device, precision: str,
                       decoding: DecodingSettings) -> list[list[int]]:
    """The new ids of every prompt: ``decode`` on batches of prompts, longest first
    (``_batched``, at ``decoding``'s batch size or memory budget), with the model in eval
    mode and its frozen base in the precision's half type; the model's training mode is
    restored afterwards."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]), reverse=True)
    outputs: list[list[int]] = [[] for _ in prompts]
    was_training = model.training
    model.to(device).eval()
    hold_frozen_in_half(model, precision, device)

    def work(chunk: list[int]) -> None:
        for i, ids in zip(chunk, decode(chunk)):
            outputs[i] = ids

    try:
        _batched(order, work, batch_size=decoding.batch_size, memory_budget=decoding.memory_budget, device=device)
    finally:
        model.train(was_training)
    return outputs


# --- the project's own batched search ---------------------------------------------------------
#
# ``beam_search_ids`` computes what ``generate_ids`` computes (Hugging Face's ``generate``
# with the same settings), in a loop of its own: the same model calls on the same rows
# (left-padded prompts, position ids counted along the attention mask, one token per step
# on the key/value cache, the head on the last position only), the same beam arithmetic
# in float32 (log-softmax, the n-gram ban, top-2k candidates, the finished-beam pool with
# its length penalty and its stopping heuristic, the cache reordered by the chosen beams)
# and the same cut at the first end of text. What differs is the work around it: no
# generation-config machinery per step, the n-gram ban as a few tensor operations on the
# device, and a host synchronisation only every ``check_every`` steps (the loop asks then
# whether every source is done; a step past that point cannot change a finished output).
#
# The token outputs are equal when each row's logits are: rows of a batch are computed
# independently, masked (padded) keys get exactly zero attention weight, and position ids
# follow the mask, so a row's numbers do not depend on its neighbours or on the padding
# width. That holds bit for bit in float32 on a CPU (tests/test_nlg_core.py compares the
# two decoders on tiny models, greedy and beam, with and without the n-gram ban); in half
# precision on a GPU a kernel may round a row differently at another batch shape, as the
# reference itself does between batchings, so bench/nlg.py reports the agreement there.
#
# The key/value cache is allocated once per batch at its final length (the prompt width
# plus the new tokens) and each step's keys and values are written in place; a beam
# reorder gathers the chosen rows by index into a second buffer allocated with the first,
# copying only the positions after the prompt when every beam's copy of a source holds the
# same prompt keys and values (checked bit for bit after the prefill). The model sees views
# of the filled positions, so its attention gets the same keys, values and mask as with
# the growing cache (transformers' DynamicCache, concatenated per step, rebuilt by each
# reorder); tests/test_nlg_core.py checks the logits of the two equal bit for bit, step by
# step, and bench/beam_cache.py times the two side by side.

# generation_config values that would add logits processors or change the search: the
# batched search runs none of them and refuses such a model rather than decode otherwise.
_PLAIN_GENERATION = {"repetition_penalty": (None, 1.0), "min_length": (None, 0), "min_new_tokens": (None,),
                     "bad_words_ids": (None,), "forced_bos_token_id": (None,), "forced_eos_token_id": (None,),
                     "suppress_tokens": (None,), "begin_suppress_tokens": (None,), "sequence_bias": (None,),
                     "encoder_no_repeat_ngram_size": (None, 0), "num_beam_groups": (None, 1),
                     "diversity_penalty": (None, 0.0), "renormalize_logits": (None, False),
                     "exponential_decay_length_penalty": (None,), "constraints": (None,),
                     "force_words_ids": (None,), "stop_strings": (None,), "num_return_sequences": (None, 1)}


def _refuse_unplain_generation(model: torch.nn.Module) -> str | bool:
    config = getattr(model, "generation_config", None)
    for name, plain in _PLAIN_GENERATION.items():
        value = getattr(config, name, None)
        if value not in plain:
            raise ValueError(f"beam_search_ids: the model's generation_config sets {name}={value!r}, which the "
                             f"batched search does not apply; decode with generate_ids")
    early = getattr(config, "early_stopping", False)
    return False if early is None else early


def _banned_by_ngrams(sequences: torch.Tensor, size: int) -> torch.Tensor | None:
    """(rows, length) token ids -> (rows, windows) token ids that would repeat an n-gram of
    ``size`` already in the row (the row's last size-1 tokens followed by them), and -1
    where a window does not match; None while the rows are shorter than ``size``."""
    if size <= 0 or sequences.shape[1] < size:
        return None
    windows = sequences.unfold(1, size, 1)  # (rows, length - size + 1, size)
    prefix = sequences[:, sequences.shape[1] - size + 1:]
    matches = (windows[..., :-1] == prefix.unsqueeze(1)).all(dim=-1)
    return torch.where(matches, windows[..., -1], -1)


def _apply_ban(scores: torch.Tensor, banned: torch.Tensor | None) -> torch.Tensor:
    if banned is None:
        return scores
    vocab = scores.shape[-1]
    mask = torch.zeros((scores.shape[0], vocab + 1), dtype=torch.bool, device=scores.device)
    # Non-matching windows (-1) and ids past the head's vocabulary land in a spare column.
    mask.scatter_(1, torch.where((banned >= 0) & (banned < vocab), banned, vocab), True)
    return scores.masked_fill(mask[:, :vocab], float("-inf"))


class _PreallocatedLayer(CacheLayerMixin):
    """One layer's key/value cache for the batched search, allocated once per batch at
    its final length and written in place: what ``DynamicLayer`` holds (the model gets
    views of the filled positions, so the attention sees the same keys, values and mask
    sizes), without a concatenation per step. ``reorder_cache`` gathers the chosen rows
    by index into a second buffer allocated with the first, and the two swap roles."""

    def __init__(self, max_length: int, reorders: bool) -> None:
        super().__init__()
        self.max_length = max_length
        self.reorders = reorders
        self.length = 0
        # Positions below this are equal in every row that a reorder may take a row from
        # (the prompt in each beam's copy of a source): a reorder copies only the rest.
        self.shared_prefix = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        rows, heads = key_states.shape[:2]

        def buffer(like: torch.Tensor) -> torch.Tensor:
            return like.new_zeros((rows, heads, self.max_length, like.shape[-1]))

        self.key_buffer, self.value_buffer = buffer(key_states), buffer(value_states)
        self.spare_keys = buffer(key_states) if self.reorders else None
        self.spare_values = buffer(value_states) if self.reorders else None
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, end = self.length, self.length + key_states.shape[-2]
        if end > self.max_length:
            raise ValueError(f"the preallocated key/value cache holds {self.max_length} positions; "
                             f"position {end - 1} does not fit")
        self.key_buffer[:, :, start:end].copy_(key_states)
        self.value_buffer[:, :, start:end].copy_(value_states)
        self.length = end
        self.keys, self.values = self.key_buffer[:, :, :end], self.value_buffer[:, :, :end]
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int | torch.Tensor) -> tuple[int, int]:
        # transformers before 5 passes the query's cache positions instead of its length.
        if isinstance(query_length, torch.Tensor):
            query_length = query_length.shape[0]
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return self.max_length

    get_max_cache_shape = get_max_length  # its name before transformers 5

    def share_prefix(self, length: int) -> None:
        """Skip positions below ``length`` in every later reorder (the caller has checked
        that the rows a reorder may exchange are equal there)."""
        self.spare_keys[:, :, :length].copy_(self.key_buffer[:, :, :length])
        self.spare_values[:, :, :length].copy_(self.value_buffer[:, :, :length])
        self.shared_prefix = length

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        if not self.reorders:
            raise RuntimeError("this preallocated cache was built without the spare buffers a reorder needs")
        span = slice(self.shared_prefix, self.length)
        beam_idx = beam_idx.to(self.key_buffer.device)
        torch.index_select(self.key_buffer[:, :, span], 0, beam_idx, out=self.spare_keys[:, :, span])
        torch.index_select(self.value_buffer[:, :, span], 0, beam_idx, out=self.spare_values[:, :, span])
        self.key_buffer, self.spare_keys = self.spare_keys, self.key_buffer
        self.value_buffer, self.spare_values = self.spare_values, self.value_buffer
        self.keys, self.values = self.key_buffer[:, :, :self.length], self.value_buffer[:, :, :self.length]


def _preallocated_cache(model: torch.nn.Module, max_length: int, reorders: bool) -> Cache:
    layers = model.config.get_text_config(decoder=True).num_hidden_layers
    return Cache(layers=[_PreallocatedLayer(max_length, reorders) for _ in range(layers)])


def _share_prompt(cache: Cache, copies: int) -> bool:
    """After the prefill: if every source's copies hold the same keys and values (bit for
    bit) in every layer, later reorders skip the prompt's positions; otherwise they copy
    them too. Either way a row's cache equals what a full reorder would give it."""
    def same_in_every_copy(states: torch.Tensor) -> bool:
        grouped = states.reshape(-1, copies, *states.shape[1:])
        return torch.equal(grouped, grouped[:, :1].expand_as(grouped))

    layers = cache.layers
    if not all(same_in_every_copy(layer.keys) and same_in_every_copy(layer.values) for layer in layers):
        return False
    for layer in layers:
        layer.share_prefix(layer.length)
    return True


# How the batched search keeps the key/value cache: "preallocated" (the default: written in
# place, reordered by index into a second buffer) or "growing" (transformers' DynamicCache,
# concatenated per step and rebuilt by each reorder, as generate does; kept for comparison).
KV_CACHES = ("preallocated", "growing")


class _Rows:
    """The model calls of one batch: a left-padded prefill, then one token per row per step
    on the key/value cache (the same inputs ``generate`` builds). ``copies``: rows per
    source (the beams), ``max_length``: the prompt width plus the new tokens."""

    def __init__(self, model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
                 copies: int, max_length: int, kv_cache: str) -> None:
        self.model = model.get_base_model() if hasattr(model, "get_base_model") else model
        self.input_ids = input_ids
        self.copies = copies
        self.length = input_ids.shape[1]
        self.preallocated = kv_cache == "preallocated"
        if self.preallocated:
            self.cache = _preallocated_cache(self.model, max_length, reorders=copies > 1)
            self.mask_buffer = attention_mask.new_ones((attention_mask.shape[0], max_length))
            self.mask_buffer[:, :self.length] = attention_mask
        else:
            self.cache = None
            self.mask_buffer = attention_mask

    @property
    def mask(self) -> torch.Tensor:
        return self.mask_buffer[:, :self.length]

    def logits(self, tokens: torch.Tensor | None = None) -> torch.Tensor:
        """float32 next-token logits of every row: of the prompts, or after ``tokens``."""
        if tokens is None:
            ids, positions = self.input_ids, (self.mask.cumsum(-1) - 1).clamp(min=0)
        else:
            if not self.preallocated:
                ones = self.mask_buffer.new_ones((self.mask_buffer.shape[0], 1))
                self.mask_buffer = torch.cat([self.mask_buffer, ones], dim=1)
            self.length += 1
            ids, positions = tokens.unsqueeze(1), (self.mask.sum(-1, keepdim=True) - 1)
        out = self.model(input_ids=ids, attention_mask=self.mask, position_ids=positions,
                         past_key_values=self.cache, use_cache=True, logits_to_keep=1, return_dict=True)
        self.cache = out.past_key_values
        if tokens is None and self.preallocated and self.copies > 1:
            _share_prompt(self.cache, self.copies)
        return out.logits[:, -1, :].to(dtype=torch.float32, copy=True)

    def reorder(self, rows: torch.Tensor) -> None:
        # Rows are only ever taken from the same source's beams, whose masks are equal.
        self.cache.reorder_cache(rows)


def _greedy(rows: _Rows, batch: int, width: int, *, eos: int, pad: int, ngram: int, max_new_tokens: int,
            check_every: int) -> torch.Tensor:
    device = rows.input_ids.device
    sequences = rows.input_ids
    unfinished = torch.ones(batch, dtype=torch.bool, device=device)
    scores = rows.logits()
    for step in range(max_new_tokens):
        scores = _apply_ban(scores, _banned_by_ngrams(sequences, ngram))
        tokens = torch.where(unfinished, scores.argmax(dim=-1), pad)
        sequences = torch.cat([sequences, tokens[:, None]], dim=1)
        unfinished &= tokens != eos
        if step + 1 == max_new_tokens or ((step + 1) % check_every == 0 and not bool(unfinished.any())):
            break
        scores = rows.logits(tokens)
    return sequences[:, width:]


def _beams(rows: _Rows, batch: int, width: int, *, beams: int, eos: int, pad: int, ngram: int,
           length_penalty: float, early_stopping: str | bool, max_new_tokens: int, check_every: int) -> torch.Tensor:
    """Beam search over ``batch`` sources (``rows`` holds ``beams`` copies of each, beam
    by beam): returns the best finished sequence's new tokens per source."""
    device = rows.input_ids.device
    max_length = width + max_new_tokens
    keep = 2 * beams  # candidates per source: enough live ones even if half of them end (one end-of-text id)
    live = torch.full((batch, beams, max_length), pad, dtype=torch.long, device=device)
    live[:, :, :width] = rows.input_ids.view(batch, beams, width)
    done_tokens = live.clone()
    live_scores = torch.zeros((batch, beams), device=device)
    live_scores[:, 1:] = -1e9  # step one: only the first copy's continuations count
    done_scores = torch.full((batch, beams), -1e9, device=device)
    done_flags = torch.zeros((batch, beams), dtype=torch.bool, device=device)
    improvable = torch.ones((batch, 1), dtype=torch.bool, device=device)
    first_of_each = torch.arange(keep, device=device) < beams
    source_offset = torch.arange(batch, device=device).view(-1, 1) * beams
    logits = rows.logits()
    length = width
    for step in range(max_new_tokens):
        flat = live[:, :, :length].reshape(batch * beams, length)
        log_probs = _apply_ban(torch.log_softmax(logits, dim=-1), _banned_by_ngrams(flat, ngram))
        vocab = log_probs.shape[-1]
        totals = (log_probs.view(batch, beams, vocab) + live_scores[:, :, None]).view(batch, beams * vocab)
        cand_scores, cand_index = torch.topk(totals, keep)
        cand_beam = cand_index // vocab
        cand_tokens = live.gather(1, cand_beam[:, :, None].expand(-1, -1, max_length))
        cand_tokens[:, :, length] = cand_index % vocab
        ends = (cand_index % vocab == eos) | (length + 1 >= max_length)

        # The best candidates that did not end carry on.
        carried = cand_scores + ends.to(torch.float32) * -1.0e9
        chosen = torch.topk(carried, beams)[1]
        live = cand_tokens.gather(1, chosen[:, :, None].expand(-1, -1, max_length))
        live_scores = carried.gather(1, chosen)
        parents = (cand_beam + source_offset).gather(1, chosen)

        # Candidates among the first ``beams`` that ended join the finished pool, scored per
        # generated token, while the pool can still improve.
        ended = ends & first_of_each[None, :]
        scored = cand_scores / ((length + 1 - width) ** length_penalty)
        scored += (done_flags.all(dim=-1, keepdim=True) & (early_stopping is True)).to(torch.float32) * -1.0e9
        scored += (~improvable).to(torch.float32) * -1.0e9
        scored += (~ended) * -1.0e9
        pool = torch.topk(torch.cat((done_scores, scored), dim=1), beams)[1]
        done_tokens = torch.cat((done_tokens, cand_tokens), dim=1).gather(
            1, pool[:, :, None].expand(-1, -1, max_length))
        done_scores = torch.cat((done_scores, scored), dim=1).gather(1, pool)
        done_flags = torch.cat((done_flags, ended), dim=1).gather(1, pool)

        length += 1
        best_length = (max_length if early_stopping == "never" and length_penalty > 0.0 else length) - width
        best_live = live_scores[:, :1] / (best_length ** length_penalty)
        worst_done = torch.where(done_flags, torch.min(done_scores, dim=1, keepdim=True)[0], -1.0e9)
        improvable = improvable & torch.any(best_live > worst_done, dim=-1, keepdim=True)
        if step + 1 == max_new_tokens:
            break
        if (step + 1) % check_every == 0:
            going = improvable.any() & ~(done_flags.all() & (early_stopping is True)) & ~ends.all()
            if not bool(going):
                break
        rows.reorder(parents.view(-1))
        logits = rows.logits(live[:, :, length - 1].reshape(-1))
    return done_tokens[:, 0, width:]


@torch.no_grad()
def beam_search_ids(
    model: torch.nn.Module,
    prompts: Sequence[list[int]],
    *,
    pad_token_id: int,
    eos_token_id: int,
    check_every: int = 4,
    kv_cache: str = "preallocated",
    **settings,
) -> list[list[int]]:
    """``generate_ids``' outputs (same arguments, same batching rules) from the batched
    search above; ``num_beams=1`` is greedy decoding, as in ``generate``. ``kv_cache``:
    one of ``KV_CACHES`` (the same outputs either way; "growing" is the previous way)."""
    decoding = DecodingSettings(**settings)
    num_beams, max_new_tokens = decoding.num_beams, decoding.max_new_tokens
    if not isinstance(num_beams, int) or num_beams < 1:
        raise ValueError(f"num_beams must be a positive integer, got {num_beams!r}")
    if kv_cache not in KV_CACHES:
        raise ValueError(f"kv_cache must be one of {KV_CACHES}, got {kv_cache!r}")
    if not isinstance(check_every, int) or check_every < 1:
        raise ValueError(f"check_every must be a positive integer, got {check_every!r}")
    device = _device(decoding.device)
    precision = resolve_precision(decoding.precision, device)
    early_stopping = _refuse_unplain_generation(model)
    _check_prompts(model, prompts, max_new_tokens)

    def work(chunk: list[int]) -> list[list[int]]:
        width, input_ids, attention_mask = _left_padded(prompts, chunk, pad_token_id)
        copies = num_beams  # generate runs every beam's copy of the prompt, so this does too
        rows = _Rows(model, input_ids.repeat_interleave(copies, 0).to(device),
                     attention_mask.repeat_interleave(copies, 0).to(device), copies=copies,
                     max_length=width + max_new_tokens, kv_cache=kv_cache)
        common = dict(eos=eos_token_id, pad=pad_token_id, ngram=decoding.no_repeat_ngram_size,
                      max_new_tokens=max_new_tokens, check_every=check_every)
        with autocast(device, precision):
            if num_beams == 1:
                new = _greedy(rows, len(chunk), width, **common)
            else:
                new = _beams(rows, len(chunk), width, beams=num_beams, length_penalty=decoding.length_penalty,
                             early_stopping=early_stopping, **common)
        ids = [new[row].tolist() for row in range(len(chunk))]
        return [row[: row.index(eos_token_id)] if eos_token_id in row else row for row in ids]

    return _decode_in_batches(model, prompts, work, device=device, precision=precision, decoding=decoding)


def generate(model: torch.nn.Module, tokenizer, sources: Sequence[str], **decoding) -> list[str]:
    """One beam-search output per source (the paper's decoding by default:
    ``DecodingSettings``), decoded from the new tokens only, special tokens dropped,
    whitespace stripped. ``decoding``: the keyword arguments of ``generate_with_cuts``."""
    return generate_with_cuts(model, tokenizer, sources, **decoding)[0]


def generate_with_cuts(
    model: torch.nn.Module,
    tokenizer,
    sources: Sequence[str],
    *,
    decoder: str = "batched",
    **settings,
) -> tuple[list[str], list[bool]]:
    """``generate``'s outputs and, per output, whether it was cut: it used all
    ``max_new_tokens`` without emitting end of text, so it may stop mid-sentence.
    ``decoder``: "batched" (``beam_search_ids``, the stages' decoder) or "reference"
    (``generate_ids``: Hugging Face's generate, which it reproduces); ``settings``: the
    fields of ``DecodingSettings``, passed on to it."""
    decoders = {"batched": beam_search_ids, "reference": generate_ids}
    if decoder not in decoders:
        raise ValueError(f"decoder must be one of {sorted(decoders)}, got {decoder!r}")
    max_new_tokens = DecodingSettings(**settings).max_new_tokens  # a wrong keyword is refused before any work
    prompts = [prompt_ids(tokenizer, source) for source in sources]
    new_ids = decoders[decoder](model, prompts, pad_token_id=_pad_token_id(tokenizer),
                                eos_token_id=_end_token_id(tokenizer), **settings)
    texts = [tokenizer.decode(ids, skip_special_tokens=True).strip() for ids in new_ids]
    return texts, [len(ids) >= max_new_tokens for ids in new_ids]
