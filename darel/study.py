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
p-value, DAREL's wins (k of n seeds with d_s > 0), and within the comparison's family the
Holm-Bonferroni adjusted p-value, the level its Holm step used and the minimum detectable
difference at the study's power (``study.power``) from the observed standard deviation of
the d_s at that level. The verdict: "DAREL better" / "DAREL worse" when the adjusted
p-value is below the family-wise level (``study.level``; "by less than the margin" added
when the whole interval lies within it); otherwise "equivalent" when the whole interval
lies within the margin, else "inconclusive", naming the interval's width.

Families (``assess``): a study declares one primary analysis before its runs
(``study.<table>.primary``: metric, budgets or alphas, controls, margin, and for Table 1
the schedule rule). Its comparisons form the primary family, adjusted alone; every other
comparison is secondary, adjusted with the others of its figure, and never a headline. A
run that does not carry the declaration (another schedule rule, none declared) has only
exploratory comparisons. ``seeds_needed`` turns a pilot's standard deviation and the margin
into a number of seeds (darel.tools.seeds).
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from darel.composition import flat_columns
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
    # what else kept the machine busy while the run's time was measured (None: not measured)
    rows["cores_beside"] = [c.get("cores_beside") for c in found]
    rows["samples_trained"] = [c.get("samples_trained") for c in found]
    if any(c.get("top1_rare") is not None for c in found):  # rare and common classes apart (secondary)
        rows["top1_rare"] = [c.get("top1_rare", math.nan) for c in found]
        rows["top1_common"] = [c.get("top1_common", math.nan) for c in found]
    rows["planned_samples"] = [c.get("planned_samples") for c in found]
    rows["samples_vs_plan"] = [c["samples_trained"] / c["planned_samples"] if c.get("planned_samples") else math.nan
                               for c in found]
    for key in sorted({key for c in found for key in flat_columns(c.get("composition"))}):
        rows[key] = [flat_columns(c.get("composition")).get(key, math.nan) for c in found]
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


def holm_levels(p_values: list[float], level: float) -> list[float]:
    """The per-comparison level each comparison's Holm step used: the i-th smallest p-value
    (i from 0) of a family of m is tested at level / (m - i). NaN entries are no member of
    the family and get NaN. A comparison's power is the power at that level."""
    order = sorted((p, i) for i, p in enumerate(p_values) if not math.isnan(p))
    levels = [math.nan] * len(p_values)
    for rank, (_, index) in enumerate(order):
        levels[index] = level / (len(order) - rank)
    return levels


def paired_power(difference: float, std: float, n: int, level: float) -> float:
    """Power of the two-sided paired t-test at ``level`` with ``n`` pairs whose differences
    have standard deviation ``std``, when the true mean difference is ``difference``: the
    probability that |T| passes the critical value, T noncentral t with n - 1 degrees of
    freedom and noncentrality difference * sqrt(n) / std."""
    from scipy.stats import nct, t as student

    if n < 2 or not std > 0:
        return math.nan
    dof = n - 1
    critical = float(student.ppf(1 - level / 2, dof))
    shift = difference * math.sqrt(n) / std
    # P(T < -c) as P(T' > c) with the opposite noncentrality (scipy's cdf far in that tail gives NaN);
    # an underflowing tail is 0.
    tails = [float(nct.sf(critical, dof, shift)), float(nct.sf(critical, dof, -shift))]
    return sum(0.0 if math.isnan(tail) else tail for tail in tails)


def min_detectable_difference(std: float, n: int, level: float, power: float = 0.8) -> float:
    """The smallest true mean difference the two-sided paired t-test at ``level`` detects
    with probability ``power`` from ``n`` pairs of standard deviation ``std`` (same units as
    ``std``). NaN with fewer than two pairs or no spread to scale by."""
    from scipy.optimize import brentq

    if n < 2 or math.isnan(std) or math.isnan(level) or std <= 0:
        return math.nan
    high = std
    while paired_power(high, std, n, level) < power:
        high *= 2
    return float(brentq(lambda d: paired_power(d, std, n, level) - power, 0.0, high, xtol=1e-10 * std))


def seeds_needed(std: float, margin: float, level: float, power: float = 0.8, most: int = 10_000) -> int:
    """The fewest paired seeds whose two-sided paired t-test at ``level`` detects a true
    difference of ``margin`` with probability ``power``, given the differences' standard
    deviation ``std`` (from a pilot). ``most`` + 1 when even ``most`` seeds do not suffice."""
    if not margin > 0 or not std >= 0:
        raise ValueError(f"need a positive margin and a non-negative standard deviation, got margin={margin!r}, "
                         f"std={std!r}")
    if std == 0:
        return 2
    low, high = 2, 2
    while paired_power(margin, std, high, level) < power:
        if high >= most:
            return most + 1
        low, high = high, min(most, high * 2)
    while low < high:  # power grows with n: the first n that reaches it
        middle = (low + high) // 2
        if paired_power(margin, std, middle, level) >= power:
            high = middle
        else:
            low = middle + 1
    return high


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


def _direction(figure: str) -> str:
    return "lower" if figure.startswith("time") else "higher"


def adjust_family(frame: pd.DataFrame, *, margin: float | None, level: float, power: float = 0.8,
                  direction: str = "higher") -> pd.DataFrame:
    """One family of comparisons (rows of ``paired_differences``) adjusted together: the
    Holm-Bonferroni p-value (``p_holm``), the per-comparison level its Holm step used
    (``holm_level``), the minimum detectable difference at ``power`` from its observed
    paired standard deviation at that level (``mdd``, the figure's units) and the verdict."""
    frame = frame.copy()
    p_values = list(frame["p_value"])
    frame["p_holm"] = holm(p_values)
    frame["holm_level"] = holm_levels(p_values, level)
    frame["mdd"] = [min_detectable_difference(row["std_diff"], int(row["n"]), row["holm_level"], power)
                    for row in frame.to_dict("records")]
    frame["verdict"] = [verdict(row, row["p_holm"], margin=margin, level=level, direction=direction)
                        for row in frame.to_dict("records")]
    return frame


