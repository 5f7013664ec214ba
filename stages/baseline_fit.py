"""Stage "baseline fit": how well a seed's Table 1 baseline fits its own training set, for a
study declared in the fitting regime (``study.table1.fit_check``): top-1 of the saved model
in eval mode, no augmentation, on the whole training set against its observed labels
(clean and label-noise samples apart where the data records them), and its recorded
per-epoch test curve's last quarter (mean, range, least-squares rise). Trains nothing."""

from __future__ import annotations

from pathlib import Path

from darel import evaluation, provenance, stagekit
from darel.study import last_quarter


def main() -> None:
    ap = stagekit.parser(__doc__, "--data", "--model", "--out")
    args = ap.parse_args()
    params, log = stagekit.start(args, "baseline_fit")  # one file a seed: no folder to claim
    train_path = Path(args.model).with_name("train.json")
    train = provenance.read_record(train_path)
    curve = (train.get("curves") or {}).get("test_top1")
    if not curve:
        stagekit.fail(log, f"{train_path} records no per-epoch test curve (curves.test_top1)")
    _, split, model, _, normalise = stagekit.model_on_split(params, args.data, args.model)
    pred = evaluation.predictions(model, split["train_x"], normalise, params["eval_batch"], params["precision"])
    fit = evaluation.training_set_fit(pred, split["train_y"], split["train_columns"].get("category"))
    quarter = last_quarter(curve)
    provenance.write_record(args.out, {"model": params["model"], "seed": params["seed"], **fit,
                                       "n_train": len(split["train_y"]), "last_quarter": quarter,
                                       "model_sha256": train["model_sha256"]},
                            inputs={"train": train_path})
    log.info("%s seed %s: training top-1 %.2f %% on %d samples; test curve epochs %d-%d: mean %.2f, range %.2f, "
             "least-squares rise %+.2f pp", params["model"], params["seed"], fit["train_top1"], len(split["train_y"]),
             quarter["from_epoch"], quarter["to_epoch"], quarter["mean"], quarter["range_pp"], quarter["rise_pp"])


if __name__ == "__main__":
    main()
