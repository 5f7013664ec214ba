"""What a build produced and where: the tables, comparisons, plots and studies present
under results/, the MLflow store and the command that opens it. Printed by `make quick`
and `make tables` at the end."""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from darel import config


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--results", default="results")
    ap.add_argument("--params", default="params.yaml")
    args = ap.parse_args()
    results = Path(args.results)
    cfg = config.load_params(args.params)
    print()
    print(f"== Done ({cfg['profile']} profile) ==")
    for name, what in (("table1", "Table 1"), ("table2", "Table 2"), ("table3", "Table 3"),
                       ("study_table1", "Study (Table 1)"), ("study_table2", "Study (Table 2)"),
                       ("study_table3", "Study (Table 3)")):
        csv = results / f"{name}.csv"
        if not csv.exists():
            continue
        rows = len(pd.read_csv(csv))
        extras = [p for p in (results / f"{name}_vs_paper.md", results / f"{name}.md", results / f"{name}.png")
                  if p.exists()]
        print(f"{what:<16} {csv} ({rows} rows)" + "".join(f"\n{'':<16} {p}" for p in extras))
    uri = cfg["tracking"]["uri"]
    print(f"{'MLflow store':<16} {uri} (one run per cell; experiments table1, table2, table3, study_*)")
    print(f"{'open MLflow':<16} make mlflow-ui   (then http://127.0.0.1:5000)")
    print(f"{'cells, logs':<16} {results}/cells/{cfg['profile']}/, runs/{cfg['profile']}/, logs/{cfg['profile']}/")
    compare = results / "table1_vs_paper.md"
    if compare.exists():
        print(f"\nThe whole comparison with the paper: {compare}")


if __name__ == "__main__":
    main()