def paired_differences(rows: pd.DataFrame, metric: str = "top1", reference: str = REFERENCE, *,
                       margin: float | None = None, level: float = 0.05, power: float = 0.8) -> pd.DataFrame:
    """Per (model, budget, control): DAREL's ``metric`` minus the control's over the shared
    seeds (``paired_test``), DAREL's wins, and, adjusted as one family over every comparison
    of this metric in ``rows`` (``adjust_family``), the Holm p-value and level, the minimum
    detectable difference and the verdict (``assess`` splits a study into its families)."""
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
    return adjust_family(frame, margin=margin, level=level, power=power, direction=_direction(metric))


PRIMARY, SECONDARY, EXPLORATORY = "primary", "secondary", "exploratory"


def primary_applies(primary: dict | None, schedule: str | None) -> tuple[bool, str]:
    """Whether a run carries its study's declared primary analysis, and if not, why: none is
    declared, or the run's schedule rule is not the one it was declared under."""
    if not primary:
        return False, "no primary analysis is declared for this study (`study.<table>.primary`)"
    declared = primary.get("schedule")
    if declared is not None and schedule is not None and declared != schedule:
        return False, (f"the primary analysis was declared under the `{declared}` schedule rule and this run used "
                       f"`{schedule}`")
    return True, ""


def assess(diffs: dict[str, pd.DataFrame], *, primary: dict | None, schedule: str | None,
           margins: dict[str, float | None], level: float, power: float = 0.8) -> dict[str, pd.DataFrame]:
    """Every comparison of a study (figure name -> ``paired_differences``) in its family,
    with its ``role``. When the declared ``primary`` analysis applies (``primary_applies``),
    its comparisons (DAREL minus each of ``primary['methods']`` at each of
    ``primary['cells']``, None for all, in ``primary['metric']``) are one family, "primary",
    adjusted alone at ``level`` with ``primary['margin']`` as equivalence margin; every
    other comparison is "secondary", adjusted with the others of its figure. Without a
    primary analysis every comparison is "exploratory", adjusted per figure. ``margins``:
    each figure's equivalence margin outside the primary family."""
    applies, _ = primary_applies(primary, schedule)
    out = {}
    for figure, frame in diffs.items():
        if frame.empty:
            out[figure] = frame
            continue
        frame = frame.copy()
        chosen = pd.Series(False, index=frame.index)
        if applies and figure == primary["metric"]:
            chosen = frame["control"].isin(primary["methods"])
            if primary.get("cells") is not None:
                chosen &= frame["cell"].isin(primary["cells"])
        frame["role"] = [PRIMARY if c else (SECONDARY if applies else EXPLORATORY) for c in chosen]
        parts = []
        for role, group in frame.groupby("role", sort=False):
            margin = primary["margin"] if role == PRIMARY else margins.get(figure)
            parts.append(adjust_family(group, margin=margin, level=level, power=power, direction=_direction(figure)))
        out[figure] = pd.concat(parts).loc[frame.index]
    return out


# ---- the study's own controls -----------------------------------------------------------------

NEGATIVE, POSITIVE = "negative", "positive"
# The training split's share of wrong labels, as the runs record it (darel.composition: the
# generated benchmark's per-sample categories; absent on data that records none).
LABEL_NOISE_SHARE = "data_share_label-noise"
NOT_APPLICABLE = ("the positive control is not applicable: the training data has no label noise (every run records "
                  "a label-noise share of 0), so the oracle's subset is one more random subset and there is no gain "
                  "for the study to find")


def label_noise_share(rows: pd.DataFrame) -> float | None:
    """The share of training samples with a wrong label that the runs record (the largest,
    should runs differ), None when none records it (the data set has no categories, or
    the records predate them)."""
    if LABEL_NOISE_SHARE not in rows:
        return None
    values = pd.to_numeric(rows[LABEL_NOISE_SHARE], errors="coerce").dropna()
    return float(values.max()) if len(values) else None


def validation_methods(validation: dict | None) -> list[str]:
    """The methods a study trains only for its own controls (never compared with DAREL as
    controls of the method): the negative control (each of its runs, ``negative_runs``) and
    the positive control's oracle (its partner, e.g. random, is an ordinary control as well)."""
    validation = validation or {}
    return [m for m in [*negative_runs(validation), *(validation.get("positive") or [])[:1]] if m]


# The chance reference of a negative control with several restreams per seed: restream against restream.
NEGATIVE_REFERENCE = "negative reference"


def negative_runs(validation: dict | None) -> list[str]:
    """The negative control's runs (its restreams, darel.methods.darel_restream): the listed
    ``negative_runs``, else the one ``negative`` method ([] where none is declared)."""
    validation = validation or {}
    negative = validation.get("negative")
    return list(validation.get("negative_runs") or ([negative] if negative else []))


def _mean_name(runs: list[str]) -> str:
    return runs[0] if len(runs) == 1 else f"mean({', '.join(runs)})"


def _mean_of_runs(rows: pd.DataFrame, runs: list[str], metric: str) -> pd.DataFrame:
    """One row per (model, budget, seed) with every run of ``runs``: their mean ``metric``,
    as a method named ``_mean_name(runs)``."""
    chosen = rows[rows["method"].isin(runs)].copy()
    chosen[metric] = pd.to_numeric(chosen[metric], errors="coerce")
    out = []
    for (model, cell, seed), group in chosen.groupby(["model", "cell", "seed"], sort=False):
        values = group[metric].dropna()
        if set(group.loc[values.index, "method"]) == set(runs):
            out.append({"model": model, "cell": cell, "seed": seed, "budget": group["budget"].iloc[0],
                        "method": _mean_name(runs), metric: float(values.mean())})
    return pd.DataFrame(out, columns=["model", "cell", "seed", "budget", "method", metric])


def _negative_checks(rows: pd.DataFrame, metric: str, runs: list[str]) -> list[tuple]:
    """The negative control's comparisons (check, reference, other, rows, judged): DAREL
    minus its restream; with several restreams per seed DAREL minus their mean (judged),
    and the first restream minus the mean of the others (the chance reference: restreams
    differ among themselves by chance alone; reported, never judged)."""
    if len(runs) == 1:
        return [(NEGATIVE, REFERENCE, runs[0], rows[rows["method"].isin([REFERENCE, runs[0]])], True)]
    darel = rows.loc[rows["method"] == REFERENCE, ["model", "cell", "seed", "budget", "method", metric]]
    pooled = pd.concat([darel, _mean_of_runs(rows, runs, metric)], ignore_index=True)
    first = rows.loc[rows["method"] == runs[0], ["model", "cell", "seed", "budget", "method", metric]]
    among = pd.concat([first, _mean_of_runs(rows, runs[1:], metric)], ignore_index=True)
    return [(NEGATIVE, REFERENCE, _mean_name(runs), pooled, True),
            (NEGATIVE_REFERENCE, runs[0], _mean_name(runs[1:]), among, False)]


