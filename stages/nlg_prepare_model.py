"""Stages "tokenizer" and "pretrain" for Tables 2/3. Paper profile: the real GPT-2
tokenizer and weights from the Hugging Face hub. Quick profile: a byte-level BPE
tokenizer trained on the training texts and a tiny GPT-2 pretrained from scratch on
them (causal LM), so that LoRA adapts a pretrained model as in the paper."""

from __future__ import annotations

from pathlib import Path

from darel import provenance, runtime, stagekit
from darel.io import save_folder
from darel.nlg import schemas
from darel.nlg import lm, tokenizer as ntok


def main() -> None:
    ap = stagekit.parser(__doc__)
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--tokenizer-dir", required=True, help="read, or written with --train-tokenizer")
    ap.add_argument("--train-tokenizer", action="store_true")
    ap.add_argument("--out-dir", help="the pretrained model folder")
    args = ap.parse_args()
    params, log = stagekit.start(args, "nlg_prepare_model")
    provenance.check_folder(args.data_dir, "meta.json")
    train = schemas.read_split(Path(args.data_dir) / "train.jsonl")
    texts = [f"{source} {ref}" for source, ref in schemas.training_pairs(train)]
    if args.train_tokenizer:
        if params["synthetic"]:
            settings = dict(params["tokenizer"])
            if settings.get("vocab_size") == "auto":
                settings["vocab_size"] = ntok.vocab_size_for(texts, settings.get("min_frequency", 2))
            tok = ntok.train_bpe_tokenizer(texts, **settings)
        else:
            # Every GPT-2 size shares one tokenizer: the scorer's (this job's params) is theirs.
            hub, revision = params["architecture"]["hub"], params["architecture"].get("revision")
            tok = ntok.load_hub_tokenizer(hub, revision=lm.resolve_hub_revision(hub, revision) or revision)
        ntok.save_tokenizer(tok, args.tokenizer_dir)
        # Sequence settings the data cannot exceed (max_length / n_positions: auto).
        test = schemas.read_split(Path(args.data_dir) / "test.jsonl")
        lengths = lm.derive_lengths(tok, schemas.training_pairs(train), [ex.source for ex in test],
                                    params["decoding"]["max_new_tokens"])
        provenance.write_folder_record(args.tokenizer_dir, "lengths.json", lengths)
        log.info("tokenizer with %d tokens -> %s; lengths %s", len(tok), args.tokenizer_dir, lengths)
        return
    provenance.check_folder(args.tokenizer_dir, "lengths.json")
    tok = ntok.load_tokenizer(args.tokenizer_dir)
    device = runtime.resolve_device(params["device"])
    runtime.configure_runtime(device, params["threads"], deterministic=True)
    if params["synthetic"]:
        architecture = {"n_positions": lm.read_lengths(args.tokenizer_dir)["n_positions"], **params["architecture"]}
        model = lm.build_lm(lm.tiny_gpt2_config(len(tok), **architecture), seed=params["seed"])
        pre = params["pretrain"]
        summary = lm.pretrain_lm(model, tok, texts, epochs=pre["epochs"], batch_size=pre["batch"], lr=pre["lr"],
                                 device=device, seed=params["seed"])
    else:
        hub, revision = params["architecture"]["hub"], params["architecture"].get("revision")
        commit = lm.resolve_hub_revision(hub, revision)
        if revision is None:
            log.warning("%s is not pinned: this run uses commit %s; pin it with profiles.<profile>.nlg.models."
                        "%s.revision", hub, commit, params["model"])
        model = lm.build_lm(hub, revision=commit or revision)
        summary = {"source": f"hub:{hub}", "revision_requested": revision, "hub_commit": commit}
    save_folder(args.out_dir)
    model.save_pretrained(args.out_dir)
    provenance.write_folder_record(args.out_dir, "pretrain.json", summary)
    log.info("pretrained %s -> %s", params["model"], args.out_dir)


if __name__ == "__main__":
    main()
