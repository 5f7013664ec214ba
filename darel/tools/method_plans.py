"""Every study method's plan at the calibrations a build made: planned epochs, how many of
them train on all the data, the samples planned and the predicted training seconds. It
answers "how many full epochs does InfoBatch train at this budget?" and sizes a study
before it runs (the predicted seconds of every method, budget and seed add up to its
training time).

    python -m darel.tools.method_plans                      # runs/<profile>/table1/<model>/s*/<budget>/calibration.json
    python -m darel.tools.method_plans --methods infobatch short-schedule --csv plans.csv
    python -m darel.tools.method_plans runs/quick/table1/resnet18/s0/t0.50_m0.55/calibration.json

Reads calibrations and params.yaml (the active profile's protocol, each method's own settings);
trains nothing.
"""

from __future__ import annotations

import argparse
import glob
import json
import sys
from pathlib import Path

import pandas as pd

from darel import config
from darel.plans import PlanError, method_plan


def plans_at(calibration: dict, *, methods: list[str], n_full: int, protocol: dict, params: dict) -> list[dict]:
    """One row per method: its plan at this calibration (or why it has none); ``params``
    the whole params (each method reads its own settings there)."""
    rows = []
    for method in methods:
        row = {"method": method, "t": calibration.get("t"), "m": calibration.get("m"),
               "batch": calibration.get("batch"), "t_max_s": calibration.get("t_max_s")}
        try:
            plan = method_plan(method, calibration, n_full=n_full, warmup_epochs=protocol["warmup_epochs"],
                               epochs=protocol["epochs"], params=params)
        except PlanError as err:
            rows.append({**row, "error": str(err)})
            continue
        kinds = plan.epoch_kinds[: plan.planned_epochs]
        full = sum(1 for kind in kinds if plan.epoch_samples.get(kind, 0) >= n_full)
        rows.append({**row, "planned_epochs": plan.planned_epochs, "full_data_epochs": full,
                     "protocol_epochs": protocol["epochs"], "planned_samples": round(plan.planned_samples),
                     "predicted_time_s": round(plan.predicted_time_s, 3),
                     "predicted_adherence": round(plan.predicted_adherence, 4)})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("calibrations", nargs="*", help="calibration.json files (default: the active profile's)")
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--methods", nargs="+", help="default: the study's methods for this profile")
    ap.add_argument("--data", help="the data folder (meta.json gives the training set's size; default data/<profile>)")
    ap.add_argument("--csv", help="also write the rows here")
    args = ap.parse_args(argv)
    try:
        cfg = config.load_params(args.params)
    except config.ConfigError as err:
        sys.exit(f"{err}\n(nothing was run: correct {args.params})")
    profile = cfg["profile"]
    paths = args.calibrations or sorted(glob.glob(f"runs/{profile}/table1/{args.model}/s*/t*_m*/calibration.json"))
    if not paths:
        print(f"no calibration found (runs/{profile}/table1/{args.model}/s*/t*_m*/calibration.json): build the "
              "study's budgets first, e.g. snakemake --cores 2 results/table1.csv", file=sys.stderr)
        return 2
    meta = json.loads((Path(args.data or f"data/{profile}") / "meta.json").read_text())
    protocol = config.model_protocol(cfg, args.model)
    methods = args.methods or config.study_methods(cfg)
    rows = []
    for path in paths:
        calibration = json.loads(Path(path).read_text())
        seed = Path(path).parts[-3]
        rows += [{"seed": seed, "budget": Path(path).parts[-2], **row}
                 for row in plans_at(calibration, methods=methods, n_full=int(meta["n_train"]), protocol=protocol,
                                     params=cfg)]
    frame = pd.DataFrame(rows)
    print(frame.to_string(index=False))
    if "predicted_time_s" in frame:
        per_seed = frame.groupby("seed")["predicted_time_s"].sum()
        print(f"\npredicted training seconds per seed, all listed methods and budgets: "
              + ", ".join(f"{seed} {value:.0f}" for seed, value in per_seed.items()))
    if args.csv:
        frame.to_csv(args.csv, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
