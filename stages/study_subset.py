"""Stage "study subset": a training set a study method draws itself (darel.methods: its
``build_subset``), e.g. random (controls random-offline and random): a random
ceil(alpha * |class|) of every class, alpha from the cell's calibration, seeded by the
run's seed: the same class counts as DAREL's offline subset, another choice."""

from __future__ import annotations

import numpy as np

from pathlib import Path

from darel import data, io, methods, provenance, stagekit


def main() -> None:
    ap = stagekit.parser(__doc__, "--data", "--calibration", "--out")
    args = ap.parse_args()
    params, log = stagekit.start(args, "study_subset")
    # One writer per training set: the cell's folder holds every method's set and run.
    stagekit.claim_folder(Path(args.out).parent, f"study_subset.{params['subset']}", log)
    builder = methods.own_subsets().get(params["subset"])
    if builder is None:
        stagekit.fail(log, f"no method draws a training set called {params['subset']!r} "
                           f"(known: {', '.join(methods.own_subsets())})")
    train, _, _ = data.read_dataset(args.data)
    if builder.needs_category and "category" not in train:
        stagekit.fail(log, f"method {builder.name} draws its training set from the data's recorded per-sample "
                           f"categories, and {args.data} has none (only the generated benchmark records them)")
    alpha = float(provenance.check_calibration(provenance.read_record(args.calibration), args.calibration)["alpha"])
    extra = {"category": train["category"]} if builder.needs_category else {}
    indices = builder.build_subset(train["labels"], alpha, params["seed"], **extra)
    provenance.write_sealed_npz(args.out, indices=indices, alpha=np.float64(alpha), mode=np.str_(params["subset"]),
                                calibration_sha256=np.str_(io.file_sha256(args.calibration)),
                                inputs={"calibration": args.calibration})
    log.info("%s subset: kept %d of %d samples (alpha %.4f, seed %d)", params["subset"], len(indices),
             len(train["labels"]), alpha, params["seed"])


if __name__ == "__main__":
    main()
