"""Throughput of the NLG path: LoRA training tokens per second and beam-10 decoding
outputs per second.

* ``--model tiny`` (default on CPU): the quick profile's tiny GPT-2 with a BPE
  tokenizer trained on synthetic E2E data; training and decoding go through the
  public ``finetune`` and ``generate``.
* ``--model medium`` (default on CUDA): GPT-2 medium shapes (n_embd 1024, 24 layers,
  16 heads, vocabulary 50257), randomly initialised since nothing is downloaded,
  trained at batch 8 on sequences of exactly 512 tokens (random ids, loss on the last
  384) with float16 autocast, and decoding 64 new tokens from 48-token prompts. A
  random model almost never emits end of text, so every output runs the full 64 tokens:
  the worst case for decoding time.

Training tokens/s counts non-padding tokens through forward and backward, after
``--warmup-steps`` untimed steps. Decoding runs once untimed on a small batch first.
Usage: python bench/nlg.py [--device cpu|cuda] [--model tiny|medium] [--steps 100]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from darel.io import write_json  # noqa: E402
from darel.nlg.schemas import training_pairs  # noqa: E402
from darel.nlg.synthetic import make_synthetic_e2e  # noqa: E402
from darel.nlg.lm import (  # noqa: E402
    add_lora,
    build_lm,
    encode_pair_ids,
    finetune_encoded,
    generate_ids,
    prompt_ids,
    tiny_gpt2_config,
)
from darel.nlg.tokenizer import train_bpe_tokenizer  # noqa: E402
from transformers import GPT2Config  # noqa: E402

PROTOCOL = dict(lr=2e-4, betas=(0.9, 0.999), weight_decay=0.01, label_smoothing=0.1)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _train_rate(model, encoded, pad_id, args, device, amp) -> dict:
    common = dict(epochs=10**6, batch_size=args.batch, warmup_steps=0, device=device, seed=0, amp=amp,
                  progress=False, **PROTOCOL)
    finetune_encoded(model, encoded, pad_id, max_steps=args.warmup_steps, **common)  # untimed warm-up
    result = finetune_encoded(model, encoded, pad_id, max_steps=args.steps, **common)
    return {
        "train_steps": result["steps"],
        "train_time_s": result["total_time_s"],
        "train_tokens_per_s": result["tokens_trained"] / result["total_time_s"],
        "train_target_tokens_per_s": result["target_tokens"] / result["total_time_s"],
    }


def bench_tiny(args, device: torch.device) -> dict:
    examples = make_synthetic_e2e(200, seed=0)
    pairs = training_pairs(examples)
    tokenizer = train_bpe_tokenizer([text for pair in pairs for text in pair], vocab_size=1000, min_frequency=2)
    config = tiny_gpt2_config(len(tokenizer), n_positions=256, eos_token_id=tokenizer.eos_token_id,
                              pad_token_id=tokenizer.pad_token_id)
    model = add_lora(build_lm(config, seed=0)).to(device)
    encoded = encode_pair_ids(tokenizer, pairs, max_length=256)
    stats = {"model": "tiny GPT-2 (n_embd 64, 2 layers, 2 heads)", "vocab_size": len(tokenizer),
             "mean_sequence_tokens": sum(len(ids) for ids, _ in encoded) / len(encoded)}
    stats.update(_train_rate(model, encoded, tokenizer.pad_token_id, args, device, amp=False))

    prompts = [prompt_ids(tokenizer, example.source) for example in examples[: args.decode_n]]
    decode = dict(pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, num_beams=10,
                  length_penalty=0.9, no_repeat_ngram_size=4, max_new_tokens=64, batch_size=args.batch, device=device)
    generate_ids(model, prompts[:2], **decode)  # untimed warm-up
    _sync(device)
    start = time.perf_counter()
    # What ``generate`` does, keeping the ids to count them.
    outputs = generate_ids(model, prompts, **decode)
    texts = [tokenizer.decode(ids, skip_special_tokens=True).strip() for ids in outputs]
    _sync(device)
    elapsed = time.perf_counter() - start
    stats.update({"decode_outputs": len(texts), "decode_time_s": elapsed, "decode_outputs_per_s": len(texts) / elapsed,
                  "decode_mean_new_tokens": sum(map(len, outputs)) / len(outputs)})
    return stats


def bench_medium(args, device: torch.device) -> dict:
    amp = device.type == "cuda"
    vocab, seq, prompt_len = 50257, 512, 128
    config = GPT2Config(vocab_size=vocab, n_positions=1024, n_embd=1024, n_layer=24, n_head=16,
                        bos_token_id=vocab - 1, eos_token_id=vocab - 1)
    model = add_lora(build_lm(config, seed=0)).to(device)
    generator = torch.Generator().manual_seed(0)
    count = args.batch * (args.steps + args.warmup_steps)
    # Ids below the end-of-text id, so no sequence ends early.
    encoded = [(torch.randint(0, vocab - 1, (seq,), generator=generator).tolist(), prompt_len) for _ in range(count)]
    stats = {"model": "GPT-2 medium shapes, random init (n_embd 1024, 24 layers, 16 heads)", "sequence": seq,
             "batch": args.batch, "amp_float16": amp}
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    stats.update(_train_rate(model, encoded, vocab - 1, args, device, amp=amp))
    if device.type == "cuda":
        stats["train_peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30

    prompts = [torch.randint(0, vocab - 1, (48,), generator=generator).tolist() for _ in range(args.decode_n)]
    decode = dict(pad_token_id=vocab - 1, eos_token_id=vocab - 1, num_beams=10, length_penalty=0.9,
                  no_repeat_ngram_size=4, max_new_tokens=64, batch_size=args.batch, device=device, amp=amp)
    generate_ids(model, prompts[:2], **decode)  # untimed warm-up
    _sync(device)
    start = time.perf_counter()
    outputs = generate_ids(model, prompts, **decode)
    _sync(device)
    elapsed = time.perf_counter() - start
    stats.update({"decode_outputs": len(outputs), "decode_time_s": elapsed, "decode_outputs_per_s": len(outputs) / elapsed,
                  "decode_mean_new_tokens": sum(map(len, outputs)) / len(outputs)})
    return stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model", choices=("tiny", "medium"), default=None, help="default: tiny on CPU, medium on CUDA")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=100, help="timed training steps")
    ap.add_argument("--warmup-steps", type=int, default=3)
    ap.add_argument("--decode-n", type=int, default=16, help="sources decoded in the timed run")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--out", default=None, help="also write the results as JSON here")
    args = ap.parse_args()
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    model = args.model or ("medium" if device.type == "cuda" else "tiny")
    stats = bench_tiny(args, device) if model == "tiny" else bench_medium(args, device)
    stats.update({"device": str(device), "torch_threads": torch.get_num_threads(), "torch": torch.__version__})
    if device.type == "cuda":
        stats["gpu"] = torch.cuda.get_device_name(device)
    print(f"LoRA training: {stats['train_tokens_per_s']:.0f} tokens/s "
          f"({stats['train_steps']} steps of batch {args.batch} in {stats['train_time_s']:.2f} s)")
    print(f"beam-10 decoding: {stats['decode_outputs_per_s']:.2f} outputs/s "
          f"({stats['decode_outputs']} outputs, {stats['decode_mean_new_tokens']:.1f} new tokens each on average)")
    print(json.dumps(stats, indent=2, sort_keys=True))
    if args.out:
        write_json(args.out, stats)


if __name__ == "__main__":
    main()
