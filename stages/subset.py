"""Stage "subset materialisation": Algorithm 2. Within each class keep the first
ceil(alpha*|class|) samples by the scorer's loss (hard: highest first, easy: lowest
first), alpha coming from the cell's calibration."""

from __future__ import annotations

import numpy as np

from darel import io, stagekit
from darel.selection import select_by_loss


def main() -> None:
    ap = stagekit.parser(__doc__)
    ap.add_argument("--losses", required=True)
    ap.add_argument("--calibration", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    params, log = stagekit.start(args, "subset")
    scored = io.read_npz(args.losses)
    alpha = float(io.read_json(args.calibration)["alpha"])
    kept_positions = select_by_loss(scored["loss"], scored["label"], alpha, params["mode"])
    indices = scored["index"][kept_positions]
    io.write_npz(args.out, indices=indices.astype(np.int64), alpha=np.float64(alpha), mode=np.str_(params["mode"]))
    log.info("kept %d of %d samples (alpha %.4f, mode %s)", len(indices), len(scored["index"]), alpha, params["mode"])


if __name__ == "__main__":
    main()
