"""Throughput and memory of the NLG path: LoRA training tokens per second, beam-10
decoding outputs per second, and the peak memory of a GPT-2 medium step.

* ``--model tiny``: the quick profile's tiny GPT-2 with a BPE tokenizer trained on
  synthetic E2E data (63 tokens per pair on average).
* ``--model medium``: GPT-2 medium shapes (n_embd 1024, 24 layers, 16 heads,
  vocabulary 50257), randomly initialised, sequences of exactly ``--seq`` tokens (random
  ids, loss on the last 3/4), decoding 64 new tokens from 48-token prompts (a random
  model almost never ends early: the worst case for decoding time).
* ``--memory``: the peak memory of one GPT-2 medium step at ``--batch`` x ``--seq`` as
  the fine-tuning records it (``StepMemoryMeter``: torch's peak on a GPU; on a CPU the
  deterministic tensor count - parameters, gradients, optimiser state and everything
  saved for backward - plus the process's peak RSS). On a CPU the count grows linearly
  with the batch, so ``--memory-from-batches 1 2`` measures two small batches and
  extrapolates to ``--batch`` (a GPT-2 medium step at 8 x 512 does not fit a small CPU
  machine's memory before this change).

``--code DIR`` imports the implementation from another checkout of this repository (for
example the commit before a change, exported to /tmp), so the same benchmark measures
before and after; the keyword that selects half precision is ``amp`` in older code and
``precision`` since the shared training step.

Usage: python bench/nlg.py [--code DIR] [--device cpu|cuda] [--model tiny|medium] [--memory]
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import sys
import time
from pathlib import Path


def _load(code: Path):
    sys.path.insert(0, str(code))
    lm = importlib.import_module("darel.nlg.lm")
    try:
        synthetic = importlib.import_module("darel.nlg.synthetic")
        schemas = importlib.import_module("darel.nlg.schemas")
    except ModuleNotFoundError:  # before the split of darel/nlg/datasets.py
        synthetic = schemas = importlib.import_module("darel.nlg.datasets")
    tokenizer = importlib.import_module("darel.nlg.tokenizer")
    return lm, synthetic, schemas, tokenizer


def _half(lm, function, device, half: bool | None = None):
    """The precision keyword of ``function`` in the loaded code, for half precision on
    a GPU (float32 on a CPU, or wherever ``half`` is False)."""
    names = inspect.signature(function).parameters
    half = device.type == "cuda" if half is None else half
    if "amp" in names:  # a checkout before the precision setting (the decoders now take it among **settings)
        return {"amp": half}
    return {"precision": "auto" if half else "fp32"}


def _sync(torch, device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


PROTOCOL = dict(lr=2e-4, betas=(0.9, 0.999), weight_decay=0.01, label_smoothing=0.1)


def _train(lm, model, encoded, pad_id, args, device, batch, steps) -> dict:
    common = dict(epochs=10**6, batch_size=batch, warmup_steps=0, device=device, seed=0, progress=False,
                  **PROTOCOL, **_half(lm, lm.finetune_encoded, device))
    if args.warmup_steps:
        lm.finetune_encoded(model, encoded, pad_id, max_steps=args.warmup_steps, **common)  # untimed
    result = lm.finetune_encoded(model, encoded, pad_id, max_steps=steps, **common)
    return {"train_steps": result["steps"], "train_time_s": result["total_time_s"],
            "train_tokens_per_s": result["tokens_trained"] / result["total_time_s"],
            "peak_mem_bytes": result["peak_mem_bytes"], "memory_source": result["memory_source"],
            "process_peak_rss_bytes": result.get("process_peak_rss_bytes")}


def _decode(lm, torch, model, prompts, pad_id, eos_id, args, device) -> dict:
    """Beam-10 decoding of ``prompts`` by the reference decoder (``generate_ids``: Hugging
    Face's generate) at ``--batch`` sources per batch (and at each of
    ``--decode-reference-batches``) and by the batched search (``beam_search_ids``) at
    each of ``--decode-batches``, one after the other in this process, each after an untimed
    warm-up; the outputs are compared token for token."""
    decode = dict(pad_token_id=pad_id, eos_token_id=eos_id, num_beams=10, length_penalty=0.9,
                  no_repeat_ngram_size=4, max_new_tokens=64, device=device, **_half(lm, lm.generate_ids, device))
    runs = [("reference", lm.generate_ids, args.batch)]
    runs += [("reference", lm.generate_ids, b) for b in args.decode_reference_batches if b != args.batch]
    if hasattr(lm, "beam_search_ids"):  # absent in checkouts before it
        runs += [("batched", lm.beam_search_ids, b) for b in (args.decode_batches or [len(prompts)])]
    results, outputs = {}, {}
    for name, decoder, batch in runs:
        decoder(model, prompts[:1], batch_size=1, **decode)  # untimed warm-up
        _sync(torch, device)
        start = time.perf_counter()
        out = decoder(model, prompts, batch_size=batch, **decode)
        _sync(torch, device)
        elapsed = time.perf_counter() - start
        key = f"{name}_batch{batch}"
        outputs[key] = out
        results[key] = {"decoder": name, "sources_per_batch": batch, "time_s": elapsed,
                        "outputs_per_s": len(out) / elapsed, "mean_new_tokens": sum(map(len, out)) / len(out)}
    first = f"reference_batch{args.batch}"
    for key, result in results.items():
        result["identical_to_" + first] = sum(a == b for a, b in zip(outputs[key], outputs[first]))
        result["speedup_vs_" + first] = results[first]["time_s"] / result["time_s"]
        same_batch = f"reference_batch{result['sources_per_batch']}"
        if result["decoder"] == "batched" and same_batch in outputs:  # the same padding, so the same kernels' shapes
            result["identical_to_reference_same_batch"] = sum(
                a == b for a, b in zip(outputs[key], outputs[same_batch]))
    reference = results[first]
    # The first three keys keep the names of earlier runs of this script (the reference decoder).
    return {"decode_outputs": len(prompts), "decode_time_s": reference["time_s"],
            "decode_outputs_per_s": reference["outputs_per_s"], "decode_mean_new_tokens": reference["mean_new_tokens"],
            "decoders": results}


def bench_tiny(mods, torch, args, device) -> dict:
    lm, synthetic, schemas, tok = mods
    examples = synthetic.make_synthetic_e2e(200, seed=0)
    pairs = schemas.training_pairs(examples)
    tokenizer = tok.train_bpe_tokenizer([t for pair in pairs for t in pair], vocab_size=1000, min_frequency=2)
    config = lm.tiny_gpt2_config(len(tokenizer), n_positions=256, eos_token_id=tokenizer.eos_token_id,
                                 pad_token_id=tokenizer.pad_token_id)
    model = lm.add_lora(lm.build_lm(config, seed=0)).to(device)
    encoded = lm.encode_pair_ids(tokenizer, pairs, max_length=256)
    stats = {"model": "tiny GPT-2 (n_embd 64, 2 layers, 2 heads)", "batch": args.batch,
             "mean_sequence_tokens": sum(len(ids) for ids, _ in encoded) / len(encoded)}
    stats.update(_train(lm, model, encoded, tokenizer.pad_token_id, args, device, args.batch, args.steps))
    prompts = [lm.prompt_ids(tokenizer, e.source) for e in examples[: args.decode_n]]
    stats.update(_decode(lm, torch, model, prompts, tokenizer.pad_token_id, tokenizer.eos_token_id, args, device))
    return stats


def _medium(lm, torch, device):
    from transformers import GPT2Config

    vocab = 50257
    config = GPT2Config(vocab_size=vocab, n_positions=1024, n_embd=1024, n_layer=24, n_head=16,
                        bos_token_id=vocab - 1, eos_token_id=vocab - 1)
    return lm.add_lora(lm.build_lm(config, seed=0)).to(device), vocab


def _random_pairs(torch, vocab, count, seq):
    generator = torch.Generator().manual_seed(0)
    # ids below the end-of-text id, so no sequence ends early; loss on the last 3/4
    return [(torch.randint(0, vocab - 1, (seq,), generator=generator).tolist(), seq // 4) for _ in range(count)]


def bench_medium(mods, torch, args, device) -> dict:
    lm = mods[0]
    model, vocab = _medium(lm, torch, device)
    encoded = _random_pairs(torch, vocab, args.batch * (args.steps + args.warmup_steps), args.seq)
    stats = {"model": "GPT-2 medium shapes, random init (n_embd 1024, 24 layers, 16 heads)", "sequence": args.seq,
             "batch": args.batch}
    stats.update(_train(lm, model, encoded, vocab - 1, args, device, args.batch, args.steps))
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, vocab - 1, (48,), generator=generator).tolist() for _ in range(args.decode_n)]
    stats.update(_decode(lm, torch, model, prompts, vocab - 1, vocab - 1, args, device))
    return stats


def check_fp32(mods, torch, args, device) -> dict:
    """The two decoders' tokens compared in float32 on a fresh model (no half-precision
    rounding that depends on the batch's shape), greedy and beam-10, each pair at the same
    sources per batch: ``--decode-check-fp32`` sources, all in one batch and in batches of 1."""
    lm = mods[0]
    model, vocab = _medium(lm, torch, device)
    generator = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, vocab - 1, (int(n),), generator=generator).tolist()
               for n in torch.randint(24, 49, (args.decode_check_fp32,), generator=generator)]
    checks = {}
    for beams in (1, 10):
        for batch in (len(prompts), 1):
            decode = dict(pad_token_id=vocab - 1, eos_token_id=vocab - 1, num_beams=beams, length_penalty=0.9,
                          no_repeat_ngram_size=4, max_new_tokens=32, device=device, batch_size=batch,
                          **_half(lm, lm.generate_ids, device, half=False))
            reference = lm.generate_ids(model, prompts, **decode)
            batched = lm.beam_search_ids(model, prompts, **decode)
            checks[f"beams{beams}_batch{batch}"] = {"identical": sum(a == b for a, b in zip(reference, batched)),
                                                    "of": len(prompts)}
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"fp32_equality": {"prompt_tokens": "24-48 (mixed lengths: left padding inside a batch)",
                              "max_new_tokens": 32, "checks": checks}}


def bench_memory(mods, torch, args, device) -> dict:
    lm = mods[0]
    model, vocab = _medium(lm, torch, device)
    batches = args.memory_from_batches or [args.batch]
    measured = {}
    for batch in batches:
        encoded = _random_pairs(torch, vocab, batch, args.seq)
        one = argparse.Namespace(**{**vars(args), "warmup_steps": 0})
        result = _train(lm, model, encoded, vocab - 1, one, device, batch, 1)
        measured[batch] = result
    stats = {"model": "GPT-2 medium shapes, random init", "sequence": args.seq,
             "measured": {str(b): {k: r[k] for k in ("peak_mem_bytes", "memory_source", "process_peak_rss_bytes")}
                          for b, r in measured.items()}}
    if len(batches) >= 2:
        (b1, r1), (b2, r2) = sorted(measured.items())[:2]
        slope = (r2["peak_mem_bytes"] - r1["peak_mem_bytes"]) / (b2 - b1)
        stats[f"peak_mem_bytes_at_batch_{args.batch}_extrapolated"] = r1["peak_mem_bytes"] + slope * (args.batch - b1)
        stats["peak_mem_bytes_per_sequence"] = slope
    return stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--code", default=str(Path(__file__).resolve().parents[1]),
                    help="checkout whose darel package is measured (default: this one)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model", choices=("tiny", "medium"), default=None, help="default: tiny on CPU, medium on CUDA")
    ap.add_argument("--memory", action="store_true", help="peak memory of a GPT-2 medium step instead of throughput")
    ap.add_argument("--memory-from-batches", type=int, nargs="*", default=None,
                    help="measure these batch sizes and extrapolate linearly to --batch (CPU)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512, help="sequence length of the medium shapes")
    ap.add_argument("--steps", type=int, default=100, help="timed training steps")
    ap.add_argument("--warmup-steps", type=int, default=3)
    ap.add_argument("--decode-n", type=int, default=16, help="sources decoded in the timed run")
    ap.add_argument("--decode-batches", type=int, nargs="*", default=None,
                    help="time the batched search at each of these sources per batch (default: all --decode-n at once)")
    ap.add_argument("--decode-check-fp32", type=int, default=0, metavar="N",
                    help="first compare both decoders' tokens in float32 on N sources of a fresh GPT-2 medium-shaped "
                         "model (greedy and beam, at N and at 1 sources per batch)")
    ap.add_argument("--decode-reference-batches", type=int, nargs="*", default=[],
                    help="also time the reference decoder at these sources per batch")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--out", default=None, help="also write the results as JSON here")
    args = ap.parse_args()
    mods = _load(Path(args.code).resolve())
    import torch

    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.memory:
        stats = bench_memory(mods, torch, args, device)
    else:
        model = args.model or ("medium" if device.type == "cuda" else "tiny")
        checked = check_fp32(mods, torch, args, device) if args.decode_check_fp32 else {}
        stats = (bench_tiny if model == "tiny" else bench_medium)(mods, torch, args, device)
        stats.update(checked)
    stats.update({"code": str(Path(args.code).resolve()), "device": str(device),
                  "torch_threads": torch.get_num_threads(), "torch": torch.__version__})
    if device.type == "cpu":
        stats["machine_note"] = "CPU timings: a shared, possibly busy machine; compare only within this run"
    if device.type == "cuda":
        stats["gpu"] = torch.cuda.get_device_name(device)
    print(json.dumps(stats, indent=2, sort_keys=True))
    if args.out:
        Path(args.out).write_text(json.dumps(stats, indent=2, sort_keys=True) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
