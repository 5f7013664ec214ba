"""Stage "calibration": Algorithm 1 (batch size for the memory budget), equations 2-5
(alpha, A, eta for the time budget) and the epoch plan, measured with the run's own
training step in one session and scaled by the baseline's measured wall time T and
peak memory M. Writes every input and output."""

from __future__ import annotations

from pathlib import Path

from darel import calibration, io, plans, provenance, runtime, stagekit
from darel.budget import BudgetError
from darel.step import resolve_precision, step_kind


def reused(params: dict, path: str, out: str, log) -> dict:
    """Another build's calibration of this cell (``snakemake --config calibrations_from=<that
    project>``), taken as it is instead of measured: its decisions are timed by design, so
    a second build that reuses them can be compared bit for bit with the first in all that
    follows (tests/test_workflow.py). Like any record it must carry a valid seal under this
    user's key (a lab that reuses another member's calibrations shares one key), be the
    record of this cell's place (``out``) in that project, and be for the same budget and
    settings, within this protocol's epochs."""
    try:
        record = provenance.check_calibration(provenance.read_record(path), path)
        provenance.check_identity(out, record.get(provenance.IDENTITY_KEY))
    except provenance.ArtifactError as err:
        stagekit.fail(log, f"calibrations_from: {path} cannot be reused: {str(err).split(': ', 1)[-1]}")
    epochs = params["protocol"]["epochs"]
    if record.get("planned_epochs") is not None and record["planned_epochs"] > epochs:
        stagekit.fail(log, f"calibrations_from: {path} plans {record['planned_epochs']} epochs, more than this "
                           f"protocol's {epochs}; reuse a calibration of the same cell and parameters")
    keys = ("t", "m", "alpha_default", "A_min", "A_max")
    differs = [f"{key} {record.get(key)!r} instead of {params[key]!r}" for key in keys if record.get(key) != params[key]]
    # Probes timed another step than this profile trains with (records from before the
    # probes compiled have no key: their probes ran eager), or the same setting resolved to
    # another step on another device or precision (graphs on a bf16 GPU, compiled under fp16).
    if record.get("compile", False) != params["compile"]:
        differs.append(f"compile {record.get('compile', False)!r} instead of {params['compile']!r}")
    elif record.get("step") is not None:
        here = _step_here(params, log)
        if record["step"] != here:
            differs.append(f"a {record['step']} step probed instead of the {here} step this device trains with")
    if record.get("enforce") != params["budget"]["enforce"]:
        differs.append(f"enforce {record.get('enforce')!r} instead of {params['budget']['enforce']!r}")
    if differs:
        stagekit.fail(log, f"{path} was calibrated for other settings ({', '.join(differs)}); reuse a calibration of "
                           "the same cell and parameters")
    log.info("reusing %s (measured by another build) instead of calibrating", path)
    return {**record, "reused_from": {"path": str(Path(path).resolve()), "sha256": io.file_sha256(path)}}


def _step_here(params: dict, log) -> str:
    """The step kind this profile trains with here. Only graphs depends on the device and
    its precision; only then is the device asked (before this job's device turn, so it
    starts no CUDA work of its own beyond the query)."""
    if params["compile"] != "graphs":
        return "compiled" if params["compile"] else "eager"
    try:
        device = runtime.resolve_device(params["device"])
    except RuntimeError as err:
        stagekit.fail(log, f"calibrations_from: {err}")
    return step_kind(params["compile"], device, resolve_precision(params["precision"], device))


def main() -> None:
    ap = stagekit.parser(__doc__)
    ap.add_argument("--data", required=True)
    ap.add_argument("--baseline", required=True, help="baseline train.json (gives T, M and its step count)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    params, log = stagekit.start(args, "calibrate", writes=Path(args.out).parent)
    base = provenance.check_train(provenance.read_record(args.baseline), args.baseline)
    if params.get("reuse"):
        provenance.write_record(args.out, reused(params, params["reuse"], args.out, log),
                                inputs={"baseline": args.baseline})
        return
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
