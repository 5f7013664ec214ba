"""Analysis of a study: per-seed rows, the summary over seeds and the verdict of DAREL
against each control at the same budget. Pure functions over cell records and frames.

A study row has: model, cell (the budget: a Table 1 budget cell, or a Table 2/3 alpha
cell), method, seed, ``budget`` (its label), ``panel`` (the plot panel: the memory level
for Table 1, the model for Tables 2/3), the quality metric (top-1 or BLEU), time_s and
the ratios against the seed-matched baseline.

The verdict of a budget compares DAREL's metric with each control's on the same seeds
(paired: a seed shares its baseline, its scorer and its calibration across methods):
d_s = metric_darel(s) - metric_control(s), with a 95 % Student-t interval of the mean
over seeds. "better" when the whole interval is above zero, "worse" when below, "no
detectable difference" otherwise; with one seed there is no interval and no verdict.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from darel.table import per_seed_rows

TABLE1_METRICS = ("top1", "time_s", "boost", "peak_mem_bytes", "co2e_kg", "acc_drop_pp", "budget_adherence",
                  "epochs")
NLG_METRICS = ("BLEU", "TER", "METEOR", "NIST", "time_s", "boost", "peak_mem_bytes", "co2e_kg")
REFERENCE = "darel"
BASELINE = "baseline"


def _plan_columns(rows: pd.DataFrame, cells: list[dict[str, Any]]) -> pd.DataFrame:
    plans = {(c["model"], c["cell"], c["method"], c.get("seed", 0)): c.get("plan") or {} for c in cells}
    keys = sorted({key for plan in plans.values() for key in plan})
    for key in keys:
        rows[f"plan_{key}"] = [plans[(r.model, r.cell, r.method, r.seed)].get(key) for r in rows.itertuples()]
    return rows


def study_rows(cells: list[dict[str, Any]]) -> pd.DataFrame:
    """Table 1 study: one row per (model, budget, method, seed) with Table 1's ratios
    against the seed-matched baseline and the method's plan (plan_* columns)."""
    rows = _plan_columns(per_seed_rows(cells), cells)
    rows["budget"] = [BASELINE if pd.isna(t) else f"B(t={t:.2f}, m={m:.2f})" for t, m in zip(rows["t"], rows["m"])]
    rows["panel"] = [None if pd.isna(m) else f"memory level m = {m:.2f}" for m in rows["m"]]
    return rows.sort_values(["model", "t", "m", "method", "seed"], ascending=[True, False, False, True, True],
                            na_position="first", kind="stable").reset_index(drop=True)


def nlg_study_rows(cells: list[dict[str, Any]]) -> pd.DataFrame:
    """Table 2/3 study: one row per (model, alpha, method, seed); the LoRA baseline is the
    baseline, ``cell`` the alpha cell shared by darel and its controls."""
    from darel.config import split_nlg_cell
    from darel.nlg.tables import nlg_per_seed_rows

    rows = nlg_per_seed_rows(cells)
    rows["method"] = [BASELINE if m == "lora" else m for m in rows["method"]]
    rows["cell"] = [split_nlg_cell(c)[0] for c in rows["cell"]]
    rows["budget"] = [BASELINE if pd.isna(a) else f"alpha = {a:.2f}" for a in rows["alpha"]]
    rows["panel"] = rows["model"]
    return rows.sort_values(["model", "alpha", "method", "seed"], ascending=[True, False, True, True],
                            na_position="first", kind="stable").reset_index(drop=True)


def summarize(rows: pd.DataFrame, metrics: tuple[str, ...] = TABLE1_METRICS) -> pd.DataFrame:
    """Mean, std (sample) and n over seeds of each metric, per (model, budget, method)."""
    out = []
    for (model, cell, method), group in rows.groupby(["model", "cell", "method"], sort=False):
        first = group.iloc[0]
        record: dict[str, Any] = {"model": model, "cell": cell, "method": method, "budget": first["budget"],
                                  "panel": first["panel"], "n": int(len(group))}
        for column in ("t", "m", "alpha"):
            if column in group:
                record[column] = first[column]
        for metric in metrics:
            values = pd.to_numeric(group[metric], errors="coerce").dropna() if metric in group else pd.Series([])
            record[f"{metric}_mean"] = float(values.mean()) if len(values) else math.nan
            record[f"{metric}_std"] = float(values.std(ddof=1)) if len(values) > 1 else math.nan
        out.append(record)
    return pd.DataFrame(out)


def t_quantile_975(dof: int) -> float:
    from scipy.stats import t

    return float(t.ppf(0.975, dof))


