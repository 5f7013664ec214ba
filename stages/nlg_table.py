"""Stage "table" for Tables 2/3: the cell JSONs into results/tableN.csv and the
side-by-side comparison with the paper."""

from __future__ import annotations

import pandas as pd

from darel import io, rebuilds, stagekit
from darel.nlg.tables import (
    CSV_DECIMALS,
    CSV_INTEGERS,
    build_nlg_table,
    compare_nlg_with_paper,
    load_paper_table,
    nlg_per_seed_rows,
)
from darel.table1 import headline_metrics, round_for_csv

# The table's own figures, rounded into each row's run; the scores stay as the cell
# measured them (the tests compare them with the cell record).
VIEW_FIGURES = ("alpha", "boost")


def main() -> None:
    ap = stagekit.table_parser(__doc__, "--out", "--compare")
    ap.add_argument("--table", required=True, choices=["table2", "table3"])
    args = ap.parse_args()
    _, log = stagekit.start(args, "nlg_table")
    cells = rebuilds.read_table_cells(args, log, args.table)
    table = build_nlg_table(cells)
    io.write_text(args.out, round_for_csv(table, CSV_DECIMALS, CSV_INTEGERS).to_csv(index=False))
    title = {"table2": "Table 2 (E2E-NLG)", "table3": "Table 3 (WebNLG 2017)"}[args.table]
    io.write_text(args.compare, compare_nlg_with_paper(table, load_paper_table(args.table), title))
    log.info("%s: %d rows -> %s", title, len(table), args.out)
    if args.metrics:
        darel, lora = table[table["method"] != "lora"], table[table["method"] == "lora"]
        io.write_json(args.metrics, headline_metrics({
            "boost_mean": darel["boost"].mean() if len(darel) else None,
            "boost_max": darel["boost"].max() if len(darel) else None,
            "BLEU_darel_mean": darel["BLEU"].mean() if len(darel) else None,
            "BLEU_baseline_mean": lora["BLEU"].mean() if len(lora) else None,
            "darel_rows": len(darel)}))  # the rows the DAREL means are over
    if args.tracking_uri:
        args.experiment = args.table
        # Rounded, as the experiment's saved view shows them (the MLflow UI prints every digit).
        derived = {"/".join([args.profile, str(row["model"]), f"s{row['seed']}", str(row["cell"])]):
                   {key: round(float(row[key]), 4) for key in VIEW_FIGURES
                    if key in row and pd.notna(row[key]) and not isinstance(row[key], str)}
                   for _, row in nlg_per_seed_rows(cells).iterrows()}
        stagekit.follow_table(args, log, derived, [p for p in (args.out, args.compare, args.metrics) if p],
                              run_ids=stagekit.sealed_run_ids(args.cells))


if __name__ == "__main__":
    main()
