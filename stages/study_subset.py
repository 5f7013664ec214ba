"""Stage "random subset" of a study cell (controls random-offline and random): a random
ceil(alpha * |class|) of every class, alpha from the cell's calibration, seeded by the
run's seed: the same class counts as DAREL's offline subset, another choice."""

from __future__ import annotations

import numpy as np

from pathlib import Path

from darel import data, io, provenance, stagekit
from darel.controls.random_subset import random_per_class


def main() -> None:
    ap = stagekit.parser(__doc__)
    ap.add_argument("--data", required=True)
    ap.add_argument("--calibration", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    params, log = stagekit.start(args, "study_subset", writes=Path(args.out).parent)
    train, _, _ = data.read_dataset(args.data)
    alpha = float(provenance.check_calibration(provenance.read_record(args.calibration), args.calibration)["alpha"])
    indices = random_per_class(train["labels"], alpha, seed=params["seed"])
    provenance.write_sealed_npz(args.out, indices=indices, alpha=np.float64(alpha), mode=np.str_("random"),
                 calibration_sha256=np.str_(io.file_sha256(args.calibration)), inputs={"calibration": args.calibration})
    log.info("random subset: kept %d of %d samples (alpha %.4f, seed %d)", len(indices), len(train["labels"]),
             alpha, params["seed"])


if __name__ == "__main__":
    main()
