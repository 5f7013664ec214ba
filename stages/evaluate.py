"""Stage "evaluation": top-1 accuracy of a trained model on the test split. The workflow's
image trainings write the same record themselves (their ``--eval-out``, from the model in
memory); this stage evaluates a model file on its own (a model trained elsewhere, a rerun)."""

from __future__ import annotations

from pathlib import Path

from darel import stagekit


def main() -> None:
    ap = stagekit.parser(__doc__, "--data", "--model", "--out")
    args = ap.parse_args()
    params, log = stagekit.start(args, "evaluate", writes=Path(args.out).parent)
    _, split, model, spec, normalise = stagekit.model_on_split(params, args.data, args.model)
    # The model evaluated, by the sha256 its training recorded (load_model checked the file).
    stagekit.write_test_evaluation(args.out, model, split, normalise, spec, params,
                                   Path(args.model).with_name("train.json"), log)


if __name__ == "__main__":
    main()
