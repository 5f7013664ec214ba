"""Stage "offline loss scoring": the scorer's per-sample loss on every training sample
(eval mode, no augmentation), saved with sample indices and labels."""

from __future__ import annotations

import numpy as np

from pathlib import Path

from darel import evaluation, provenance, stagekit
from darel.measure import Stopwatch


def main() -> None:
    ap = stagekit.parser(__doc__)
    ap.add_argument("--data", required=True)
    ap.add_argument("--model", required=True, help="scorer checkpoint (model.pt)")
    ap.add_argument("--out", required=True, help="losses.npz to write")
    args = ap.parse_args()
    params, log = stagekit.start(args, "score", writes=Path(args.out).parent)
    device, split, model, _, normalise = stagekit.model_on_split(params, args.data, args.model)
    # The scoring pass's time: the total accounting charges it to the methods that use these losses.
    with Stopwatch(device) as watch:
        losses = evaluation.per_sample_losses(model, split["train_x"], split["train_y"], normalise,
                                                  params["eval_batch"], params["precision"])
    provenance.write_sealed_npz(args.out, **provenance.losses_record(
        np.arange(len(losses), dtype=np.int64), split["train_y"].cpu().numpy().astype(np.int64),
        losses.cpu().numpy().astype(np.float32),
        scorer_sha256=provenance.read_record(Path(args.model).with_name("train.json"))["model_sha256"]),
        time_s=np.float64(watch.seconds))
    log.info("scored %d samples: loss mean %.4f min %.4f max %.4f", len(losses), losses.mean().item(),
             losses.min().item(), losses.max().item())


if __name__ == "__main__":
    main()
