"""Stage "table" for Tables 2/3: the cell JSONs into results/tableN.csv and the
side-by-side comparison with the paper."""

from __future__ import annotations

from darel import io, provenance, stagekit
from darel.nlg.tables import (
    CSV_DECIMALS,
    CSV_INTEGERS,
    build_nlg_table,
    compare_nlg_with_paper,
    load_paper_table,
    nlg_per_seed_rows,
)
from darel.table import round_for_csv


def main() -> None:
    ap = stagekit.parser(__doc__)
    ap.add_argument("--table", required=True, choices=["table2", "table3"])
    ap.add_argument("--cells", nargs="+", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--compare", required=True)
    ap.add_argument("--tracking-uri", help="MLflow store to keep in step with the table")
    ap.add_argument("--profile", help="the profile whose runs the table holds")
    args = ap.parse_args()
    _, log = stagekit.start(args, "nlg_table")
    cells = [provenance.read_record(path) for path in args.cells]
    table = build_nlg_table(cells)
    io.write_text(args.out, round_for_csv(table, CSV_DECIMALS, CSV_INTEGERS).to_csv(index=False))
    title = {"table2": "Table 2 (E2E-NLG)", "table3": "Table 3 (WebNLG 2017)"}[args.table]
    io.write_text(args.compare, compare_nlg_with_paper(table, load_paper_table(args.table), title))
    log.info("%s: %d rows -> %s", title, len(table), args.out)
    if args.tracking_uri:
        args.experiment = args.table
        derived = {"/".join([args.profile, row.model, f"s{row.seed}", row.cell]): {"boost": row.boost}
                   for row in nlg_per_seed_rows(cells).itertuples()}
        stagekit.follow_table(args, log, derived, [args.out, args.compare])


if __name__ == "__main__":
    main()
