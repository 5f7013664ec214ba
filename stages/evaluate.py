"""Stage "evaluation": top-1 accuracy of a trained model on the test split."""

from __future__ import annotations

from pathlib import Path

from darel import evaluation, provenance, stagekit


def main() -> None:
    ap = stagekit.parser(__doc__, "--data", "--model", "--out")
    args = ap.parse_args()
    params, log = stagekit.start(args, "evaluate", writes=Path(args.out).parent)
    _, split, model, spec, normalise = stagekit.model_on_split(params, args.data, args.model)
    pred = evaluation.predictions(model, split["test_x"], normalise, params["eval_batch"], params["precision"])
    top1 = evaluation.accuracy_percent(pred, split["test_y"])
    # Rare and common classes apart where the data names its rare classes (the generated benchmark).
    rare = split["meta"].get("rare_classes")
    by_group = evaluation.rare_and_common_top1(pred, split["test_y"], rare) if rare else {}
    # The model evaluated, by the sha256 its training recorded (load_model checked the file).
    model_sha256 = provenance.read_record(Path(args.model).with_name("train.json"))["model_sha256"]
    provenance.write_record(args.out, {"top1": top1, **by_group, "n_test": len(split["test_y"]), "model_spec": spec,
                                       "model_sha256": model_sha256},
                            inputs={"train": Path(args.model).with_name("train.json")})
    log.info("top-1 %.2f %% on %d test images%s", top1, len(split["test_y"]),
             "".join(f"; {key} {value:.2f} %" for key, value in by_group.items()))


if __name__ == "__main__":
    main()
