"""Stage "subset materialisation": Algorithm 2. Within each class keep the first
ceil(alpha*|class|) samples by the scorer's loss (hard: highest first, easy: lowest
first), alpha coming from the cell's calibration."""

from __future__ import annotations

import numpy as np

from pathlib import Path

from darel import io, provenance, stagekit
from darel.data import read_dataset
from darel.selection import select_by_loss


def main() -> None:
    ap = stagekit.parser(__doc__)
    ap.add_argument("--losses", required=True)
    ap.add_argument("--calibration", required=True)
    ap.add_argument("--data", required=True, help="the data set (its labels must be the losses' labels)")
    ap.add_argument("--scorer-model", required=True, help="the scorer's model.pt (must be the one that scored)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    params, log = stagekit.start(args, "subset", writes=Path(args.out).parent)
    scored = provenance.read_sealed_npz(args.losses)
    train, _, _ = read_dataset(args.data)
    scorer_record = Path(args.scorer_model).with_name("train.json")
    scorer_sha256 = provenance.read_record(scorer_record)["model_sha256"]
    provenance.check_file(args.scorer_model, scorer_sha256, scorer_record)
    provenance.check_losses(scored, args.losses, labels=train["labels"], scorer_sha256=scorer_sha256)
    calibration = provenance.check_calibration(provenance.read_record(args.calibration), args.calibration)
    alpha = float(calibration["alpha"])
    kept_positions = select_by_loss(scored["loss"], scored["label"], alpha, params["mode"])
    indices = scored["index"][kept_positions]
    provenance.write_sealed_npz(args.out, indices=indices.astype(np.int64), alpha=np.float64(alpha), mode=np.str_(params["mode"]),
                 calibration_sha256=np.str_(io.file_sha256(args.calibration)),
                 losses_sha256=np.str_(str(scored["content_sha256"])),
                 inputs={"calibration": args.calibration, "losses": args.losses})
    log.info("kept %d of %d samples (alpha %.4f, mode %s)", len(indices), len(scored["index"]), alpha, params["mode"])


if __name__ == "__main__":
    main()
