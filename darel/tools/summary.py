"""What a build produced and where: the tables, comparisons, plots and studies present
under results/, the MLflow experiments that exist (with their runs), the command that
opens MLflow and the folders that exist. Only what exists is listed. Printed by `make
quick`, `make tables` and `make studies` at the end."""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from darel import config
from darel.tracking import printable, redacted
from darel.layout import Layout


def store_experiments(uri: str) -> dict[str, int]:
    """The MLflow store's experiments with their active runs (the Default experiment and
    empty ones left out); {} when the store does not exist or cannot be read."""
    from darel.tracking import _sqlite_path

    db = _sqlite_path(uri)
    if db is not None and not db.exists():
        return {}
    try:
        from mlflow.entities import ViewType
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=uri)
        found: dict[str, int] = {}
        for experiment in client.search_experiments(view_type=ViewType.ACTIVE_ONLY):
            runs = len(client.search_runs([experiment.experiment_id], run_view_type=ViewType.ACTIVE_ONLY,
                                          max_results=50_000))
            if runs and experiment.name != "Default":
                found[experiment.name] = runs
        return dict(sorted(found.items()))
    except Exception:  # noqa: BLE001 - a summary line, never a failure
        return {}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--params", default="params.yaml")
    args = ap.parse_args()
    cfg = config.load_params(args.params)
    layout = Layout(cfg["profile"])
    print()
    print(f"== Done ({cfg['profile']} profile) ==")
    for name, what in (("table1", "Table 1"), ("table2", "Table 2"), ("table3", "Table 3"),
                       ("study_table1", "Study (Table 1)"), ("study_table2", "Study (Table 2)"),
                       ("study_table3", "Study (Table 3)")):
        files = layout.study_outputs(name) if name.startswith("study_") else layout.table_outputs(name)
        csv = Path(files.get("csv") or files["rows"])
        if not csv.exists():
            continue
        rows = len(pd.read_csv(csv))
        extras = [Path(files[key]) for key in ("compare", "verdict", "plot") if key in files and Path(files[key]).exists()]
        print(f"{what:<16} {csv} ({rows} rows)" + "".join(f"\n{'':<16} {p}" for p in extras))
    uri = cfg["tracking"]["uri"]
    experiments = store_experiments(uri)
    shown = redacted(uri)  # never the password
    if experiments:
        # Names come from the store (anyone who can write to it): no terminal control characters.
        listed = ", ".join(f"{printable(name)} ({runs} runs)" for name, runs in experiments.items())
        print(f"{'MLflow store':<16} {shown}: {listed}")
        print(f"{'open MLflow':<16} make mlflow-ui   (prints the address of Table 1's view)")
    else:
        print(f"{'MLflow store':<16} {shown}: no experiment yet")
    folders = [Path(path) for path in (layout.cells, layout.runs, layout.log()) if Path(path).is_dir()]
    if folders:
        print(f"{'cells, logs':<16} " + ", ".join(f"{path}/" for path in folders))
    compare = Path(layout.table_outputs("table1")["compare"])
    if compare.exists():
        print(f"\nThe whole comparison with the paper: {compare}")


if __name__ == "__main__":
    main()
