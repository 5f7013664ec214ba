"""Stage "evaluation" for Tables 2/3: beam-search generation for every test input and
the official E2E metric suite (BLEU, NIST, METEOR, ROUGE_L, CIDEr) plus TER."""

from __future__ import annotations

from pathlib import Path

from darel import io, provenance, stagekit
from darel.nlg import schemas
from darel.nlg import lm, tokenizer as ntok
from darel.nlg.metrics import score_all


def main() -> None:
    ap = stagekit.parser(__doc__, "--data-dir", "--tokenizer-dir", "--adapter-dir", "--out-hyps", "--out")
    ap.add_argument("--model-dir", required=True, help="the pretrained base model")
    args = ap.parse_args()
    params, log = stagekit.start(args, "nlg_evaluate")
    device = stagekit.device_after_checks(params, ((args.data_dir, "meta.json"), (args.tokenizer_dir, "lengths.json"),
                                                   (args.model_dir, "pretrain.json"), (args.adapter_dir, "train.json")))
    tok = ntok.load_tokenizer(args.tokenizer_dir)
    model = lm.load_with_adapter(args.model_dir, args.adapter_dir).to(device)
    test = schemas.read_split(Path(args.data_dir) / "test.jsonl")
    # On a GPU, beam search batches grow to the largest that fits the memory the
    # fine-tuning measured (train.json beside the adapter).
    memory_budget = (provenance.read_record(Path(args.adapter_dir) / "train.json")["peak_mem_bytes"]
                     if device.type == "cuda" else None)
    dec = params["decoding"]
    hyps, cut = lm.generate_with_cuts(
        model, tok, [ex.source for ex in test], num_beams=dec["num_beams"], length_penalty=dec["length_penalty"],
        no_repeat_ngram_size=dec["no_repeat_ngram_size"], max_new_tokens=dec["max_new_tokens"],
        batch_size=params["finetune"]["batch"], device=device, precision=params["precision"],
        memory_budget=memory_budget)
    if any(cut):
        log.warning("%d of %d outputs used all %d new tokens without ending (cut; scored as they are)",
                    sum(cut), len(cut), dec["max_new_tokens"])
    io.write_text(args.out_hyps, "".join(h.replace("\n", " ") + "\n" for h in hyps))
    # The official suite plus the candidate paper-scale METEOR/NIST variants (docs/deviations.md).
    scores = score_all(hyps, [list(ex.references) for ex in test], variants=True)
    provenance.write_record(args.out, {**scores, "n_test": len(test), "n_outputs_cut": sum(cut),
                                       "hyps_sha256": io.file_sha256(args.out_hyps),
                                       "adapter_sha256": io.file_sha256(Path(args.adapter_dir) / "train.json")},
                            inputs={"train": Path(args.adapter_dir) / "train.json"})
    log.info("scores: %s", scores)


if __name__ == "__main__":
    main()
