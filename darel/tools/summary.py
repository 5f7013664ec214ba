"""What a build produced and where: Table 1's figures at a glance (what data they come
from, each model's baseline and DAREL rows beside the paper's, how many rows ran over
their time budget and how busy the machine was beside them),
the tables, comparisons, plots and studies present under results/, the MLflow experiments
that exist (with their runs), the command that opens MLflow and the folders that exist.
Only what exists is listed. Printed by `make quick`, `make tables` and `make studies` at
the end."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from darel import config, grammar
from darel.tracking import printable, redacted
from darel.layout import Layout


def store_experiments(uri: str, profile: str) -> dict[str, dict[str, int]]:
    """The MLflow store's experiments with their active runs, counted by what they are:
    ``cells`` (one per table row and seed of ``profile``: what the table's view shows),
    ``tables`` (the runs holding a table's files) and ``other`` (other profiles, DVC
    experiments, unfinished trainings); the Default experiment and empty ones left out; {}
    when the store does not exist or cannot be read."""
    from darel.tracking import _sqlite_path

    db = _sqlite_path(uri)
    if db is not None and not db.exists():
        return {}
    try:
        from mlflow.entities import ViewType
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=uri)
        found: dict[str, dict[str, int]] = {}
        for experiment in client.search_experiments(view_type=ViewType.ACTIVE_ONLY):
            runs = client.search_runs([experiment.experiment_id], run_view_type=ViewType.ACTIVE_ONLY,
                                      max_results=50_000)
            if not runs or experiment.name == "Default":
                continue
            counts = {"cells": 0, "tables": 0, "other": 0}
            for run in runs:
                tags = run.data.tags
                ours = tags.get("profile") == profile and tags.get("scope") == "table"
                if ours and tags.get("kind") == "table":
                    counts["tables"] += 1
                elif ours and tags.get("state") == "finished":
                    counts["cells"] += 1
                else:
                    counts["other"] += 1
            found[experiment.name] = counts
        return dict(sorted(found.items()))
    except Exception:  # noqa: BLE001 - a summary line, never a failure
        return {}


def describe_runs(name: str, counts: dict[str, int], profile: str) -> str:
    """One experiment's runs in words: "table1 (16 cell runs + 1 with the table's files)"."""
    parts = [f"{counts['cells']} cell runs of the {profile} profile"]
    if counts["tables"]:
        parts.append(f"{counts['tables']} with the table's files")
    if counts["other"]:
        parts.append(f"{counts['other']} other (other profiles, DVC experiments, unfinished)")
    return f"{name} ({' + '.join(parts)})"


def describe_rows(table: pd.DataFrame) -> str:
    """A table's rows in words, by method when it has one: "16 rows: 2 baseline, 13 darel, 1 ids+adonis"."""
    if "method" not in table or not len(table):
        return f"{len(table)} rows"
    counts = table["method"].astype(str).value_counts(sort=False)
    return f"{len(table)} rows: " + ", ".join(f"{count} {method}" for method, count in counts.items())


def _span(values: pd.Series, unit: str, decimals: int) -> str:
    low, high = values.min(), values.max()
    if pd.isna(low):
        return "n/a"
    if round(low, decimals) == round(high, decimals):
        return f"{low:.{decimals}f}{unit}"
    return f"{low:.{decimals}f}-{high:.{decimals}f}{unit}"


def _paper_spans(model: str, darel: pd.DataFrame) -> tuple[str, str]:
    """The span of the paper's boost and top-1 drop over the budgets of ``darel`` it reports."""
    from darel.table1 import load_paper_table1, paper_figures

    paper, baselines = load_paper_table1()
    theirs = [paper_figures(model, "darel", row["t"], row["m"], paper, baselines) for _, row in darel.iterrows()]
    theirs = pd.DataFrame([figures for figures in theirs if figures], columns=["boost", "acc_drop_pp"])
    if not len(theirs):
        return "", ""
    of = "" if len(theirs) == len(darel) else f" over {len(theirs)} of them"
    return (f" (the paper's {_span(theirs['boost'], 'x', 2)}{of})",
            f" (the paper's {_span(theirs['acc_drop_pp'], ' pp', 1)}{of})")