def paired_differences(rows: pd.DataFrame, metric: str = "top1", reference: str = REFERENCE) -> pd.DataFrame:
    """Per (model, budget, control): mean over seeds of reference minus control, its
    sample std, n, the 95 % interval and the verdict."""
    out = []
    budgets = rows[rows["method"] == reference]
    for (model, cell), ref in budgets.groupby(["model", "cell"], sort=False):
        ref_by_seed = dict(zip(ref["seed"], pd.to_numeric(ref[metric])))
        others = rows[(rows["model"] == model) & (rows["cell"] == cell) & (rows["method"] != reference)]
        for method, ctrl in others.groupby("method", sort=False):
            pairs = [ref_by_seed[s] - v for s, v in zip(ctrl["seed"], pd.to_numeric(ctrl[metric]))
                     if s in ref_by_seed and not (math.isnan(v) or math.isnan(ref_by_seed[s]))]
            n = len(pairs)
            mean = sum(pairs) / n if n else math.nan
            std = float(pd.Series(pairs).std(ddof=1)) if n > 1 else math.nan
            half = t_quantile_975(n - 1) * std / math.sqrt(n) if n > 1 else math.nan
            low, high = mean - half, mean + half
            if n < 2:
                verdict = "no interval (one seed)"
            elif low > 0:
                verdict = "better"
            elif high < 0:
                verdict = "worse"
            else:
                verdict = "no detectable difference"
            out.append({"model": model, "cell": cell, "budget": ref["budget"].iloc[0], "control": method,
                        "metric": metric, "n": n, "mean_diff": mean, "std_diff": std, "ci95_low": float(low),
                        "ci95_high": float(high), "verdict": verdict})
    return pd.DataFrame(out)


def verdict_markdown(diffs: pd.DataFrame, summary: pd.DataFrame, *, title: str, profile: str, dataset: str,
                     seeds: list[int], metric: str, unit: str) -> str:
    """The study's verdict file: per budget, DAREL's metric minus each control's."""
    lines = [f"# {title} ({profile} profile)", "",
             f"- data: {dataset}",
             f"- seeds: {', '.join(str(s) for s in seeds)} (paired: a seed shares baseline, scorer and calibration)",
             f"- difference: DAREL {metric} minus the control's ({unit}); mean over seeds and a 95 % Student-t "
             "interval; the verdict comes from the interval alone (better / no detectable difference / worse)", ""]
    if profile != "paper":
        lines += ["> Not the paper profile: small-scale results that test the pipeline and the methods on this "
                  "data, not claims about the paper's data sets.", ""]
    if diffs.empty:
        return "\n".join(lines + ["No comparison: the study lists no control beside darel.", ""])
    for (model, cell), group in diffs.groupby(["model", "cell"], sort=False):
        ref = summary[(summary["model"] == model) & (summary["cell"] == cell) & (summary["method"] == REFERENCE)]
        ref_text = ""
        if len(ref):
            r = ref.iloc[0]
            ref_text = f" — DAREL {metric} {r[f'{metric}_mean']:.4g} over {int(r['n'])} seed(s)"
        lines += [f"## {model}, {group['budget'].iloc[0]}{ref_text}", "",
                  f"| control | control {metric} | DAREL - control | 95 % interval | n | verdict |",
                  "|---|---|---|---|---|---|"]
        for row in group.itertuples():
            ctrl = summary[(summary["model"] == model) & (summary["cell"] == cell) & (summary["method"] == row.control)]
            value = f"{ctrl.iloc[0][f'{metric}_mean']:.4g}" if len(ctrl) else "—"
            interval = "—" if math.isnan(row.ci95_low) else f"[{row.ci95_low:+.4g}, {row.ci95_high:+.4g}]"
            lines.append(f"| {row.control} | {value} | {row.mean_diff:+.4g} | {interval} | {row.n} | {row.verdict} |")
        lines.append("")
    return "\n".join(lines)


def study_metrics(summary: pd.DataFrame, metric: str) -> dict:
    """The summary as nested JSON for ``dvc metrics show``: model -> budget -> method ->
    mean/std/n of the quality metric, time and boost."""
    out: dict = {}
    for row in summary.itertuples(index=False):
        record = row._asdict()
        entry = {"n": int(record["n"])}
        for key in (f"{metric}_mean", f"{metric}_std", "time_s_mean", "boost_mean"):
            value = record.get(key)
            if value is not None and not (isinstance(value, float) and math.isnan(value)):
                entry[key] = round(float(value), 6)
        out.setdefault(str(record["model"]), {}).setdefault(str(record["budget"]), {})[str(record["method"])] = entry
    return out
