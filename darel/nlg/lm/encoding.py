"""Encoding (source, target) pairs for a causal LM: ``source tokens, separator, " " +
target tokens, end of text``; the loss covers the target tokens and the final
end-of-text only. Nothing is truncated silently."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import torch


IGNORE_INDEX = -100

# (token ids, number of leading ids that are source + separator)
EncodedPair = tuple[list[int], int]


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
    from darel import io

    path = Path(tokenizer_dir) / "lengths.json"
    if not path.is_file():
        raise ValueError(f"{path}: missing (the tokenizer stage writes it; rerun it)")
    record = io.read_json(path)
    return {key: value for key, value in record.items() if key not in ("files_sha256", "record_seal")}


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
