"""Analysis of a study: per-seed rows, the summary over seeds and the verdicts of DAREL
against each control at the same budget. Pure functions over cell records and frames.

A study row has: model, cell (the budget: a Table 1 budget cell, or a Table 2/3 alpha
cell), method, seed, ``budget`` (its label), ``panel`` (the plot panel: the memory level
for Table 1, the model for Tables 2/3), the quality metric (top-1 or BLEU), the time
under both accountings (``time_s``: the training, as the paper counts; ``time_total_s``:
plus the scorer's training and its scoring pass for the methods that use them), the
ratios against the seed-matched baseline, and the samples trained against the plan.

A comparison of a budget pairs DAREL's figure with a control's on the same seeds (a seed
shares its baseline, scorer and calibration across methods): d_s = figure_darel(s) -
figure_control(s). Reported: the mean, a 95 % Student-t interval, the paired t-test's
p-value, that p-value adjusted over the study's family of comparisons of the same figure
(Holm-Bonferroni), and DAREL's wins (k of n seeds with d_s > 0). The verdict: "DAREL
better" / "DAREL worse" when the adjusted p-value is below the family-wise level
(``study.level``; "by less than the margin" added when the whole interval lies within
it); otherwise "equivalent" when the whole interval lies within the margin set in
params (``study.margin``), else "inconclusive", naming the interval's width.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from darel.table1 import headline_metrics, per_seed_rows

TABLE1_METRICS = ("top1", "time_s", "time_total_s", "boost", "peak_mem_bytes", "co2e_kg", "acc_drop_pp",
                  "budget_adherence", "epochs", "samples_vs_plan")
NLG_METRICS = ("BLEU", "TER", "METEOR", "NIST", "time_s", "time_total_s", "boost", "peak_mem_bytes", "co2e_kg")
REFERENCE = "darel"
BASELINE = "baseline"


def _cell_columns(rows: pd.DataFrame, cells: list[dict[str, Any]]) -> pd.DataFrame:
    """The cells' own figures beside the ratios: both accountings of time, the samples
    trained against the plan (``samples_vs_plan``), and the method's plan (plan_*)."""
    by_key = {(c["model"], c["cell"], c["method"], c.get("seed", 0)): c for c in cells}
    found = [by_key[(r.model, r.cell, r.method, r.seed)] for r in rows.itertuples()]
    rows["time_total_s"] = [c.get("time_total_s", c.get("time_s")) for c in found]
    rows["samples_trained"] = [c.get("samples_trained") for c in found]
    rows["planned_samples"] = [c.get("planned_samples") for c in found]
    rows["samples_vs_plan"] = [c["samples_trained"] / c["planned_samples"] if c.get("planned_samples") else math.nan
                               for c in found]
    plans = [c.get("plan") or {} for c in found]
    # Its scalar figures (the per-kind and per-epoch ones stay in the cell records).
    for key in sorted({key for plan in plans for key, value in plan.items() if not isinstance(value, (dict, list))}):
        rows[f"plan_{key}"] = [plan.get(key) for plan in plans]
    return rows


def study_rows(cells: list[dict[str, Any]]) -> pd.DataFrame:
    """Table 1 study: one row per (model, budget, method, seed) with Table 1's ratios
    against the seed-matched baseline and the method's plan (plan_* columns)."""
    rows = _cell_columns(per_seed_rows(cells), cells)
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
    if "time_total_s" not in rows:  # cells written before the total accounting
        rows["time_total_s"] = rows["time_s"]
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


def paired_test(differences: list[float]) -> dict:
    """Mean, sample std, n, the 95 % Student-t interval and the two-sided p-value of a
    paired t-test (the mean of the differences against zero)."""
    from scipy.stats import t as student

    n = len(differences)
    mean = sum(differences) / n if n else math.nan
    if n < 2:
        return {"n": n, "mean_diff": mean, "std_diff": math.nan, "ci95_low": math.nan, "ci95_high": math.nan,
                "p_value": math.nan}
    std = float(pd.Series(differences).std(ddof=1))
    half = t_quantile_975(n - 1) * std / math.sqrt(n)
    if std == 0:
        p = 1.0 if mean == 0 else 0.0
    else:
        p = float(2 * student.sf(abs(mean) / (std / math.sqrt(n)), n - 1))
    return {"n": n, "mean_diff": mean, "std_diff": std, "ci95_low": mean - half, "ci95_high": mean + half,
            "p_value": p}


