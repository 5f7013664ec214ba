"""Analysis of a study: per-seed rows, the summary over seeds and the verdict of DAREL
against each control at the same budget. Pure functions over cell records and frames.

The verdict of a budget compares DAREL's top-1 with each control's on the same seeds
(paired: a seed shares its baseline, its scorer and its calibration across methods):
d_s = top1_darel(s) - top1_control(s), with a 95 % Student-t interval of the mean over
seeds. "better" when the whole interval is above zero, "worse" when below, "no
detectable difference" otherwise; with one seed there is no interval and no verdict.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from darel.table import per_seed_rows

SUMMARY_METRICS = ("top1", "time_s", "boost", "peak_mem_bytes", "co2e_kg", "acc_drop_pp", "budget_adherence",
                   "epochs")
REFERENCE = "darel"


def study_rows(cells: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per (model, budget, method, seed) with the Table 1 ratios against the
    seed-matched baseline, and the method's plan flattened (plan_* columns)."""
    rows = per_seed_rows(cells)
    plans = [cell.get("plan") or {} for cell in cells]
    keys = sorted({key for plan in plans for key in plan})
    order = {(c["model"], c["cell"], c["method"], c["seed"]): i for i, c in enumerate(cells)}
    for key in keys:
        rows[f"plan_{key}"] = [plans[order[(r.model, r.cell, r.method, r.seed)]].get(key)
                               for r in rows.itertuples()]
    return rows.sort_values(["model", "t", "m", "method", "seed"], ascending=[True, False, False, True, True],
                            na_position="first", kind="stable").reset_index(drop=True)


def summarize(rows: pd.DataFrame) -> pd.DataFrame:
    """Mean, std (sample) and n over seeds of each metric, per (model, t, m, method)."""
    out = []
    for (model, cell, method), group in rows.groupby(["model", "cell", "method"], sort=False):
        record: dict[str, Any] = {"model": model, "cell": cell, "method": method, "t": group["t"].iloc[0],
                                  "m": group["m"].iloc[0], "n": int(len(group))}
        for metric in SUMMARY_METRICS:
            values = pd.to_numeric(group[metric], errors="coerce").dropna()
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
            std = pd.Series(pairs).std(ddof=1) if n > 1 else math.nan
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
            out.append({"model": model, "cell": cell, "t": ref["t"].iloc[0], "m": ref["m"].iloc[0],
                        "control": method, "metric": metric, "n": n, "mean_diff": mean, "std_diff": float(std),
                        "ci95_low": float(low), "ci95_high": float(high), "verdict": verdict})
    return pd.DataFrame(out)


def verdict_markdown(diffs: pd.DataFrame, summary: pd.DataFrame, *, profile: str, dataset: str,
                     seeds: list[int]) -> str:
    """The study's verdict file: per budget, DAREL's top-1 minus each control's."""
    lines = [f"# Study: DAREL against simple controls at the same budget ({profile} profile)", "",
             f"- data: {dataset}",
             f"- seeds: {', '.join(str(s) for s in seeds)} (paired: a seed shares baseline, scorer and calibration)",
             "- difference: DAREL top-1 minus the control's, in percentage points; mean over seeds and a 95 % "
             "Student-t interval; verdict from the interval only (better / no detectable difference / worse)", ""]
    if profile != "paper":
        lines += ["> Not the paper profile: these are small-scale results that test the pipeline and the methods "
                  "on this data, not claims about CIFAR-100.", ""]
    for (model, cell), group in diffs.groupby(["model", "cell"], sort=False):
        t, m = group["t"].iloc[0], group["m"].iloc[0]
        ref = summary[(summary["model"] == model) & (summary["cell"] == cell) & (summary["method"] == REFERENCE)]
        ref_text = ""
        if len(ref):
            r = ref.iloc[0]
            ref_text = f" — DAREL top-1 {r['top1_mean']:.2f} % over {int(r['n'])} seed(s)"
        lines += [f"## {model}, B(t={t:.2f}, m={m:.2f}){ref_text}", "",
                  "| control | control top-1 | DAREL - control (p.p.) | 95 % interval | n | verdict |",
                  "|---|---|---|---|---|---|"]
        for row in group.itertuples():
            ctrl = summary[(summary["model"] == model) & (summary["cell"] == cell) & (summary["method"] == row.control)]
            ctrl_top1 = f"{ctrl.iloc[0]['top1_mean']:.2f}" if len(ctrl) else "—"
            interval = "—" if math.isnan(row.ci95_low) else f"[{row.ci95_low:+.2f}, {row.ci95_high:+.2f}]"
            lines.append(f"| {row.control} | {ctrl_top1} | {row.mean_diff:+.2f} | {interval} | {row.n} | "
                         f"{row.verdict} |")
        lines.append("")
    return "\n".join(lines)
