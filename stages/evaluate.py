"""Stage "evaluation": top-1 accuracy of a trained model on the test split."""

from __future__ import annotations

from pathlib import Path

from darel import evaluation, provenance, stagekit


def main() -> None:
    ap = stagekit.parser(__doc__, "--data", "--model", "--out")
    args = ap.parse_args()
    params, log = stagekit.start(args, "evaluate", writes=Path(args.out).parent)
    _, split, model, spec, normalise = stagekit.model_on_split(params, args.data, args.model)
    top1 = evaluation.top1_percent(model, split["test_x"], split["test_y"], normalise, params["eval_batch"], params["precision"])
    # The model evaluated, by the sha256 its training recorded (load_model checked the file).
    model_sha256 = provenance.read_record(Path(args.model).with_name("train.json"))["model_sha256"]
    provenance.write_record(args.out, {"top1": top1, "n_test": len(split["test_y"]), "model_spec": spec,
                                       "model_sha256": model_sha256},
                            inputs={"train": Path(args.model).with_name("train.json")})
    log.info("top-1 %.2f %% on %d test images", top1, len(split["test_y"]))


if __name__ == "__main__":
    main()
