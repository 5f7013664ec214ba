"""Stage "online training": a Table 1 cell's method on its offline subset with Algorithm 3
(keep fraction A, loss refresh every eta epochs, warm-up epochs): DAREL at the calibrated
batch size, for the planned epochs (budget.enforce: plan) or until the next epoch would
pass the time budget t*T (wallclock); IDS + ADONIS at its fixed settings (its plan.json).
Its plan is the method's (darel.plans.method_plan), as every run's."""

from __future__ import annotations

from darel import data, io, provenance, stagekit
from darel.plans import ImageSettings, check_enforcement, method_plan
from darel.stagekit import run_training


def main() -> None:
    ap = stagekit.image_training_parser(__doc__)
    ap.add_argument("--calibration", required=True)
    ap.add_argument("--subset", required=True)
    args = ap.parse_args()
    params, log = stagekit.start(args, "train_online", writes=args.out_dir)
    calibration = provenance.check_calibration(provenance.read_record(args.calibration), args.calibration)
    calibration_sha256 = io.file_sha256(args.calibration)
    subset = provenance.read_sealed_npz(args.subset, inputs={"calibration": args.calibration})
    n_train = int(provenance.read_record(f"{args.data}/{data.META_FILE}")["n_train"])
    provenance.check_subset(subset, args.subset, n_samples=n_train, calibration_sha256=calibration_sha256)
    try:
        check_enforcement(ImageSettings.from_slice(params), calibration)
    except ValueError as err:
        stagekit.fail(log, f"{args.calibration}: {err}")
    plan = method_plan(calibration.get("method", "darel"), calibration, n_full=n_train,
                       warmup_epochs=params["protocol"]["warmup_epochs"], epochs=params["protocol"]["epochs"],
                       table1=True)
    run_training(params, data_dir=args.data, out_dir=args.out_dir, log=log, progress=not args.no_progress,
                 tracking=stagekit.tracking_target(args), eval_out=args.eval_out, method=plan,
                 subset_indices=subset["indices"],
                 inputs={"calibration": calibration_sha256, "subset": io.file_sha256(args.subset)},
                 input_files={"calibration": args.calibration, "subset": args.subset})


if __name__ == "__main__":
    main()
