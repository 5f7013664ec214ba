"""Stage "table1": gathers the cell JSONs of Table 1 into results/table1.csv, writes the
side-by-side comparison with the paper (Markdown) and the boost vs accuracy-drop plot."""

from __future__ import annotations

from darel import io, rebuilds, stagekit
from darel.plots import plot_table1
from darel.table1 import (attention, build_table1, compare_with_paper, gap_reasons, load_paper_table1,
                          mlflow_row_figures, per_seed_rows, round_for_csv, table1_row_numbers, table_metrics)


def model_sizes(cells: list[dict]) -> str:
    """Parameters and multiply-accumulates per image of each model, from its baseline cell."""
    lines = ["", "## Model sizes", "", "| model | parameters | MACs per image | input |", "|---|---|---|---|"]
    for cell in cells:
        if cell["method"] == "baseline" and cell.get("n_params"):
            lines.append(f"| {cell['model']} | {cell['n_params']:,} | {cell['macs_per_image']:,} | "
                         f"{cell.get('input_shape')} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = stagekit.table_parser(__doc__, "--out")  # --out: Table 1 as CSV; --metrics: every row's ratios
    ap.add_argument("--compare", help="Markdown comparison with the paper's Table 1")
    ap.add_argument("--plot", help="PNG: boost vs accuracy drop per model")
    ap.add_argument("--experiment", default="table1")
    args = ap.parse_args()
    _, log = stagekit.start(args, "table1")

    cells = rebuilds.read_table_cells(args, log, args.experiment)
    table = build_table1(cells)
    io.write_text(args.out, round_for_csv(table).to_csv(index=False))
    log.info("Table 1: %d rows from %d cells -> %s", len(table), len(cells), args.out)
    if args.metrics:
        io.write_json(args.metrics, table_metrics(table))
    paper, baselines = load_paper_table1()
    if args.compare:
        comparison = compare_with_paper(table, paper, baselines, gap_reasons(table, cells, paper, baselines),
                                        attention(table, paper, baselines, cells))
        io.write_text(args.compare, comparison + model_sizes(cells))
        log.info("comparison with the paper -> %s", args.compare)
    if args.plot:
        profiles = ", ".join(str(v) for v in dict.fromkeys(table["profile"]))
        datasets = "; ".join(str(v) for v in dict.fromkeys(table["dataset_label"]))
        plot_table1(table, args.plot, paper=paper, baselines=baselines,
                    title=f"Table 1, {profiles} profile: boost against accuracy drop, ours and the paper's for the "
                          "same budget",
                    caption=f"{profiles} profile, data: {datasets}. Filled blue dot: our row for a budget B(t, m) "
                            "or method, numbered as in the key; hollow red circle: the paper's Table 1 row for the "
                            "same budget or method (CIFAR-100; IDS + ADONIS from its time and top-1); grey line: "
                            "joins the two; black dot: the baseline (boost 1, drop 0).")
        log.info("plot -> %s", args.plot)
    if args.tracking_uri:
        # Each row's run gets the table's figures rounded, the paper's beside them and its row
        # number (the view's order), which the experiment's saved view shows as Table 1.
        figures = mlflow_row_figures(per_seed_rows(cells), paper, baselines, table1_row_numbers(table))
        derived = {"/".join([args.profile, model, f"s{seed}", cell]): values
                   for (model, seed, cell), values in figures.items()}
        stagekit.follow_table(args, log, derived, [p for p in (args.out, args.compare, args.plot, args.metrics) if p],
                              run_ids=stagekit.sealed_run_ids(args.cells))


if __name__ == "__main__":
    main()