def validation_checks(rows: pd.DataFrame, metric: str, validation: dict | None, *, level: float,
                      power: float = 0.8) -> pd.DataFrame:
    """The study's own controls, each a family of its own over the budgets (Holm):

    * negative: DAREL minus ``validation['negative']`` (DAREL with another selection stream,
      the same law): passes where no budget's difference is significant. With several
      restreams per seed (``validation['negative_runs']``, K of them) DAREL minus their
      mean over the seeds with all K, judged alike; beside it, check "negative reference",
      the first restream minus the mean of the others: the chance reference (restreams
      differ among themselves by their streams' spread alone), its own family, reported
      and never judged (``restream_reading`` puts the two side by side);
    * positive: ``validation['positive'][0]`` (an oracle that drops exactly the noisy
      samples) minus ``validation['positive'][1]`` (a random subset of the same class
      counts): passes where it is significantly positive at every judged budget
      (``validation['positive_cells']``, absent for all). Budgets outside those are tested
      as a family of their own and reported, never judged.

    On data whose runs record no label noise (``label_noise_share`` 0) the oracle is one
    more random subset: the positive control's comparisons are still reported, with
    ``applicable`` False and ``passed`` None, and never judged.

    Columns as ``paired_differences`` (``control`` the other method), with ``check``
    (negative / positive), ``reference``, ``judged``, ``applicable`` and ``passed`` (None
    where one seed leaves no test, the budget is not judged or the control does not apply)."""
    validation = validation or {}
    parts = []
    checks = []  # (check, reference, other, its rows, judged at all, the cells it is judged at: None for all)
    if validation.get("negative"):
        checks += [(*check, None) for check in _negative_checks(rows, metric, negative_runs(validation))]
    if validation.get("positive"):
        reference, other = validation["positive"][:2]
        checks.append((POSITIVE, reference, other, rows[rows["method"].isin([reference, other])], True,
                       validation.get("positive_cells")))
    for check, reference, other, pair, judging, judged_cells in checks:
        applicable = check != POSITIVE or label_noise_share(pair) != 0
        groups = [(judging, pair)] if judged_cells is None else [
            (True, pair[pair["cell"].isin(judged_cells)]), (False, pair[~pair["cell"].isin(judged_cells)])]
        for judged, chosen in groups:
            frame = paired_differences(chosen, metric=metric, reference=reference, level=level, power=power)
            if frame.empty:
                continue
            frame.insert(0, "check", check)
            frame.insert(1, "reference", reference)
            frame["judged"] = judged
            frame["applicable"] = applicable
            significant = frame["p_holm"] < level
            passed = ~significant if check == NEGATIVE else significant & (frame["mean_diff"] > 0)
            frame["passed"] = [None if math.isnan(p) or not judged or not applicable else bool(ok)
                               for p, ok in zip(frame["p_holm"], passed)]
            parts.append(frame)
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def trustworthy(checks: pd.DataFrame, validation: dict | None) -> tuple[bool | None, list[str]]:
    """Whether the study passed its own controls (None: not judged), and why not, in words.
    A positive control that does not apply (data without label noise) is neither passed
    nor failed: its reason is ``NOT_APPLICABLE``, and the study is at best not validated."""
    validation = validation or {}
    reasons = []
    for check, words in ((NEGATIVE, "the negative control (DAREL against itself with another selection stream) "
                                     "found a difference that is not there"),
                         (POSITIVE, "the positive control (dropping exactly the noisy labels against a random subset "
                                    "of the same size) did not find the gain that is there")):
        declared = bool(validation.get(check))
        found = checks[checks["check"] == check] if not checks.empty else checks
        if "judged" in found:
            found = found[found["judged"].astype(bool)]
        if not declared or found.empty:
            reasons.append(f"the {check} control was not run")
            continue
        if "applicable" in found and not found["applicable"].astype(bool).any():
            reasons.append(NOT_APPLICABLE)
            continue
        if found["passed"].isna().any():
            reasons.append(f"the {check} control could not be judged (one seed)")
        elif not found["passed"].all():
            failed = ", ".join(found.loc[~found["passed"].astype(bool), "budget"])
            reasons.append(f"{words} ({failed})")
    judged = [r for r in reasons if "was not run" not in r and "could not be judged" not in r and r != NOT_APPLICABLE]
    if judged:
        return False, reasons
    return (True, []) if not reasons else (None, reasons)


def restream_reading(checks: pd.DataFrame, *, level: float) -> list[str]:
    """With several restreams per seed, one line per budget that reads the negative control
    against its chance reference (``validation_checks``): DAREL minus the restreams' mean
    against the first restream minus the mean of the others. DAREL apart while the
    restreams agree: DAREL's own stream is special (its draws go with something else the
    run's seed sets); restreams apart among themselves: the stream constant moves the
    result, a fault of the streams, not of DAREL; neither: chance, within the interval."""
    if checks.empty or not (checks["check"] == NEGATIVE_REFERENCE).any():
        return []
    lines = []
    for (model, cell), group in checks[checks["check"].isin([NEGATIVE, NEGATIVE_REFERENCE])].groupby(
            ["model", "cell"], sort=False):
        own = group[group["check"] == NEGATIVE]
        among = group[group["check"] == NEGATIVE_REFERENCE]
        if own.empty or among.empty:
            continue
        own, among = own.iloc[0], among.iloc[0]
        apart, spread = own["p_holm"] < level, among["p_holm"] < level
        figures = (f"DAREL minus the restreams' mean {own['mean_diff']:+.3g} {_interval(own)}, MDD "
                   f"{_fmt(own['mdd'], '.3g')}; restream minus restreams {among['mean_diff']:+.3g} "
                   f"{_interval(among)}, MDD {_fmt(among['mdd'], '.3g')}")
        if apart and not spread:
            words = ("DAREL differs from its restreams while they agree among themselves: DAREL's own stream is "
                     "special (its draws go with something else the run's seed sets), not chance")
        elif spread:
            words = ("the restreams differ among themselves: the stream constant itself moves the result, a fault "
                     "of the sampler's streams to find before any comparison is read, not a property of DAREL")
        else:
            words = ("no systematic difference: DAREL's stream behaves as one more restream, and the difference "
                     "is the streams' chance spread; a true difference of DAREL's stream as large as its MDD would "
                     "have been detected")
        lines.append(f"* {model}, {own['budget']}: {words} ({figures}).")
    return lines + [""] if lines else []


