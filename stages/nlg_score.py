"""Stage "offline loss scoring" for Tables 2/3: the scorer LM's per-sample loss of each
training target given its input (mean token cross-entropy). Algorithm 2 then ranks all
samples together (no classes)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from darel import provenance, stagekit
from darel.measure import Stopwatch
from darel.nlg import schemas
from darel.nlg import lm, tokenizer as ntok


def main() -> None:
    ap = stagekit.parser(__doc__, "--data-dir", "--tokenizer-dir", "--out")
    ap.add_argument("--model-dir", required=True, help="the pretrained scorer")
    ap.add_argument("--memory-from", help="train.json of a fine-tuning of the same model and data: on a GPU the "
                                          "batches grow to the largest that fits the peak memory it measured")
    args = ap.parse_args()
    params, log = stagekit.start(args, "nlg_score")
    device = stagekit.device_after_checks(params, ((args.data_dir, "meta.json"), (args.tokenizer_dir, "lengths.json"),
                                                   (args.model_dir, "pretrain.json")))
    tok = ntok.load_tokenizer(args.tokenizer_dir)
    model = lm.build_lm(args.model_dir).to(device)
    pairs = schemas.training_pairs(schemas.read_split(Path(args.data_dir) / "train.jsonl"))
    memory_budget = (provenance.read_record(args.memory_from)["peak_mem_bytes"]
                     if args.memory_from and device.type == "cuda" else None)
    with Stopwatch(device) as watch:  # charged to the cells ranked by these losses in the total accounting
        losses = lm.per_sample_lm_loss(model, tok, pairs, batch_size=params["finetune"]["batch"], device=device,
                                       max_length=lm.max_length_of(params["finetune"], args.tokenizer_dir),
                                       precision=params["precision"], memory_budget=memory_budget)
    provenance.write_sealed_npz(args.out, index=np.arange(len(losses), dtype=np.int64),
                                loss=np.asarray(losses, dtype=np.float32), time_s=np.float64(watch.seconds))
    log.info("scored %d training pairs with %s: mean loss %.4f", len(losses), args.model_dir, float(np.mean(losses)))


if __name__ == "__main__":
    main()