def holm(p_values: list[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values of a family (NaN entries are left out of the
    family and stay NaN): the i-th smallest p times (m - i), made monotone, capped at 1."""
    order = sorted((p, i) for i, p in enumerate(p_values) if not math.isnan(p))
    m = len(order)
    adjusted = [math.nan] * len(p_values)
    running = 0.0
    for rank, (p, index) in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[index] = running
    return adjusted


# The words of a significant difference, by figure: a quality metric is better higher, a time lower.
_WORDS = {"higher": ("DAREL better", "DAREL worse"), "lower": ("DAREL slower", "DAREL faster")}


def verdict(test: dict, p_adjusted: float, *, margin: float | None, level: float, direction: str = "higher") -> str:
    """The words of one comparison (see the module's docstring); ``direction``: "higher"
    for a quality metric, "lower" for a time (DAREL minus control > 0 is then slower)."""
    if test["n"] < 2:
        return "no interval (one seed)"
    low, high = test["ci95_low"], test["ci95_high"]
    within = margin is not None and -margin <= low and high <= margin
    if not math.isnan(p_adjusted) and p_adjusted < level:
        above, below = _WORDS[direction]
        words = above if test["mean_diff"] > 0 else below
        return f"{words} (by less than the ±{margin:g} margin)" if within else words
    if within:
        return f"equivalent within ±{margin:g}"
    return f"inconclusive (95 % interval {high - low:.3g} wide)"


def paired_differences(rows: pd.DataFrame, metric: str = "top1", reference: str = REFERENCE, *,
                       margin: float | None = None, level: float = 0.05) -> pd.DataFrame:
    """Per (model, budget, control): DAREL's ``metric`` minus the control's over the shared
    seeds (``paired_test``), DAREL's wins, the p-value adjusted over every comparison of
    this metric in ``rows`` (Holm-Bonferroni) and the verdict."""
    out = []
    budgets = rows[rows["method"] == reference]
    for (model, cell), ref in budgets.groupby(["model", "cell"], sort=False):
        ref_by_seed = dict(zip(ref["seed"], pd.to_numeric(ref[metric])))
        others = rows[(rows["model"] == model) & (rows["cell"] == cell) & (rows["method"] != reference)]
        for method, ctrl in others.groupby("method", sort=False):
            pairs = [ref_by_seed[s] - v for s, v in zip(ctrl["seed"], pd.to_numeric(ctrl[metric]))
                     if s in ref_by_seed and not (math.isnan(v) or math.isnan(ref_by_seed[s]))]
            test = paired_test(pairs)
            out.append({"model": model, "cell": cell, "budget": ref["budget"].iloc[0], "control": method,
                        "metric": metric, **test, "wins": int(sum(d > 0 for d in pairs))})
    frame = pd.DataFrame(out)
    if frame.empty:
        return frame
    frame["p_holm"] = holm(list(frame["p_value"]))
    direction = "lower" if metric.startswith("time") else "higher"
    frame["verdict"] = [verdict(row, row["p_holm"], margin=margin, level=level, direction=direction)
                        for row in frame.to_dict("records")]
    return frame


ACCOUNTINGS = {"time_s": "training time, as the paper counts it",
               "time_total_s": "total time: training plus the scorer's training and its scoring pass for the "
                               "methods that use them"}
# Tables 2/3: the scorer is a pretrained LM, not trained for the task; only its scoring pass is charged.
NLG_ACCOUNTINGS = {"time_s": "fine-tuning time, as the paper counts it",
                   "time_total_s": "total time: fine-tuning plus the scorer's scoring pass for the methods that "
                                   "rank by its losses"}


def verdict_markdown(diffs: dict[str, pd.DataFrame], summary: pd.DataFrame, *, title: str, profile: str,
                     dataset: str, seeds: list[int], metric: str, unit: str, schedule: str, margin: float | None,
                     level: float, design: str | None = None, accountings: dict[str, str] | None = None) -> str:
    """The study's verdict file: what was compared, under which rules, and per budget
    DAREL minus each control in quality and in time under both accountings. ``diffs``:
    figure name (the quality metric, time_s, time_total_s) -> ``paired_differences``.
    ``design`` replaces the image studies' sentence on what is held equal and paired, and
    on the schedule rule (the fine-tuning studies hold alpha equal, not a budget)."""
    quality = diffs[metric]
    n_seeds = len(seeds)
    half_widths = ((quality["ci95_high"] - quality["ci95_low"]) / 2).dropna() if not quality.empty else pd.Series([])
    typical = float(half_widths.median()) if len(half_widths) else math.nan
    can = (f"with {n_seeds} paired seeds a 95 % interval of DAREL minus a control is typically ±{typical:.3g} "
           f"({unit}) wide, so differences smaller than that cannot be told apart from noise"
           if not math.isnan(typical) else "with one seed there is no interval: nothing can be concluded")
    lines = [f"# {title} ({profile} profile)", "",
             (design or
              ("Compared: DAREL against each control at the same budget (the cell's calibrated batch, the same cost "
               "model and time plan); paired: a seed shares baseline, scorer and calibration. Learning-rate "
               "schedule rule: "
               + ("**matched** (every method's schedule scaled to its own planned run, ending fully decayed)"
                  if schedule == "matched" else "**paper** (the protocol's milestones cut at the planned epochs)")))
             + f". Seeds: {n_seeds} ({', '.join(str(s) for s in seeds)}). Quality: {metric} ({unit}); "
             "time under two accountings: " +
             "; ".join(f"`{k}` = {v}" for k, v in (accountings or ACCOUNTINGS).items()) + ".", "",
             f"What this study can and cannot conclude: {can}; each p-value is adjusted over the study's "
             f"{len(quality)} comparisons of the same figure (Holm-Bonferroni, family-wise level {level:g})"
             + (f"; 'equivalent' means the whole interval lies within ±{margin:g}. " if margin is not None else ". ")
             + (f"These are {profile}-profile results on {dataset}: they test the methods at this scale, not the "
                "paper's claims on its data sets." if profile != "paper" else ""), "",
             f"- data: {dataset}",
             "- DAREL's wins: on how many of the seeds DAREL's figure is above the control's", ""]
    if quality.empty:
        return "\n".join(lines + ["No comparison: the study lists no control beside darel.", ""])
    for (model, cell), group in quality.groupby(["model", "cell"], sort=False):
        ref = summary[(summary["model"] == model) & (summary["cell"] == cell) & (summary["method"] == REFERENCE)]
        ref_text = ""
        if len(ref):
            r = ref.iloc[0]
            ref_text = f" — DAREL {metric} {r[f'{metric}_mean']:.4g} over {int(r['n'])} seed(s)"
        lines += [f"## {model}, {group['budget'].iloc[0]}{ref_text}", "",
                  f"| control | control {metric} | DAREL - control | 95 % interval | p (Holm) | wins | verdict | "
                  "time: DAREL - control | total time: DAREL - control |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for row in group.itertuples():
            ctrl = summary[(summary["model"] == model) & (summary["cell"] == cell) & (summary["method"] == row.control)]
            value = f"{ctrl.iloc[0][f'{metric}_mean']:.4g}" if len(ctrl) else "—"
            interval = "—" if math.isnan(row.ci95_low) else f"[{row.ci95_low:+.4g}, {row.ci95_high:+.4g}]"
            p = "—" if math.isnan(row.p_holm) else f"{row.p_holm:.3g}"
            times = []
            for figure in ("time_s", "time_total_s"):
                match = diffs.get(figure, pd.DataFrame())
                match = match[(match["model"] == model) & (match["cell"] == cell)
                              & (match["control"] == row.control)] if not match.empty else match
                times.append("—" if match.empty else f"{match.iloc[0]['mean_diff']:+.3g} s ({match.iloc[0]['verdict']})")
            lines.append(f"| {row.control} | {value} | {row.mean_diff:+.4g} | {interval} | {p} | {row.wins}/{row.n} | "
                         f"{row.verdict} | {times[0]} | {times[1]} |")
        lines.append("")
    return "\n".join(lines)


def study_metrics(summary: pd.DataFrame, metric: str) -> dict:
    """A study's headline figures for ``dvc metrics show`` and ``dvc exp show``: the mean
    over budgets and models of DAREL's and the baseline's quality metric and of DAREL's
    boost, and the number of methods compared (the details: the study's CSV and verdicts)."""
    def mean(method: str, column: str) -> float | None:
        values = pd.to_numeric(summary.loc[summary["method"] == method, column], errors="coerce").dropna() \
            if column in summary else pd.Series(dtype=float)
        return float(values.mean()) if len(values) else None

    return headline_metrics({f"{metric}_darel_mean": mean("darel", f"{metric}_mean"),
                             f"{metric}_baseline_mean": mean("baseline", f"{metric}_mean"),
                             "boost_mean": mean("darel", "boost_mean"),
                             "methods": summary["method"].nunique()})
