"""Stage "study table": every (budget, method, seed) row of a study (results/study_<table>.csv),
the summary over seeds (mean, std, n), the trade-off plot, the verdict file (DAREL minus
each control, 95 % interval over seeds), with ``--composition`` the plot of what each
method trained on (the share of its sample-steps per group of the data, on a data set that
has the groups; a figure saying so on one that has none), and one MLflow run for the whole
study holding them as artifacts. ``--kind table1`` compares test top-1 at budgets B(t, m);
``--kind nlg`` compares BLEU at offline ratios alpha (Tables 2/3)."""

from __future__ import annotations

from darel import io, provenance, stagekit
from darel.config import split_nlg_cell
from darel.plots import composition_groups, plot_composition, plot_note, plot_study
from darel.study import (ACCOUNTINGS, NLG_ACCOUNTINGS, NLG_METRICS, PER_CLASS_FIGURES, PRIMARY, TABLE1_METRICS, assess,
                         fit_check, fit_rows, nlg_study_rows, stage_comparisons, stage_methods, variant_comparisons,
                         variant_methods, paired_differences, study_metrics, study_rows, summarize, trustworthy,
                         validation_checks, neighbour_note, validation_methods, verdict_markdown)
from darel.table1 import round_for_csv

KINDS = {
    "table1": dict(rows=study_rows, metrics=TABLE1_METRICS, metric="top1", unit="percentage points of test top-1",
                   ylabel="test top-1 (%)", what="test top-1 against training time at equal budgets", design=None,
                   accountings=ACCOUNTINGS, total_axis="total time (s): training + the scorer's training and scoring pass"),
    "nlg": dict(rows=nlg_study_rows, metrics=NLG_METRICS, metric="BLEU", unit="BLEU, 0-1 scale",
                ylabel="BLEU (0-1)", what="BLEU against fine-tuning time at equal offline ratios",
                design=("Compared: DAREL's subset (the share alpha of the pairs with the highest loss under the "
                        "pretrained model) against a random subset and the lowest-loss subset of the same size, "
                        "fine-tuned with the same LoRA settings, epochs and batch; paired: a seed shares the "
                        "baseline fine-tuning on all pairs and the LoRA initialisation. Learning-rate schedule: "
                        "each run's linear warm-up and decay over its own steps (every method ends fully "
                        "decayed; `study.schedule` does not apply)"),
                accountings=NLG_ACCOUNTINGS, total_axis="total time (s): fine-tuning + the scorer's scoring pass"),
}


def main() -> None:
    ap = stagekit.parser(__doc__)
    ap.add_argument("--kind", choices=sorted(KINDS), default="table1")
    ap.add_argument("--cells", nargs="+", required=True, help="cell JSONs: baselines, darel and controls")
    ap.add_argument("--out", required=True)
    ap.add_argument("--summary", required=True)
    ap.add_argument("--plot", required=True)
    ap.add_argument("--verdict", required=True)
    ap.add_argument("--metrics", help="JSON summary for `dvc metrics show`")
    ap.add_argument("--composition", help="PNG: each method's trained sample-steps by the data's per-sample groups")
    ap.add_argument("--no-mlflow", action="store_true")
    args = ap.parse_args()
    params, log = stagekit.start(args, "study_table")
    kind = KINDS[args.kind]
    cells = stagekit.read_cells(args.cells)  # each against the records it summarises
    rows = kind["rows"](cells)
    summary = summarize(rows, kind["metrics"])
    margin = params.get("margin", {}).get(kind["metric"])
    level, power, primary = params.get("level", 0.05), params.get("power", 0.8), params.get("primary")
    # DAREL minus each control in quality and in time under both accountings, each comparison in its
    # family: the declared primary analysis alone, the rest secondary (or all exploratory).
    figures = (kind["metric"], "time_s", "time_total_s", *(f for f in PER_CLASS_FIGURES if f in rows))
    # The study's own controls are tested apart (validation_checks); DAREL is never compared with them.
    validation = params.get("validation")
    compared = rows[~rows["method"].isin(validation_methods(validation))]
    checks = validation_checks(rows, kind["metric"], validation, level=level, power=power) \
        if kind["design"] is None else None
    diffs = assess({figure: paired_differences(compared, metric=figure, level=level, power=power)
                    for figure in figures},
                   primary=primary, schedule=params.get("schedule", "matched") if kind["design"] is None else None,
                   margins={kind["metric"]: margin}, level=level, power=power)
    # A study declared in the fitting regime: its baselines' fit records (stages/baseline_fit.py).
    fit = fit_rows([provenance.read_record(path) for path in params["fit_records"]], rows) \
        if params.get("fit_check") else None
    # DAREL's variants (darel.methods), each against random and DAREL: families of their own.
    variants = variant_comparisons(rows, variant_methods(list(rows["method"].unique())), kind["metric"],
                                   margin=margin, level=level, power=power) if kind["design"] is None else None
    # Each of DAREL's stages alone (darel.methods: stage_alone), against random: families of their own.
    stages = stage_comparisons(rows, stage_methods(list(rows["method"].unique())), kind["metric"],
                               margin=margin, level=level, power=power) if kind["design"] is None else None
    io.write_text(args.out, round_for_csv(rows).to_csv(index=False))
    io.write_text(args.summary, summary.round(4).to_csv(index=False))
    if args.metrics:
        io.write_json(args.metrics, study_metrics(summary, kind["metric"]))
    dataset = str(rows["dataset_label"].iloc[0])
    study = params["study"]
    plot_study(summary, args.plot, metric=kind["metric"], ylabel=kind["ylabel"],
               title=f"{study}, {params['profile']} profile"
                     + (f", schedule rule {params.get('schedule', 'matched')}" if kind["design"] is None else "")
                     + f": {kind['what']} ({dataset})",
               times=(("time_s", "training time (s)"),
                      ("time_total_s", kind["total_axis"])))
    if args.composition:
        write_composition(rows, args.composition, title=f"{study}, {params['profile']} profile: share of the trained "
                          f"sample-steps per group of the data, against the data's own share ({dataset})", log=log)
    io.write_text(args.verdict, verdict_markdown(
        diffs, summary, title=f"{study}: DAREL against simple controls", profile=params["profile"],
        dataset=dataset, seeds=params["seeds"], metric=kind["metric"], unit=kind["unit"],
        schedule=params.get("schedule", "matched"), margin=margin, level=level, power=power, primary=primary,
        design=kind["design"], accountings=kind["accountings"], checks=checks, validation=validation,
        neighbours=neighbour_note(rows), fit=fit, fit_criteria=params.get("fit_check"), variants=variants,
        rows=rows, stages=stages))
    if fit is not None:
        fits, line = fit_check(fit, params["fit_check"])
        (log.info if fits else log.warning)("%s: %s", study, line.replace("**", ""))
    if checks is not None:
        ok, reasons = trustworthy(checks, validation)
        if ok is not True:
            log.warning("%s: %s: %s", study, "NOT TRUSTWORTHY" if ok is False else "not validated", "; ".join(reasons))
    quality = diffs[kind["metric"]]
    log.info("%s: %d rows, %d (budget, method) groups, %d comparisons", study, len(rows), len(summary), len(quality))
    for row in quality.itertuples():
        log.info("%s %s %s vs %s: %+.4g [%+.4g, %+.4g] p_holm %.3g MDD %.3g -> %s", row.role, row.model, row.budget,
                 row.control, row.mean_diff, row.ci95_low, row.ci95_high, row.p_holm, row.mdd, row.verdict)
    if not any((frame.get("role") == PRIMARY).any() for frame in diffs.values() if not frame.empty):
        log.warning("%s: this run carries no primary analysis: every comparison is exploratory", study)
    if args.no_mlflow:
        return
    track_study(args, params, kind, cells, rows, log, dataset)


