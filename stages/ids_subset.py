"""Stage "IDS subset" (comparison row IDS + ADONIS): keep, per class, the samples chosen
by their distance to K-Means class prototypes in the scorer's penultimate feature
space, and write the row's plan.json: the fixed ADONIS online settings (A, eta, the
baseline batch, the kept count, no budget), which the online training stage plans the
row's run from (darel.methods.ids_adonis), as it plans a budget's from its calibration."""

from __future__ import annotations

import numpy as np

from pathlib import Path

from darel import evaluation, io, provenance, stagekit
from darel.measure import Stopwatch
from darel.ids import ids_select


def main() -> None:
    ap = stagekit.parser(__doc__)
    ap.add_argument("--data", required=True)
    ap.add_argument("--model", required=True, help="the scorer checkpoint (baseline model.pt)")
    ap.add_argument("--out-subset", required=True)
    ap.add_argument("--out-plan", required=True)
    args = ap.parse_args()
    params, log = stagekit.start(args, "ids_subset", writes=Path(args.out_subset).parent)
    ids = params["ids_adonis"]
    device, split = stagekit.device_and_split(params, args.data)
    model, _ = stagekit.load_model(args.model, device)
    _, normalise = stagekit.transforms(split["meta"], params["augment"], params["protocol"].get("input_size"))
    with Stopwatch(device) as watch:  # the scorer's feature pass: charged to the row in the total accounting
        features = evaluation.penultimate_features(model, split["train_x"], normalise, params["eval_batch"],
                                                       params["precision"])
    labels = split["train_y"].cpu().numpy()
    kept = ids_select(features.cpu().numpy(), labels, keep_ratio=ids["keep_ratio"],
                      clusters_per_class=ids["clusters_per_class"], distance=ids["distance"], keep=ids["keep"],
                      seed=params["seed"])
    plan = {"method": "ids+adonis", "batch": params["protocol"]["batch"], "alpha": ids["keep_ratio"],
            "A": ids["A"], "eta": ids["eta"], "t_max_s": None, "t": None, "m": None, "T_new_s": None,
            "m_max_bytes": None, "n_samples": int(len(labels)), "n_kept": int(len(kept)), "ids": ids,
            "feature_dim": int(features.shape[1]), "feature_time_s": watch.seconds,
            "produced_by": {"scorer_sha256": provenance.read_record(
                Path(args.model).with_name("train.json"))["model_sha256"]}}
    # The plan first: the subset names the sha256 of the file written beside it.
    provenance.write_record(args.out_plan, plan, inputs={"baseline": Path(args.model).with_name("train.json")})
    provenance.write_sealed_npz(args.out_subset, indices=kept.astype(np.int64), alpha=np.float64(ids["keep_ratio"]),
                                mode=np.str_(f"ids-{ids['distance']}-{ids['keep']}"),
                                calibration_sha256=np.str_(io.file_sha256(args.out_plan)),
                                inputs={"calibration": args.out_plan})
    log.info("IDS kept %d of %d samples (%s distance, keep %s, %d prototypes per class); ADONIS A %.2f eta %d",
             len(kept), len(labels), ids["distance"], ids["keep"], ids["clusters_per_class"], ids["A"], ids["eta"])


if __name__ == "__main__":
    main()
