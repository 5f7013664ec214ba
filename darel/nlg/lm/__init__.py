"""GPT-2 + LoRA for data-to-text, split along its seams: ``model`` (configurations, hub
weights, LoRA), ``encoding`` (pairs to token ids), ``loss`` (target-position loss and the
per-sample LM loss), ``finetuning`` (pretraining and LoRA fine-tuning on the epoch
skeleton) and ``decoding`` (beam search). Everything is importable from
``darel.nlg.lm`` directly.

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

from darel.nlg.lm.decoding import DecodingSettings, beam_search_ids, generate, generate_ids, generate_with_cuts
from darel.nlg.lm.encoding import (EncodedPair, IGNORE_INDEX, collate_pairs, derive_lengths, encode_pair_ids,
                                   encode_pairs, max_length_of, pair_texts, prompt_ids, read_lengths,
                                   separator_token_id)
from darel.nlg.lm.finetuning import MEMORY_COUNTS, finetune, finetune_encoded, pretrain_lm
from darel.nlg.lm.loss import TargetLoss, hold_frozen_in_half, next_batch_size, per_sample_lm_loss, target_positions
from darel.nlg.lm.model import (add_lora, build_lm, load_with_adapter, resolve_hub_revision, tiny_gpt2_config,
                                trainable_parameter_names)

__all__ = [
    "add_lora", "beam_search_ids", "build_lm", "collate_pairs", "DecodingSettings", "derive_lengths", "encode_pair_ids",
    "encode_pairs", "EncodedPair",
    "finetune", "finetune_encoded", "generate", "generate_ids", "generate_with_cuts", "hold_frozen_in_half",
    "IGNORE_INDEX", "load_with_adapter", "max_length_of", "MEMORY_COUNTS", "next_batch_size", "pair_texts",
    "per_sample_lm_loss", "pretrain_lm", "prompt_ids", "read_lengths", "resolve_hub_revision",
    "separator_token_id", "target_positions", "TargetLoss", "tiny_gpt2_config", "trainable_parameter_names",
]
