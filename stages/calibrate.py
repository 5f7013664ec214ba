"""Stage "calibration": Algorithm 1 (batch size for the memory budget), equations 2-5
(alpha, A, eta for the time budget) and the epoch plan, measured with the run's own
training step in one session and scaled by the baseline's measured wall time T and
peak memory M. Writes every input and output."""

from __future__ import annotations

from pathlib import Path

from darel import calibration, io, plans, provenance, stagekit
from darel.budget import BudgetError


def main() -> None:
    ap = stagekit.parser(__doc__)
    ap.add_argument("--data", required=True)
    ap.add_argument("--baseline", required=True, help="baseline train.json (gives T, M and its step count)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    params, log = stagekit.start(args, "calibrate", writes=Path(args.out).parent)
    base = provenance.check_train(provenance.read_record(args.baseline), args.baseline)
    protocol = params["protocol"]
    device, split = stagekit.device_and_split(params, args.data)
    augment, normalise = stagekit.transforms(split["meta"], params["augment"], protocol.get("input_size"))
    model = stagekit.new_model(stagekit.model_spec(params["model"], split["meta"], protocol), params["seed"])
    probe = params["budget"]
    try:
        result = calibration.calibrate_cell(
            model=model, images=split["train_x"], labels=split["train_y"], augment=augment, normalise=normalise,
            device=device, plan=plans.run_plan(plans.ImageSettings.from_slice(params)), baseline=base, t=params["t"], m=params["m"],
            alpha_default=params["alpha_default"], A_min=params["A_min"], A_max=params["A_max"],
            warmup_epochs=protocol["warmup_epochs"], history_size=params["history_size"], bins=params["bins"],
            probe_warmup=probe["probe_warmup"], probe_repeats=probe["probe_repeats"],
            probe_rounds=probe["probe_rounds"], enforce=probe["enforce"])
    except BudgetError as err:
        if err.needed_bytes is None:
            raise
        stagekit.fail(log, calibration.infeasible_message(params["model"], params["t"], params["m"],
                                                          err.needed_bytes, base["peak_mem_bytes"]))
    result["memory_source"] = base.get("memory_source")
    result["produced_by"] = {"baseline_train_json_sha256": io.file_sha256(args.baseline),
                             "data_sha256": split["meta"].get("sha256"), "code_version": provenance.code_version()}
    provenance.write_record(args.out, result, inputs={"baseline": args.baseline})


if __name__ == "__main__":
    main()
