"""Stage "cell record" of every table: joins a cell's training and evaluation records
(and for Table 1 its baseline and calibration) into the cell record (every number of its
table row, recomputable; darel.records) with the Eq. 6 cross-check of CO2e from the
measured average powers. The MLflow run is completed by its own job afterwards
(stages/track.py), so a tracking failure never costs this record."""

from __future__ import annotations

from pathlib import Path

from darel import checkpoint, io, provenance, records, stagekit
from darel.layout import how_to_recreate
from darel.measure import carbon_record


def check_hyps(hyps: str, evaluation: dict, eval_path: str, log) -> None:
    """The outputs beside eval.json must be the ones it scored (its recorded hyps_sha256)."""
    if evaluation.get("hyps_sha256") != io.file_sha256(hyps):
        stagekit.fail(log, f"{hyps} is not the output {eval_path} scored (sha256 {io.file_sha256(hyps)[:12]}... vs "
                           f"recorded {str(evaluation.get('hyps_sha256'))[:12]}...); {how_to_recreate(hyps)}")


def main() -> None:
    ap = stagekit.parser(__doc__)
    ap.add_argument("--train", required=True, help="the training's train.json")
    ap.add_argument("--eval", required=True, help="the evaluation's eval.json")
    ap.add_argument("--baseline", help="Table 1: the model's baseline train.json")
    ap.add_argument("--calibration", help="Table 1: the cell's calibration.json (or IDS + ADONIS's plan.json)")
    ap.add_argument("--meta", help="Tables 2/3: the data set's meta.json")
    ap.add_argument("--hyps", help="Tables 2/3: the generated outputs the evaluation scored (hyps.txt)")
    ap.add_argument("--scorer-train", help="the offline scorer's train.json (its training time, charged in the total "
                                           "accounting to the cells whose training set it chose)")
    ap.add_argument("--scorer-losses", help="the scorer's losses (the scoring pass's time, charged likewise)")
    ap.add_argument("--model", help="an image cell's model.pt: its sha256 must be the one train.json records (the "
                                     "training evaluated it in memory, so nothing else reads the file)")
    ap.add_argument("--out-carbon", required=True)
    ap.add_argument("--out-cell", required=True)
    ap.add_argument("--discard-checkpoint", help="the training's checkpoint: removed once the cell record is written "
                                                 "(the workflow accepted the training's outputs before this job ran)")
    args = ap.parse_args()
    params, log = stagekit.start(args, "cell_record", writes=Path(args.out_carbon).parent)
    # Every record against its place and the inputs this job was given: a training made
    # with another calibration, an evaluation of another training, stop here.
    train = provenance.read_record(args.train, inputs={"calibration": args.calibration})
    evaluation = provenance.read_record(args.eval, inputs={"train": args.train})
    sources = {"train": args.train, "eval": args.eval}
    if records.is_nlg(params["table"]):
        if evaluation.get("adapter_sha256") != io.file_sha256(args.train):
            stagekit.fail(log, f"{args.eval} scored another adapter than the one {args.train} describes; "
                               f"{how_to_recreate(args.eval)}")
        if args.hyps:
            check_hyps(args.hyps, evaluation, args.eval, log)
        carbon = carbon_record(train["energy"], params["pue"])
        costs = ({"scoring_s": float(provenance.read_sealed_npz(args.scorer_losses)["time_s"])}
                 if args.scorer_losses else {})
        cell = records.nlg_cell(params, train, evaluation, provenance.read_record(args.meta)["label"], carbon, costs)
    else:
        provenance.check_train(train, args.train)
        provenance.check_eval(evaluation, args.eval)
        if args.model:
            provenance.check_file(args.model, train.get("model_sha256"), args.train)
        if evaluation.get("model_sha256") != train.get("model_sha256"):
            stagekit.fail(log, f"{args.eval} evaluated another model than the one {args.train} records (model_sha256 "
                               f"{str(evaluation.get('model_sha256'))[:12]}... vs "
                               f"{str(train.get('model_sha256'))[:12]}...); {how_to_recreate(args.eval)}")
        calibration = (provenance.check_calibration(
            provenance.read_record(args.calibration, inputs={"baseline": args.baseline}), args.calibration)
            if args.calibration else None)
        baseline = provenance.check_train(provenance.read_record(args.baseline), args.baseline)
        carbon = carbon_record(train["energy"], params["pue"])
        costs = {}
        if args.scorer_train:
            costs["scorer_training_s"] = float(provenance.read_record(args.scorer_train)["time_s"])
        if calibration and calibration.get("feature_time_s") is not None:  # IDS: the scorer's feature pass
            costs["scorer_features_s"] = float(calibration["feature_time_s"])
        elif args.scorer_losses:
            costs["scoring_s"] = float(provenance.read_sealed_npz(args.scorer_losses)["time_s"])
        cell = records.image_cell(params, train, evaluation, baseline, calibration, carbon, costs)
        sources.update(baseline_train=args.baseline, calibration=args.calibration)
    provenance.write_record(args.out_carbon, carbon, inputs={"train": args.train})
    sources["carbon"] = args.out_carbon
    # The records the row was made from, by place and content (the cell's provenance: the
    # table stages read them again and check the figures copied from them).
    cell["sources"] = {name: Path(path).as_posix() for name, path in sources.items() if path}
    cell["sources_sha256"] = {name: io.file_sha256(path) for name, path in sources.items() if path}
    provenance.write_record(args.out_cell, cell, inputs=sources)
    if args.discard_checkpoint:
        checkpoint.discard(args.discard_checkpoint)
    log.info("cell %s/%s: %.1f s, %s, %.1f MiB, CO2e %s kg (Eq. 6: %s kg)", cell["model"], cell["cell"],
             cell["time_s"], f"BLEU {cell['BLEU']:.4f}" if "BLEU" in cell else f"top1 {cell['top1']:.2f} %",
             cell["peak_mem_bytes"] / 2**20, cell["co2e_kg"], cell["eq6_co2e_kg"])


if __name__ == "__main__":
    main()