def write_composition(rows, path: str, *, title: str, log) -> None:
    """The composition plot of the study's rows, or, on a data set without per-sample groups
    (only the generated benchmark has them), a figure that says so: the workflow declares
    the file on every data set."""
    if not composition_groups(rows.columns):
        log.info("no per-sample groups on this data set: %s says so", path)
        plot_note(path, title=title, note="No per-sample groups on this data set: what each method trains on is "
                  "counted by group (clean, label-noise, near-duplicate, hard; rare classes) only on the generated "
                  "benchmark (synth).")
        return
    drawn = plot_composition(rows, path, title=title)
    groups = len(drawn[["model", "cell", "method"]].drop_duplicates())
    log.info("composition plot: %d (model, cell, method) groups, %s", groups, path)


def run_key(profile: str, cell: dict, kind: str) -> str:
    """The MLflow key of a study row's run: the controls' as their tracking jobs wrote them,
    the tables' own rows (darel, baselines) with the method appended."""
    method = cell["method"]
    parts = [profile, cell["model"], f"s{cell['seed']}", cell["cell"]]
    if method in ("darel", "baseline", "lora"):
        return "/".join(parts + ["baseline" if method == "lora" else method])
    return "/".join(parts + ([method] if kind == "table1" else []))


def track_study(args, params: dict, kind: dict, cells: list[dict], rows, log, dataset: str) -> None:
    """The study's MLflow experiment: one run per (cell, method, seed) (the controls logged
    theirs; the tables' darel and baseline rows are added here), runs no longer in the
    study deleted, and the study's files in a run of its own."""
    from darel.tracking import TrackingError, job_uri, log_cell_run

    study, profile = params["study"], params["profile"]
    derived = {}
    # The controls' runs are the ones their tracking jobs sealed; the tables' own rows get theirs here.
    run_ids = stagekit.sealed_run_ids([path for path, cell in zip(args.cells, cells)
                                       if cell["method"] not in ("darel", "baseline", "lora")])
    try:
        uri = job_uri(params["tracking_uri"])
        for path, cell in zip(args.cells, cells):
            key = run_key(profile, cell, args.kind)
            method = "baseline" if cell["method"] in ("lora", "baseline") else cell["method"]
            budget_cell = cell["cell"] if args.kind == "table1" else split_nlg_cell(cell["cell"])[0]
            row = rows[(rows["model"] == cell["model"]) & (rows["seed"] == cell["seed"])
                       & (rows["cell"] == budget_cell) & (rows["method"] == method)].iloc[0]
            figures = {k: row[k] for k in (kind["metric"], "time_s", "boost", "peak_mem_bytes", "co2e_kg") if k in row}
            derived[key] = figures
            if cell["method"] in ("darel", "baseline", "lora"):
                run_ids[key] = log_cell_run(uri, experiment=study, cell_key=key,
                             params={"model": cell["model"], "method": method, "cell": cell["cell"],
                                     "seed": cell["seed"], "profile": profile},
                             metrics=figures, curves={},
                             tags={"profile": profile, "source": f"the table's own run ({path})"}, artifacts=[path])
        args.tracking_uri, args.experiment, args.profile = params["tracking_uri"], study, profile
    except TrackingError as err:
        stagekit.fail(log, f"MLflow: {err}")
    files = [args.out, args.summary, args.plot, args.verdict] + ([args.composition] if args.composition else [])
    stagekit.follow_table(args, log, derived, files, run_ids=run_ids)


if __name__ == "__main__":
    main()
