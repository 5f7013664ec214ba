"""Stage "control training" of a study: one method of a study cell (darel.methods) at the
cell's budget, calibrated batch and a time plan from the same cost model, on the subset
the method uses (DAREL's offline subset, a random one, or all data). Writes plan.json
(the method's plan, every term, and the run's resolved learning-rate rule,
``lr_schedule``), then trains like the online stage (model.pt, train.json)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from darel import data, io, provenance, stagekit
from darel.methods import FULL_DATA
from darel.plans import ImageSettings, PlanError, method_plan, run_plan


def main() -> None:
    ap = stagekit.image_training_parser(__doc__)
    ap.add_argument("--calibration", required=True, help="the study cell's calibration.json (Table 1's)")
    ap.add_argument("--subset", help="subset.npz the method trains on (absent for methods on all data)")
    args = ap.parse_args()
    params, log = stagekit.start(args, "train_control", writes=args.out_dir)
    method = params["method"]
    calibration = provenance.check_calibration(provenance.read_record(args.calibration), args.calibration)
    meta = provenance.read_record(Path(args.data) / data.META_FILE)
    try:
        plan = method_plan(method, calibration, n_full=int(meta["n_train"]),
                           warmup_epochs=params["protocol"]["warmup_epochs"], epochs=params["protocol"]["epochs"],
                           params=params)
    except PlanError as err:
        stagekit.fail(log, f"{args.out_dir}: {err}")
    if (plan.subset == FULL_DATA) != (args.subset is None):
        stagekit.fail(log, f"method {method} trains on subset {plan.subset!r} but --subset was "
                           f"{'given' if args.subset else 'not given'}")
    # The learning rate the run will train with, as darel.plans.lr_schedule resolves it.
    rate = asdict(run_plan(ImageSettings.from_slice(params), plan).lr_schedule)
    provenance.write_record(Path(args.out_dir) / "plan.json", {**plan.record(), "lr_schedule": rate},
                            inputs={"calibration": args.calibration})
    log.info("%s plan: %s", method, {k: v for k, v in plan.record().items() if k != "epoch_kinds"})
    inputs = {"calibration": io.file_sha256(args.calibration)}
    subset = None
    if args.subset is not None:
        stored = provenance.read_sealed_npz(args.subset, inputs={"calibration": args.calibration})
        provenance.check_subset(stored, args.subset, n_samples=int(meta["n_train"]),
                                calibration_sha256=inputs["calibration"])
        subset, inputs["subset"] = stored["indices"], io.file_sha256(args.subset)
    stagekit.run_training(params, data_dir=args.data, out_dir=args.out_dir, log=log, progress=not args.no_progress,
                          tracking=stagekit.tracking_target(args), eval_out=args.eval_out, method=plan,
                          subset_indices=subset, inputs=inputs,
                          input_files={"calibration": args.calibration, "subset": args.subset})


if __name__ == "__main__":
    main()
