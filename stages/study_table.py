"""Stage "study table": every (budget, method, seed) row of a study (results/study_table1.csv),
the summary over seeds (mean, std, n), the trade-off plot and the verdict file (DAREL minus
each control, 95 % interval over seeds), and one MLflow run for the whole study holding
them as artifacts."""

from __future__ import annotations

from darel import io, stagekit
from darel.plots import plot_study
from darel.study import paired_differences, study_rows, summarize, verdict_markdown
from darel.table import round_for_csv


def main() -> None:
    ap = stagekit.parser(__doc__)
    ap.add_argument("--cells", nargs="+", required=True, help="cell JSONs: baselines, darel and controls")
    ap.add_argument("--out", required=True)
    ap.add_argument("--summary", required=True)
    ap.add_argument("--plot", required=True)
    ap.add_argument("--verdict", required=True)
    ap.add_argument("--no-mlflow", action="store_true")
    args = ap.parse_args()
    params, log = stagekit.start(args, "study_table")
    cells = [io.read_json(path) for path in args.cells]
    rows = study_rows(cells)
    summary = summarize(rows)
    diffs = paired_differences(rows)
    io.write_text(args.out, round_for_csv(rows).to_csv(index=False))
    io.write_text(args.summary, summary.round(4).to_csv(index=False))
    dataset = str(rows["dataset_label"].iloc[0])
    title = f"Study, {params['profile']} profile: top-1 against training time at equal budgets ({dataset})"
    plot_study(summary, args.plot, title=title)
    io.write_text(args.verdict, verdict_markdown(diffs, summary, profile=params["profile"], dataset=dataset,
                                                 seeds=params["seeds"]))
    log.info("study: %d rows, %d (budget, method) groups, %d comparisons", len(rows), len(summary), len(diffs))
    for row in diffs.itertuples():
        log.info("%s %s vs %s: %+.2f p.p. [%+.2f, %+.2f] -> %s", row.model, row.cell, row.control, row.mean_diff,
                 row.ci95_low, row.ci95_high, row.verdict)
    if args.no_mlflow:
        return
    from darel.tracking import log_cell_run

    metrics = {f"{r.control}_{r.cell}_diff_top1": r.mean_diff for r in diffs.itertuples()}
    run_id = log_cell_run(params["tracking_uri"], experiment="study_table1", cell_key=f"{params['profile']}/study",
                          params={"profile": params["profile"], "methods": ",".join(params["methods"]),
                                  "seeds": ",".join(str(s) for s in params["seeds"])},
                          metrics=metrics, curves={}, tags={"kind": "study", "dataset_label": dataset},
                          artifacts=[args.out, args.summary, args.plot, args.verdict])
    log.info("MLflow study run %s", run_id)


if __name__ == "__main__":
    main()
