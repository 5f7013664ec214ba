"""Open MLflow on Table 1: `make mlflow-ui`.

Writes the table's saved view into the store (the experiment tag
``mlflow.sharedViewState.darel-<profile>``: the profile's cell runs in the table's order,
Table 1's columns, ours beside the paper's; listed in the experiment's Views menu), prints
the address that opens it and what its columns mean, then runs ``mlflow ui`` on 127.0.0.1
(job execution off) until Ctrl-C, as the MLflow app ``darel-ui`` (darel.tools.mlflow_app:
MLflow's own app, whose start page makes model training the browser's default and keeps
the assistant panel closed on the table's view). The address carries
``workflowType=machine_learning``, so it opens on the training runs in any browser. From
MLflow's home page the view is one click away: the experiment's Views menu."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from darel import config
from darel.tracking import (TABLE_VIEW_COLUMNS, TrackingError, prepare_table_view, redacted, scrub,
                            table_view_name, table_view_url)

# What Table 1's view shows, column by column (README, "Open MLflow").
TABLE1_LEGEND = ("the run's name ends in the budget (t0.80_m0.70: B(0.80, 0.70)); boost, drop (accuracy drop, "
                 "p.p.), mem (memory cut), CO2e (CO2e cut): ours, each followed by the paper's value for the same row "
                 "(`... paper`); adherence: measured time / t T; top1 in %; calibrated: batch/alpha/A/eta/epochs")


def clicks(experiment: str, profile: str) -> list[str]:
    """The same view from MLflow's home page."""
    return [f"Experiments -> {experiment}",
            f"Views (top right) -> {table_view_name(experiment, profile)}"]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--backend-store-uri", help="the MLflow store (default: tracking.uri of params.yaml)")
    ap.add_argument("--experiment", default="table1", choices=sorted(TABLE_VIEW_COLUMNS))
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=int(os.environ.get("MLFLOW_PORT", "5000")))
    ap.add_argument("--print-only", action="store_true", help="write the view and print the address; no server")
    args = ap.parse_args(argv)
    try:
        cfg = config.load_params(args.params)
    except config.ConfigError as err:
        sys.exit(f"{err}\n(nothing was run: correct {args.params})")
    uri, profile = args.backend_store_uri or cfg["tracking"]["uri"], cfg["profile"]
    try:
        experiment_id = prepare_table_view(uri, args.experiment, profile)
    except TrackingError as err:
        sys.exit(scrub(f"mlflow-ui: {err}"))
    base = f"http://{args.host}:{args.port}"
    if experiment_id is None:
        print(f"MLflow: no experiment {args.experiment} in {redacted(uri)} yet (build the table first: make quick); "
              f"the store opens at {base}")
    else:
        print(f"{args.experiment} ({profile} profile) in MLflow: open\n\n  {table_view_url(base, experiment_id, profile)}"
              "\n\nor from MLflow's home page: " + "; ".join(clicks(args.experiment, profile)))
        if args.experiment == "table1":
            print(f"Columns: {TABLE1_LEGEND}.")
    sys.stdout.flush()
    if args.print_only:
        return
    mlflow = str(Path(sys.executable).with_name("mlflow"))
    os.environ["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"
    # The store through the environment, not the command line every user of the machine can read.
    os.environ["MLFLOW_BACKEND_STORE_URI"] = uri
    os.execv(mlflow, [mlflow, "ui", "--app-name", "darel-ui", "--host", args.host, "--port", str(args.port)])


if __name__ == "__main__":
    main()
