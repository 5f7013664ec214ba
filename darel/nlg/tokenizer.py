"""A byte-level BPE tokenizer trained on the task's own text, for the quick profile's
tiny GPT-2 (the real profile uses the pretrained GPT-2 tokenizer instead).

Byte-level BPE is GPT-2's scheme: any string is encodable (no unknown token) and
decoding restores it exactly. Three special tokens are added: end of text (also the
beginning-of-text token, as in GPT-2), padding, and a separator that ``darel.nlg.lm``
puts between the source and the target.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

END_OF_TEXT = "<|endoftext|>"
PADDING = "<|pad|>"
SEPARATOR = "<|sep|>"
SPECIAL_TOKENS = (END_OF_TEXT, PADDING, SEPARATOR)


def train_bpe_tokenizer(
    texts: Iterable[str], vocab_size: int = 1000, min_frequency: int = 2
) -> PreTrainedTokenizerFast:
    """Train byte-level BPE on ``texts`` and wrap it for transformers.

    ``vocab_size`` counts the 256 byte symbols and the three special tokens, so it
    must exceed 259.
    """
    minimum = 256 + len(SPECIAL_TOKENS)
    if not isinstance(vocab_size, int) or vocab_size <= minimum:
        raise ValueError(f"vocab_size must be an integer above {minimum} (bytes + special tokens), got {vocab_size!r}")
    if not isinstance(min_frequency, int) or min_frequency < 1:
        raise ValueError(f"min_frequency must be a positive integer, got {min_frequency!r}")
    texts = [text for text in texts]
    if not texts:
        raise ValueError("cannot train a tokenizer on no texts")

    backend = Tokenizer(models.BPE())
    # No prefix space: the caller decides where spaces go (lm.py prefixes the target).
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        # Every byte stays encodable even when absent from the training texts.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=END_OF_TEXT,
        eos_token=END_OF_TEXT,
        unk_token=END_OF_TEXT,
        pad_token=PADDING,
        sep_token=SEPARATOR,
    )


def vocab_size_for(texts: Iterable[str], min_frequency: int = 2, cap: int = 8192) -> int:
    """A BPE size derived from the texts: the bytes and special tokens, plus one token
    per distinct whitespace-separated word seen at least ``min_frequency`` times (so
    that frequent words can become single tokens), at most ``cap``."""
    counts: dict[str, int] = {}
    for text in texts:
        for word in text.split():
            counts[word] = counts.get(word, 0) + 1
    frequent = sum(1 for count in counts.values() if count >= min_frequency)
    return min(cap, 256 + len(SPECIAL_TOKENS) + max(frequent, 1))


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, folder: str | os.PathLike) -> Path:
    from darel.io import save_folder

    folder = save_folder(folder)  # save_pretrained writes through whatever it finds
    tokenizer.save_pretrained(str(folder))
    return folder


def load_tokenizer(folder: str | os.PathLike) -> PreTrainedTokenizerFast:
    """Load a tokenizer saved by ``save_tokenizer``: the locally trained one, or the
    GPT-2 one (AutoTokenizer restores the class recorded in the folder)."""
    folder = Path(folder)
    if not (folder / "tokenizer.json").is_file():
        raise ValueError(f"{folder}: no tokenizer.json (not a saved tokenizer folder)")
    return AutoTokenizer.from_pretrained(str(folder))


def load_hub_tokenizer(name: str = "gpt2", revision: str | None = None) -> PreTrainedTokenizerFast:
    """A pretrained tokenizer by hub name or local folder (downloads on first use).

    GPT-2's has neither a padding nor a separator token; ``darel.nlg.lm`` then pads
    with end of text (masked) and separates source and target with its
    beginning-of-text token, as the LoRA recipe does. No token is added, so the
    pretrained embedding matrix keeps its size."""
    return AutoTokenizer.from_pretrained(name, revision=revision)