def validation_markdown(checks: pd.DataFrame, validation: dict | None, *, metric: str, level: float,
                        power: float = 0.8) -> list[str]:
    """The verdict file's first section: the study's own controls and whether it can be trusted."""
    ok, reasons = trustworthy(checks, validation)
    positive_cells = (validation or {}).get("positive_cells")
    judged_words = ("budget" if not positive_cells else
                    "budget it is judged at, declared before the runs (" + ", ".join(positive_cells) + ")")
    lines = ["## The study's own controls (reported first)", "",
             "A study must find a difference that is there and none where there is none. Negative control: DAREL "
             "against DAREL with another selection random stream (the same method: its difference has mean zero); "
             "passed when no budget's difference is significant. Positive control: an oracle that drops exactly the "
             "label-noise samples against a random subset of the same class counts, at the same budget (a real "
             f"gain); passed when it is significantly positive at every {judged_words}. Each control is one Holm "
             f"family over {'those' if positive_cells else 'the'} budgets at level {level:g}"
             + ("; the positive control's other budgets are a family of their own, reported and not judged"
                if positive_cells else "") + ".", ""]
    runs = negative_runs(validation)
    if len(runs) > 1:
        lines += [f"The negative control trains {len(runs)} restreams per seed and budget ({', '.join(runs)}: each "
                  "DAREL with its own sampler stream). Judged: DAREL minus the mean of its restreams. Its chance "
                  f"reference, reported and not judged (a Holm family of its own): {runs[0]} minus the mean of the "
                  "others, a difference between streams of the same law. DAREL apart while the restreams agree "
                  "says DAREL's own stream is special; both alike say the difference is chance.", ""]
    # Not applicable is no failure: it is stated on its own line, never among a failure's reasons.
    if NOT_APPLICABLE in reasons:
        reasons = [r for r in reasons if r != NOT_APPLICABLE]
        lines += [NOT_APPLICABLE[0].upper() + NOT_APPLICABLE[1:] + " (its comparisons are reported below, not "
                  "judged).", ""]
        if ok is None and not reasons:
            reasons = ["no positive control applies to this data"]
    if ok is False:
        lines += ["**This study is not trustworthy**: " + "; ".join(reasons) + ". No verdict below should be quoted "
                  "until the cause is found.", ""]
    elif ok is None:
        lines += ["**This study is not validated**: " + "; ".join(reasons) + ". Its verdicts carry no evidence "
                  "that it can tell a real difference from none.", ""]
    else:
        lines += ["The study passed both controls.", ""]
    if not checks.empty:
        lines += _table_head("control", "budget", "compared", f"difference ({metric})", "95 % interval", "p (Holm)",
                             f"MDD ({power:.0%})", "verdict", "passed")
        for row in checks.to_dict("records"):
            passed = ("not applicable" if not row.get("applicable", True) else
                      "not judged" if not row.get("judged", True) else
                      "—" if row["passed"] is None else ("yes" if row["passed"] else "**no**"))
            lines.append(f"| {row['check']} | {row['model']}, {row['budget']} | {row['reference']} - {row['control']} | "
                         f"{_comparison_cells(row)} | {row['verdict'].replace('DAREL ', '')} | {passed} |")
        lines.append("")
        reading = restream_reading(checks, level=level)
        if reading:
            lines += ["Reading the negative control against its chance reference:", "", *reading]
    return lines


# ---- the baselines' fit (a study declared in the fitting regime: study.table1.fit_check) --------

def last_quarter(curve: list[float | None]) -> dict:
    """The per-epoch test curve's last quarter of the epochs (``curve``: one entry per
    epoch, None where the epoch was not evaluated): the quarter's first and last epoch
    (1-based), its evaluated points, their mean, range and the least-squares line's rise
    over the quarter (its slope times the epochs between its first and last point). The
    line, not two single points: each point reads a few hundred test images (about 2 pp of
    noise at 500), so the change between two points would exaggerate a drift."""
    epochs = len(curve)
    if epochs == 0:
        raise ValueError("an empty test curve has no last quarter")
    first = epochs - max(1, math.ceil(epochs / 4))
    points = [(epoch, float(value)) for epoch, value in enumerate(curve[first:], start=first + 1)
              if value is not None and not math.isnan(value)]
    if not points:
        raise ValueError(f"the test curve's last quarter (epochs {first + 1}-{epochs}) has no evaluated epoch")
    xs, ys = zip(*points)
    x_mean, y_mean = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - x_mean) ** 2 for x in xs)
    slope = sum((x - x_mean) * (y - y_mean) for x, y in points) / spread if spread > 0 else 0.0
    return {"from_epoch": first + 1, "to_epoch": epochs, "points": len(points), "mean": y_mean,
            "range_pp": max(ys) - min(ys), "rise_pp": slope * (xs[-1] - xs[0])}


FIT_COLUMNS = ("train_top1", "train_clean_top1", "train_noisy_top1")
MIN_LINE_POINTS = 3  # a line through fewer evaluated epochs says nothing of a trend


