"""Open MLflow on Table 1: `make mlflow-ui`.

Writes the table's saved view into the store (the experiment tag
``mlflow.sharedViewState.darel-<profile>``: the profile's cell runs, sorted by name, with
Table 1's columns, ours beside the paper's), prints the address that opens it, then runs
``mlflow ui`` on 127.0.0.1 (job execution off) until Ctrl-C. The address carries
``workflowType=machine_learning``: MLflow 3's UI otherwise opens an experiment on its
GenAI overview, whatever the experiment's kind. Where the address cannot be used, the
printed clicks lead to the same view by hand."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from darel import config
from darel.tracking import TABLE_VIEW_METRICS, TrackingError, prepare_table_view, redacted, scrub, table_view_url


def clicks(experiment: str, profile: str) -> list[str]:
    """The same view by hand, click by click."""
    columns = ", ".join(TABLE_VIEW_METRICS[experiment])
    return [f"Experiments -> {experiment}",
            "if the page shows GenAI (Overview, Traces): the sidebar's toggle at the top left -> Model training",
            "the Runs tab, then the table icon (Table view) above the runs",
            f"search box: tags.scope = 'table' and tags.profile = '{profile}' and tags.state = 'finished'",
            f"Columns -> Metrics: {columns}"]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--backend-store-uri", help="the MLflow store (default: tracking.uri of params.yaml)")
    ap.add_argument("--experiment", default="table1", choices=sorted(TABLE_VIEW_METRICS))
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=int(os.environ.get("MLFLOW_PORT", "5000")))
    ap.add_argument("--print-only", action="store_true", help="write the view and print the address; no server")
    args = ap.parse_args(argv)
    cfg = config.load_params(args.params)
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
              "\n\nThe same view by hand:")
        for number, step in enumerate(clicks(args.experiment, profile), 1):
            print(f"  {number}. {step}")
    sys.stdout.flush()
    if args.print_only:
        return
    mlflow = str(Path(sys.executable).with_name("mlflow"))
    os.environ["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"
    # The store through the environment, not the command line every user of the machine can read.
    os.environ["MLFLOW_BACKEND_STORE_URI"] = uri
    os.execv(mlflow, [mlflow, "ui", "--host", args.host, "--port", str(args.port)])


if __name__ == "__main__":
    main()