def _load_beside(over: pd.DataFrame) -> str:
    """The machine's load while the rows over budget ran, from their ``cores_beside``."""
    cores = pd.to_numeric(over.get("cores_beside", pd.Series(dtype=float)), errors="coerce")
    if not len(cores) or cores.isna().all():
        return "the load beside them not recorded"
    return f"{_span(cores, '', 1)} other cores busy beside them, 0 on an idle machine"


def table1_glance(table: pd.DataFrame) -> list[str]:
    """Table 1 in a few lines: the data its figures come from (a GENERATED label when the
    data is not the paper's), then per model the baseline's top-1 beside the paper's and
    the span of the DAREL rows' boost and top-1 drop beside the paper's over the same
    budgets; under it how many of them ran over their time budget (``budget_adherence``
    above table1.ADHERENCE_LIMIT, the comparison's bold rows) and the machine's load
    beside those (``cores_beside``)."""
    from darel.table1 import ADHERENCE_LIMIT, load_paper_table1

    _, paper_baselines = load_paper_table1()
    lines = []
    labels = sorted({str(label) for label in table.get("dataset_label", pd.Series(dtype=str)).dropna()})
    for label in labels:
        lines.append(f"{'data':<16} {label}")
        if label.startswith(grammar.GENERATED_DATA):
            lines.append(f"{'':<16} (not the paper's data: these figures test the methods at this scale; they are not "
                         "the paper's results)")
    for model, rows in table.groupby("model", sort=False):
        base = rows[rows["method"] == "baseline"]
        darel = rows[rows["method"] == "darel"]
        theirs = paper_baselines[(paper_baselines["model"] == model) & (paper_baselines["method"] == "baseline")]
        paper_top1 = f" (the paper's {theirs['top1'].iloc[0]:.2f} %)" if len(theirs) else ""
        parts = [f"baseline top-1 {base['top1'].iloc[0]:.2f} %{paper_top1}" if len(base) else "no baseline row"]
        budget_line = None
        if len(darel):
            over = darel[darel["budget_adherence"] > ADHERENCE_LIMIT]
            paper_boost, paper_drop = _paper_spans(str(model), darel) if {"t", "m"} <= set(darel) else ("", "")
            plural = "s" if len(darel) != 1 else ""
            parts.append(f"{len(darel)} DAREL row{plural}: boost {_span(darel['boost'], 'x', 2)}{paper_boost}, "
                         f"top-1 drop {_span(darel['acc_drop_pp'], ' pp', 1)}{paper_drop}")
            budget_line = (f"{'':<16} {len(over)} of {len(darel)} over their time budget"
                           + (f" (measured time up to {darel['budget_adherence'].max():.2f} x t T; "
                              f"{_load_beside(over)})" if len(over) else ""))
        lines.append(f"{printable(str(model)):<16} " + "; ".join(parts))
        if budget_line:
            lines.append(budget_line)
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--params", default="params.yaml")
    args = ap.parse_args()
    try:
        cfg = config.load_params(args.params)
    except config.ConfigError as err:
        sys.exit(f"{err}\n(nothing was run: correct {args.params})")
    layout = Layout(cfg["profile"])
    print()
    print(f"== Done ({cfg['profile']} profile) ==")
    table1_csv = Path(layout.table_outputs("table1")["csv"])
    if table1_csv.exists():
        for line in table1_glance(pd.read_csv(table1_csv)):
            print(line)
        print()
    for name, what in (("table1", "Table 1"), ("table2", "Table 2"), ("table3", "Table 3"),
                       ("study_table1", "Study (Table 1)"), ("study_table2", "Study (Table 2)"),
                       ("study_table3", "Study (Table 3)")):
        files = (layout.study_outputs(name, composition=name == "study_table1") if name.startswith("study_")
                 else layout.table_outputs(name))
        csv = Path(files.get("csv") or files["rows"])
        if not csv.exists():
            continue
        rows = describe_rows(pd.read_csv(csv))
        extras = [Path(files[key]) for key in ("compare", "verdict", "plot", "composition")
                  if key in files and Path(files[key]).exists()]
        print(f"{what:<16} {csv} ({rows})" + "".join(f"\n{'':<16} {p}" for p in extras))
    uri = cfg["tracking"]["uri"]
    experiments = store_experiments(uri, cfg["profile"])
    shown = redacted(uri)  # never the password
    if experiments:
        # Names come from the store (anyone who can write to it): no terminal control characters.
        listed = ", ".join(describe_runs(printable(name), counts, cfg["profile"]) for name, counts in experiments.items())
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