def fit_rows(records: list[dict], rows: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per baseline (model, seed) from its fit record (stages/baseline_fit.py): its
    training top-1 on the whole training set (all, clean, label-noise samples), its test
    curve's last quarter (``last_quarter``: lq_mean, lq_range_pp, lq_rise_pp) and, from the
    study's ``rows``, its final test top-1."""
    out = []
    for record in records:
        quarter = record["last_quarter"]
        out.append({"model": record["model"], "seed": int(record["seed"]),
                    **{key: record.get(key, math.nan) for key in FIT_COLUMNS},
                    "lq_from_epoch": quarter["from_epoch"], "lq_to_epoch": quarter["to_epoch"],
                    "lq_points": quarter["points"],
                    "lq_mean": quarter["mean"], "lq_range_pp": quarter["range_pp"], "lq_rise_pp": quarter["rise_pp"]})
    frame = pd.DataFrame(out)
    if frame.empty:
        return frame
    if rows is not None:
        baseline = rows[rows["method"] == BASELINE]
        final = dict(zip(zip(baseline["model"], baseline["seed"]), pd.to_numeric(baseline["top1"])))
        frame["test_top1"] = [final.get((m, s), math.nan) for m, s in zip(frame["model"], frame["seed"])]
    return frame.sort_values(["model", "seed"], kind="stable").reset_index(drop=True)


def fit_check(fit: pd.DataFrame, criteria: dict) -> tuple[bool, str]:
    """Whether every baseline is in the declared fitting regime (``criteria``: its training
    top-1 on the whole training set at least ``train_top1_min`` percent, and its test
    curve flat over the last quarter: the least-squares rise within ±``rise_max_pp``, through
    at least ``MIN_LINE_POINTS`` evaluated epochs, fewer leave no line to judge), and the
    one line that says so."""
    if fit.empty:
        return False, "fit check: no baseline's fit was measured"
    low, most = float(criteria["train_top1_min"]), float(criteria["rise_max_pp"])
    fits = fit["train_top1"] >= low
    flat = (fit["lq_rise_pp"].abs() <= most) & (fit["lq_points"] >= MIN_LINE_POINTS)
    ok = bool(fits.all() and flat.all())
    return ok, (f"fit check: **{'passed' if ok else 'FAILED'}**: {int(fits.sum())} of {len(fit)} baselines reach "
                f"training top-1 >= {low:g} % on the whole training set (lowest {fit['train_top1'].min():.2f} %); "
                f"{int(flat.sum())} of {len(fit)} test curves are flat over the last quarter (least-squares rise "
                f"within ±{most:g} pp through at least {MIN_LINE_POINTS} epochs: {fit['lq_rise_pp'].min():+.2f} to "
                f"{fit['lq_rise_pp'].max():+.2f} pp, {int(fit['lq_points'].min())} to {int(fit['lq_points'].max())} "
                "epochs)")


def fit_markdown(fit: pd.DataFrame, criteria: dict) -> list[str]:
    """The verdict file's section on the baselines' fit: the check's line, then one row per
    seed's baseline."""
    _, line = fit_check(fit, criteria)
    lines = ["## The baselines' fit (the regime the study declares)", "",
             "Each seed's baseline, the saved model in eval mode without augmentation, on the whole training set "
             "against its observed labels (the label-noise samples against their wrong label), and its per-epoch "
             "test curve over the last quarter of the epochs (the mean, the range, and the rise of the "
             "least-squares line through those points). The declared regime: training top-1 at least "
             f"{float(criteria['train_top1_min']):g} % and a flat last quarter (rise within "
             f"±{float(criteria['rise_max_pp']):g} pp).", "", line, ""]
    if fit.empty:
        return lines
    lines += _table_head("model", "seed", "train top-1", "clean", "label-noise", "test top-1", "last quarter (epochs)",
                         "mean", "range", "least-squares rise")
    for row in fit.to_dict("records"):
        lines.append(f"| {row['model']} | {row['seed']} | {row['train_top1']:.2f} | {_fmt(row['train_clean_top1'], '.2f')} "
                     f"| {_fmt(row['train_noisy_top1'], '.2f')} | {_fmt(row.get('test_top1', math.nan), '.2f')} | "
                     f"{row['lq_from_epoch']}-{row['lq_to_epoch']} | {row['lq_mean']:.2f} | {row['lq_range_pp']:.2f} | "
                     f"{row['lq_rise_pp']:+.2f} |")
    return lines + [""]


# ---- DAREL's variants (secondary analyses: each minus random and minus DAREL) -------------------

VARIANT_OTHERS = ("random", REFERENCE)


def variant_methods(names: list[str]) -> list[str]:
    """The methods of ``names`` that are variants of DAREL (darel.methods: a ``DarelVariant``,
    DAREL's subset, plan and sampler stream with one setting of its own)."""
    from darel import methods
    from darel.methods.darel import DarelVariant

    # A study's rows name runs: a method, or a further run of one (the negative control's restreams).
    return [name for name in names if isinstance(methods.of_run(name), DarelVariant)]


def variant_comparisons(rows: pd.DataFrame, variants: list[str], metric: str = "top1", *,
                        others: tuple[str, ...] = VARIANT_OTHERS, margin: float | None = None,
                        level: float = 0.05, power: float = 0.8) -> pd.DataFrame:
    """Each variant minus each of ``others`` (random, DAREL) in ``metric``, paired over
    seeds per budget (``paired_differences`` with the variant as reference); each (variant,
    other) pair is its own Holm family over the budgets, with its interval and MDD.
    Columns as ``paired_differences`` (``control``: the other method) with ``variant``."""
    parts = []
    for variant in variants:
        for other in others:
            pair = rows[rows["method"].isin([variant, other])]
            frame = paired_differences(pair, metric=metric, reference=variant, margin=margin, level=level,
                                       power=power)
            if not frame.empty:
                frame.insert(0, "variant", variant)
                parts.append(frame)
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def variant_markdown(variants: pd.DataFrame, *, metric: str, level: float, power: float) -> list[str]:
    """The verdict file's section on DAREL's variants: one table, a row per (variant, other,
    budget); the verdict's "better" / "worse" is the variant's."""
    return _secondary_section(
        variants, heading="DAREL's variants (secondary analyses: each variant minus random and minus darel)",
        intro=f"Each variant against random and against darel in `{metric}`, paired over seeds; each (variant, "
              f"other) pair is a Holm family of its own over the budgets at family-wise level {level:g}, reported, "
              "never a headline.",
        columns=("variant", "budget", "compared", f"difference ({metric})"), subject="variant", power=power,
        leading=lambda row: [row["variant"], f"{row['model']}, {row['budget']}",
                             f"{row['variant']} - {row['control']}"])


def _secondary_section(frame: pd.DataFrame, *, heading: str, intro: str, columns: tuple[str, ...], subject: str,
                       power: float, leading) -> list[str]:
    """A verdict section of secondary comparisons where another method than DAREL is the
    reference: its heading and sentence, then a row per comparison, ``leading(row)``'s cells
    (headed by ``columns``, the last the difference's) before the difference, its interval,
    Holm's p, MDD, wins and the verdict, whose "better" / "worse" is the ``subject``'s."""
    if frame.empty:
        return []
    lines = [f"## {heading}", "", intro, "",
             *_table_head(*columns, "95 % interval", "p (Holm)", f"MDD ({power:.0%})", "wins", "verdict")]
    for row in frame.to_dict("records"):
        lines.append(f"| {' | '.join(leading(row))} | {_comparison_cells(row)} | {row['wins']}/{row['n']} | "
                     f"{row['verdict'].replace('DAREL ', subject + ' ')} |")
    return lines + [""]


# ---- Each of DAREL's stages alone (secondary analyses: each minus random) -----------------------

STAGE_WORDS = {"offline": "offline only (the ranked subset, every sample kept alike)",
               "online": "online only (histogram keeping on a random subset)"}


def stage_methods(names: list[str]) -> dict[str, str]:
    """The methods of ``names`` that run one of DAREL's two stages alone (darel.methods:
    ``stage_alone``), each with its stage, in the order given."""
    from darel import methods

    found = {}
    for name in names:
        stage = getattr(methods.of_run(name), "stage_alone", None)
        if stage is not None:
            found[name] = stage
    return found


def stage_comparisons(rows: pd.DataFrame, stages: dict[str, str], metric: str = "top1", *,
                      margin: float | None = None, level: float = 0.05, power: float = 0.8) -> pd.DataFrame:
    """Each stage method minus random in ``metric`` and, where the rows hold them, on the rare
    and the other classes (``PER_CLASS_FIGURES``), paired over seeds per budget; each
    (method, figure) is its own Holm family over the budgets; ``margin`` applies to ``metric``
    alone. Columns as ``variant_comparisons`` with ``stage`` and ``figure``."""
    parts = []
    ordered = sorted(stages, key=lambda name: (list(STAGE_WORDS).index(stages[name]), name))  # offline first
    for figure in (metric, *(f for f in PER_CLASS_FIGURES if f in rows)):
        frame = variant_comparisons(rows, ordered, figure, others=("random",),
                                    margin=margin if figure == metric else None, level=level, power=power)
        if not frame.empty:
            frame.insert(0, "figure", figure)
            frame.insert(0, "stage", frame["variant"].map(stages))
            parts.append(frame)
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def stage_markdown(stages: pd.DataFrame, *, metric: str, level: float, power: float) -> list[str]:
    """The verdict file's section on each of DAREL's stages alone: a row per (stage method,
    figure, budget); the verdict's "better" / "worse" is the stage method's, against random."""
    return _secondary_section(
        stages, heading="Each of DAREL's stages alone (secondary analyses: each minus random)",
        intro="DAREL is an offline stage (a loss-ranked subset of every class) followed by an online one (samples "
              "kept by a histogram of recent losses). Each method below runs one of them alone; its difference "
              f"from random is that stage's share. Each (method, figure) is a Holm family of its own over the "
              f"budgets at family-wise level {level:g}; 'equivalent' applies to `{metric}` only. Reported, never a "
              "headline.",
        columns=("stage alone", "method", "figure", "budget", "difference"), subject="method", power=power,
        leading=lambda row: [STAGE_WORDS.get(row["stage"], row["stage"]), row["variant"], f"`{row['figure']}`",
                             f"{row['model']}, {row['budget']}"])


ACCOUNTINGS = {"time_s": "training time, as the paper counts it",
               "time_total_s": "total time: training plus the scorer's training and its scoring pass for the "
                               "methods that use them"}
# Tables 2/3: the scorer is a pretrained LM, not trained for the task; only its scoring pass is charged.
NLG_ACCOUNTINGS = {"time_s": "fine-tuning time, as the paper counts it",
                   "time_total_s": "total time: fine-tuning plus the scorer's scoring pass for the methods that "
                                   "rank by its losses"}


def _fmt(value: float, spec: str, empty: str = "—") -> str:
    return empty if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def _interval(row) -> str:
    return "—" if math.isnan(row["ci95_low"]) else f"[{row['ci95_low']:+.4g}, {row['ci95_high']:+.4g}]"


def _comparison_cells(row, difference: str = ".4g") -> str:
    """A comparison's cells in every verdict table: the difference (signed, in the format
    ``difference``), its 95 % interval, Holm's p and the minimum detectable difference."""
    return (f"{row['mean_diff']:+{difference}} | {_interval(row)} | {_fmt(row['p_holm'], '.3g')} | "
            f"{_fmt(row['mdd'], '.3g')}")


def _table_head(*columns: str) -> list[str]:
    """A Markdown table's header row and the separator row under it."""
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]


