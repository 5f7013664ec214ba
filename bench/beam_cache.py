"""Milliseconds per beam-search step of the batched search (``beam_search_ids``) with each
of its key/value caches, side by side in one process: "growing" (transformers'
DynamicCache: concatenated every step, rebuilt by every beam reorder) and "preallocated"
(allocated once per batch at its final length, written in place, reordered by index into
a second buffer). Optionally the reference decoder (``generate_ids``: Hugging Face's
generate) beside them.

A randomly initialised GPT-2 (LoRA-wrapped, as the fine-tuned models are) decodes
``--sources`` random prompts of 24-48 tokens (mixed lengths: left padding inside the
batch) in one batch, ``--beams`` rows per source; no prompt or output contains the
end-of-text id the search is given, so every run makes exactly ``--new-tokens`` steps.
The decoders run in turn, ``--repeats`` rounds, after one untimed warm-up each.

* ms/step: from the start of the second model call (the first step after the prefill) to
  the end, divided by the calls after the prefill: the model, the beam arithmetic and the
  cache's reorder of one step. On a GPU the host runs ahead of the device by at most a
  few steps between the search's synchronisations, so this is close, not exact.
* total s: the whole decode, prefill included.
* Every decoder's tokens are compared with the growing cache's (the same batch).

Usage: python bench/beam_cache.py [--device cpu|cuda] [--shape tiny|medium] [--sources N]
       [--beams B] [--new-tokens T] [--repeats R] [--threads K] [--reference] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from darel.nlg import lm  # noqa: E402
from darel.nlg.lm.decoding import KV_CACHES  # noqa: E402

SHAPES = {
    # bench/nlg.py's tiny model: the quick profile's GPT-2 with a 1000-token vocabulary
    "tiny": dict(vocab_size=1000, n_positions=256, n_embd=64, n_layer=2, n_head=2),
    "medium": dict(vocab_size=50257, n_positions=1024, n_embd=1024, n_layer=24, n_head=16),
}


def _model(shape: str, device: torch.device):
    from transformers import GPT2Config

    dims = SHAPES[shape]
    end = dims["vocab_size"] - 1
    config = GPT2Config(**dims, bos_token_id=end, eos_token_id=end, pad_token_id=end)
    return lm.add_lora(lm.build_lm(config, seed=0)).to(device).eval(), dims["vocab_size"]


def _prompts(vocab: int, count: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(24, 49, (count,), generator=generator)
    return [torch.randint(0, vocab - 2, (int(n),), generator=generator).tolist() for n in lengths]


class _CallClock:
    """Start times of the base model's forward calls (both decoders call it once a step)."""

    def __init__(self, model) -> None:
        self.starts: list[float] = []
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        self.handle = base.register_forward_pre_hook(lambda *_: self.starts.append(time.perf_counter()))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--shape", choices=sorted(SHAPES), default=None, help="default: tiny on CPU, medium on CUDA")
    ap.add_argument("--sources", type=int, default=64, help="sources decoded in one batch (rows = sources x beams)")
    ap.add_argument("--beams", type=int, default=10)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3, help="timed rounds (each decoder once per round)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--reference", action="store_true", help="also time generate_ids (Hugging Face's generate)")
    ap.add_argument("--out", default=None, help="also write the results as JSON here")
    args = ap.parse_args()
    for name in ("sources", "beams", "new_tokens", "repeats"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")

    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    shape = args.shape or ("medium" if device.type == "cuda" else "tiny")
    model, vocab = _model(shape, device)
    prompts = _prompts(vocab, args.sources)
    # An end-of-text id that no row emits (one past the vocabulary): every run makes all its steps.
    decode = dict(pad_token_id=vocab - 1, eos_token_id=vocab, num_beams=args.beams, length_penalty=0.9,
                  no_repeat_ngram_size=4, max_new_tokens=args.new_tokens, batch_size=args.sources, device=device,
                  precision="auto" if device.type == "cuda" else "fp32")
    decoders = {f"batched, {cache} cache": (lambda m, p, cache=cache, **kw: lm.beam_search_ids(m, p, kv_cache=cache,
                                                                                                **kw))
                for cache in sorted(KV_CACHES, key=lambda cache: cache != "growing")}
    if args.reference:
        decoders["reference (generate_ids)"] = lm.generate_ids
    first = "batched, growing cache"

    for decoder in decoders.values():  # untimed warm-up
        decoder(model, prompts[:2], **{**decode, "batch_size": 2, "max_new_tokens": 4})
    times: dict[str, dict[str, list[float]]] = {name: {"ms_per_step": [], "total_s": [], "peak_mem_bytes": []}
                                                for name in decoders}
    outputs: dict[str, list[list[int]]] = {}
    clock = _CallClock(model)
    for _ in range(args.repeats):
        for name, decoder in decoders.items():
            clock.starts.clear()
            _sync(device)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            start = time.perf_counter()
            outputs[name] = decoder(model, prompts, **decode)
            _sync(device)
            end = time.perf_counter()
            steps = len(clock.starts) - 1
            times[name]["ms_per_step"].append((end - clock.starts[1]) / steps * 1e3 if steps else float("nan"))
            times[name]["total_s"].append(end - start)
            if device.type == "cuda":
                times[name]["peak_mem_bytes"].append(torch.cuda.max_memory_allocated(device))
    clock.handle.remove()

    rows = args.sources * args.beams
    print(f"beam search, {shape} GPT-2 shapes, {args.sources} sources x {args.beams} beams = {rows} rows, "
          f"{args.new_tokens} new tokens, prompts 24-48 tokens, device {device}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, {args.repeats} rounds (median; min-max)")
    base = statistics.median(times[first]["ms_per_step"])
    summary = {}
    for name, measured in times.items():
        ms, total = measured["ms_per_step"], measured["total_s"]
        same = sum(a == b for a, b in zip(outputs[name], outputs[first]))
        summary[name] = {"ms_per_step": ms, "total_s": total, "peak_mem_bytes": measured["peak_mem_bytes"],
                         "identical_outputs_to_growing": same, "of": len(prompts)}
        memory = (f"  peak {max(measured['peak_mem_bytes']) / 2**30:.2f} GiB" if measured["peak_mem_bytes"] else "")
        print(f"  {name:28s} {statistics.median(ms):8.2f} ms/step ({min(ms):.2f}-{max(ms):.2f})  "
              f"total {statistics.median(total):7.2f} s  speed-up {base / statistics.median(ms):5.2f}x  "
              f"outputs identical to the growing cache's: {same}/{len(prompts)}{memory}")
    if device.type == "cpu":
        print("  (CPU timings on a shared machine: compare only within this run)")
    if args.out:
        record = {"shape": shape, "sources": args.sources, "beams": args.beams, "rows": rows,
                  "new_tokens": args.new_tokens, "device": str(device), "torch": torch.__version__,
                  "threads": torch.get_num_threads(), "decoders": summary}
        Path(args.out).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