def _summary_value(summary: pd.DataFrame, model: str, cell: str, method: str, column: str) -> str:
    match = summary[(summary["model"] == model) & (summary["cell"] == cell) & (summary["method"] == method)]
    return f"{match.iloc[0][column]:.4g}" if len(match) and column in match else "—"


def _budget_words(primary: dict, budgets: list[str]) -> str:
    if primary.get("cells") is None:
        return "every budget of the study" + (f" ({', '.join(budgets)})" if budgets else "")
    if isinstance(primary.get("budgets"), list):
        return ", ".join(f"B(t={t:.2f}, m={m:.2f})" for t, m in primary["budgets"])
    if isinstance(primary.get("alphas"), list):
        return ", ".join(f"alpha = {a:.2f}" for a in primary["alphas"])
    return ", ".join(primary["cells"])


def neighbour_note(rows: pd.DataFrame) -> str | None:
    """What else ran on the machine while the study's times were measured: the other
    processes' busy cores over each run's timed intervals (``cores_beside``), summarised;
    None when no run recorded it (records written before it was measured)."""
    if "cores_beside" not in rows:
        return None
    values = pd.to_numeric(rows["cores_beside"], errors="coerce").dropna()
    if values.empty:
        return None
    shared = int((values >= 0.25).sum())
    return (f"other processes' busy cores during the runs' timed intervals (`cores_beside`, {len(values)} of "
            f"{len(rows)} runs recorded it): median {values.median():.2f}, largest {values.max():.2f}; {shared} runs "
            "had a quarter of a core or more beside them. On a CPU `time_s` is process CPU time, which a neighbour "
            "on another core raises by a per cent or two (bench/side_by_side.py); the trained models do not depend "
            "on it")


def _primary_declaration(primary: dict, quality: pd.DataFrame, *, metric: str, unit: str,
                         accountings: dict[str, str], level: float, power: float) -> list[str]:
    """The declared primary analysis in words: question, budgets, schedule rule, margin, family, power."""
    figure = primary["metric"]
    figure_unit = unit if figure == metric else "seconds"  # a primary time metric
    budgets = list(dict.fromkeys(quality["budget"])) if not quality.empty else []
    return [f"- question: DAREL minus each of {', '.join(primary['methods'])} in `{figure}` ({figure_unit}), "
            f"paired over seeds",
            f"- budgets: {_budget_words(primary, budgets)}",
            *([f"- learning-rate schedule rule: `{primary['schedule']}`"] if "schedule" in primary else []),
            f"- time accounting reported beside it: `{primary['accounting']}` = "
            f"{accountings.get(primary['accounting'], primary['accounting'])}",
            f"- margin: ±{primary['margin']:g} (the smallest difference that matters: 'equivalent' only when "
            "the whole 95 % interval lies within it; the seeds are chosen to detect it)",
            f"- family: these comparisons only, Holm-Bonferroni at family-wise level {level:g}; every other "
            "comparison of this file is outside it",
            f"- power: each comparison states its minimum detectable difference (MDD), the smallest true "
            f"difference it detects with {power:.0%} probability given the observed standard deviation of the "
            "paired differences, at the level its Holm step used", ""]


def _primary_results(diffs: dict[str, pd.DataFrame], summary: pd.DataFrame, primary: dict, *,
                     power: float) -> list[str]:
    """The primary family's table (with the declared time accounting beside each comparison)
    and how many of its comparisons could detect the margin."""
    family = diffs[primary["metric"]]
    family = family[family["role"] == PRIMARY]
    accounting = diffs.get(primary["accounting"], pd.DataFrame())
    column = f"{primary['metric']}_mean"
    lines = _table_head("budget", "control", f"control {primary['metric']}", "DAREL - control", "95 % interval",
                        "p (Holm)", f"MDD ({power:.0%})", "wins", "verdict", f"{primary['accounting']}: DAREL - control")
    for row in family.to_dict("records"):
        match = accounting[(accounting["model"] == row["model"]) & (accounting["cell"] == row["cell"])
                           & (accounting["control"] == row["control"])] if not accounting.empty else accounting
        time = "—" if match.empty else f"{match.iloc[0]['mean_diff']:+.3g} s"
        lines.append(f"| {row['model']}, {row['budget']} | {row['control']} | "
                     f"{_summary_value(summary, row['model'], row['cell'], row['control'], column)} | "
                     f"{_comparison_cells(row)} | {row['wins']}/{row['n']} | {row['verdict']} | {time} |")
    mdds = family["mdd"].dropna()
    if len(mdds):
        powered = int((mdds <= primary["margin"]).sum())
        lines += ["", f"Power: {powered} of {len(family)} primary comparisons could detect the ±{primary['margin']:g} "
                  f"margin (MDD {mdds.min():.3g} to {mdds.max():.3g}). A difference below a comparison's MDD may be "
                  "real and unseen: 'inconclusive' there says nothing for or against DAREL."]
    else:
        lines += ["", "Power: not known (one seed, or no spread between the paired differences)."]
    return lines + [""]


def _design_section(*, design: str | None, schedule: str, seeds: list[int], metric: str, unit: str,
                    accountings: dict[str, str], dataset: str, neighbours: str | None, power: float,
                    profile: str) -> list[str]:
    """What is compared and held equal, the seeds, the data and what ran beside the timed runs."""
    held_equal = design or (
        "Compared: DAREL against each control at the same budget (the cell's calibrated batch, the same cost "
        "model and time plan); paired: a seed shares baseline, scorer and calibration. Learning-rate "
        "schedule rule of this run: "
        + ("**matched** (every method's schedule scaled to its own planned run, ending fully decayed)"
           if schedule == "matched" else "**paper** (the protocol's milestones cut at the planned epochs)"))
    return ["## Design", "",
            held_equal + f". Seeds: {len(seeds)} ({', '.join(str(s) for s in seeds)}). Quality: {metric} ({unit}); "
            "time under two accountings: " + "; ".join(f"`{k}` = {v}" for k, v in accountings.items()) + ".", "",
            f"- data: {dataset}",
            *([f"- times: {neighbours}"] if neighbours else []),
            "- DAREL's wins: on how many of the seeds DAREL's figure is above the control's",
            f"- MDD: the minimum detectable difference at {power:.0%} power (see above), in each figure's units",
            *([f"- these are {profile}-profile results on {dataset}: they test the methods at this scale, not the "
               "paper's claims on its data sets"] if profile != "paper" else []), ""]


def _quality_tables(quality: pd.DataFrame, summary: pd.DataFrame, *, metric: str, power: float) -> list[str]:
    """One table per (model, budget) of the quality comparisons outside the primary family."""
    lines = []
    rest = quality[quality["role"] != PRIMARY]
    if rest.empty:
        lines += [f"Every {metric} comparison belongs to the primary family.", ""]
    for (model, cell), group in rest.groupby(["model", "cell"], sort=False):
        ref_text = ""
        ref = summary[(summary["model"] == model) & (summary["cell"] == cell) & (summary["method"] == REFERENCE)]
        if len(ref):
            ref_text = f" — DAREL {metric} {ref.iloc[0][f'{metric}_mean']:.4g} over {int(ref.iloc[0]['n'])} seed(s)"
        lines += [f"### {model}, {group['budget'].iloc[0]}: {metric}{ref_text}", "",
                  *_table_head("control", f"control {metric}", "DAREL - control", "95 % interval", "p (Holm)",
                               f"MDD ({power:.0%})", "wins", "verdict")]
        for row in group.to_dict("records"):
            lines.append(f"| {row['control']} | {_summary_value(summary, model, cell, row['control'], f'{metric}_mean')} | "
                         f"{_comparison_cells(row)} | {row['wins']}/{row['n']} | {row['verdict']} |")
        lines.append("")
    return lines


# The per-class figures of an image study (rare classes and the others apart), when its
# evaluations recorded them: each a family of its own, reported after the time tables.
PER_CLASS_FIGURES = {"top1_rare": "Top-1 on the rare classes' test images, `top1_rare`: DAREL - control (pp)",
                     "top1_common": "Top-1 on the other classes' test images, `top1_common`: DAREL - control (pp)"}


def per_class_markdown(rows: pd.DataFrame) -> list[str]:
    """Every method's top-1 on the rare classes' and the other classes' test images beside its
    top-1 (means over seeds, per model and budget; the baseline first), when the rows
    record them (``top1_rare``, ``top1_common``); nothing otherwise."""
    if not set(PER_CLASS_FIGURES) <= set(rows.columns):
        return []
    lines = ["### Top-1 per method on the rare and the other classes (mean over seeds, pp)", "",
             *_table_head("model", "budget", "method", "seeds", "top1", "top1_rare", "top1_common")]
    for (model, _, method), group in rows.groupby(["model", "cell", "method"], sort=False):
        means = [pd.to_numeric(group[column], errors="coerce").mean() for column in ("top1", *PER_CLASS_FIGURES)]
        lines.append(f"| {model} | {group['budget'].iloc[0]} | {method} | {len(group)} | "
                     + " | ".join(_fmt(value, ".2f") for value in means) + " |")
    return lines + [""]


def _time_tables(diffs: dict[str, pd.DataFrame], accountings: dict[str, str], *, power: float) -> list[str]:
    """One table per time accounting of the time comparisons outside the primary family."""
    return _difference_tables(diffs, {figure: f"Time, `{figure}`: DAREL - control (seconds)" for figure in accountings},
                              power=power)


def _difference_tables(diffs: dict[str, pd.DataFrame], headings: dict[str, str], *, power: float) -> list[str]:
    """One table per figure of ``headings`` (figure -> heading) of its comparisons outside
    the primary family."""
    lines = []
    for figure, heading in headings.items():
        frame = diffs.get(figure, pd.DataFrame())
        if frame.empty:
            continue
        rest = frame[frame["role"] != PRIMARY]
        if rest.empty:
            continue
        lines += [f"### {heading}", "", *_table_head("budget", "control", "DAREL - control", "95 % interval",
                                                     "p (Holm)", f"MDD ({power:.0%})", "verdict")]
        for row in rest.to_dict("records"):
            lines.append(f"| {row['model']}, {row['budget']} | {row['control']} | {_comparison_cells(row, '.3g')} | "
                         f"{row['verdict']} |")
        lines.append("")
    return lines


def verdict_markdown(diffs: dict[str, pd.DataFrame], summary: pd.DataFrame, *, title: str, profile: str,
                     dataset: str, seeds: list[int], metric: str, unit: str, schedule: str, margin: float | None,
                     level: float, power: float = 0.8, primary: dict | None = None, design: str | None = None,
                     accountings: dict[str, str] | None = None, checks: pd.DataFrame | None = None,
                     validation: dict | None = None, neighbours: str | None = None,
                     fit: pd.DataFrame | None = None, fit_criteria: dict | None = None,
                     variants: pd.DataFrame | None = None, rows: pd.DataFrame | None = None,
                     stages: pd.DataFrame | None = None) -> str:
    """The study's verdict file. ``diffs``: figure name (the quality metric, time_s,
    time_total_s) -> its comparisons, assessed into families (``assess``). First the
    primary analysis: its declaration, then (when this run carries it) its comparisons with
    their Holm-adjusted p-values over that family alone, minimum detectable differences and
    verdicts: the only headline. Then the design, and every other comparison, labelled
    secondary (or exploratory when no primary analysis applies). ``design`` replaces the
    image studies' sentence on what is held equal and on the schedule rule. ``checks``
    (``validation_checks``) and the declared ``validation``: the study's own controls,
    reported before everything else (None: a study without them, e.g. Tables 2/3).
    ``neighbours`` (``neighbour_note``): what ran beside the timed runs, in the design.
    ``fit`` (``fit_rows``) with the declared ``fit_criteria``: the baselines' fit, after the
    controls (a study declared in the fitting regime). ``variants``
    (``variant_comparisons``): DAREL's variants against random and DAREL, last; ``rows``
    (the study's rows): every method's top-1 on the rare and the other classes, before them;
    ``stages`` (``stage_comparisons``): each of DAREL's stages alone against random, between
    the two."""
    accountings = accountings or ACCOUNTINGS
    applies, reason = primary_applies(primary, schedule if design is None else None)
    other = SECONDARY if applies else EXPLORATORY
    lines = [f"# {title} ({profile} profile)", ""]
    if checks is not None:
        lines += validation_markdown(checks, validation, metric=metric, level=level, power=power)
    if fit is not None and fit_criteria:
        lines += fit_markdown(fit, fit_criteria)
    lines += ["## Primary analysis (declared in params.yaml before the runs)", ""]
    quality = diffs.get(metric, pd.DataFrame())
    if primary:
        lines += _primary_declaration(primary, quality, metric=metric, unit=unit, accountings=accountings,
                                      level=level, power=power)
    if not applies:
        lines += [f"**This run carries no primary analysis**: {reason}. Every comparison below is exploratory: it "
                  "may suggest a question for a declared study, it answers none.", ""]
    else:
        lines += _primary_results(diffs, summary, primary, power=power)
    lines += _design_section(design=design, schedule=schedule, seeds=seeds, metric=metric, unit=unit,
                             accountings=accountings, dataset=dataset, neighbours=neighbours, power=power,
                             profile=profile)
    title_other = ("Secondary comparisons (outside the primary family: reported, never a headline)" if applies
                   else "Exploratory comparisons (no primary analysis carried: no claim rests on them)")
    lines += [f"## {title_other}", "",
              f"Each figure's {other} comparisons are Holm-adjusted among themselves (family-wise level {level:g})"
              + (f"; 'equivalent' in {metric} means the whole interval lies within ±{margin:g}" if margin else "")
              + ".", ""]
    if quality.empty:
        return "\n".join(lines + ["No comparison: the study lists no control beside darel.", ""])
    lines += _quality_tables(quality, summary, metric=metric, power=power)
    lines += _time_tables(diffs, accountings, power=power)
    lines += _difference_tables(diffs, PER_CLASS_FIGURES, power=power)
    if rows is not None:
        lines += per_class_markdown(rows)
    if stages is not None:
        lines += stage_markdown(stages, metric=metric, level=level, power=power)
    if variants is not None:
        lines += variant_markdown(variants, metric=metric, level=level, power=power)
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
