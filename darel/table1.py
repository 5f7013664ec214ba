"""Table 1 assembly: from cell records (one JSON per trained cell) to the paper's
columns, and a side-by-side comparison with the paper's own numbers. Pure functions
over dicts and DataFrames; the only file read is the packaged paper reference data."""

from __future__ import annotations

import math
from importlib import resources
from typing import Any, Iterable

import pandas as pd

TABLE1_LEADING = ["model", "method", "batch", "alpha", "A", "eta", "epochs", "boost", "acc_drop_pp", "mem_cut",
                  "co2e_cut"]
TABLE1_TRAILING = ["t", "m", "budget_adherence", "epochs_planned", "enforce", "time_s", "wall_time_s", "cores_beside",
                   "top1",
                   "peak_mem_bytes",
                   "co2e_kg", "energy_kwh", "energy_covers", "profile", "seed", "dataset_label", "cell"]
TABLE1_COLUMNS = TABLE1_LEADING + TABLE1_TRAILING

REQUIRED_CELL_KEYS = ("model", "method", "cell", "t", "m", "batch", "alpha", "A", "eta", "epochs", "epochs_planned",
                      "enforce", "budget_adherence", "time_s", "top1", "peak_mem_bytes", "co2e_kg", "energy_kwh",
                      "energy_covers", "profile", "seed", "dataset_label")
PAPER_PROFILE = "paper"
COMPARED_COLUMNS = ["batch", "alpha", "A", "eta", "epochs", "boost", "acc_drop_pp", "mem_cut", "co2e_cut"]

# Decimal places per column in the CSV (None: 4 significant digits, for tiny kg/kWh).
_CSV_DECIMALS: dict[str, int | None] = {
    "alpha": 4, "A": 4, "boost": 3, "acc_drop_pp": 2, "mem_cut": 3, "co2e_cut": 3, "t": 2, "m": 2,
    "budget_adherence": 3, "time_s": 2, "wall_time_s": 2, "cores_beside": 2, "top1": 2, "co2e_kg": None, "energy_kwh": None,
}
_INTEGER_COLUMNS = ("batch", "eta", "epochs", "epochs_planned", "peak_mem_bytes", "seed", "n_seeds")


def _number(value: Any) -> float:
    """A float, NaN for None or anything not numeric."""
    if value is None or isinstance(value, bool):
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _ratio(numerator: Any, denominator: Any) -> float:
    num, den = _number(numerator), _number(denominator)
    if math.isnan(num) or math.isnan(den) or den <= 0:
        return math.nan
    return num / den


# Columns averaged over seeds whose spread is reported as <column>_std.
SEED_SPREAD_COLUMNS = ("boost", "acc_drop_pp", "mem_cut", "co2e_cut", "top1", "time_s", "peak_mem_bytes", "co2e_kg",
                       "budget_adherence")


def per_seed_rows(cells: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per (model, cell, seed) with the ratios against the baseline of the same
    model and seed: boost = T_base / time, acc_drop_pp = top1_base - top1 (percentage
    points), mem_cut = M_base / peak memory, co2e_cut = CO2e_base / CO2e (NaN when either
    CO2e is missing)."""
    if not cells:
        raise ValueError("no cells given: Table 1 needs at least one baseline cell")
    for cell in cells:
        missing = [key for key in REQUIRED_CELL_KEYS if key not in cell]
        if missing:
            raise ValueError(f"cell {cell.get('model')!r}/{cell.get('cell')!r} lacks keys {missing}")
    # wall_time_s: the wall clock beside time_s (time_s is the process CPU time on a CPU); cores_beside: other
    # processes' busy cores while it was measured (a neighbour's share of the machine). Both absent in older cells.
    frame = pd.DataFrame([{**{key: cell[key] for key in REQUIRED_CELL_KEYS}, "wall_time_s": cell.get("wall_time_s"),
                           "cores_beside": cell.get("cores_beside")} for cell in cells])
    for column in ("t", "m", "alpha", "A", "budget_adherence", "time_s", "wall_time_s", "cores_beside", "top1", "co2e_kg",
                   "energy_kwh"):
        frame[column] = [_number(v) for v in frame[column]]
    duplicated = frame.duplicated(["model", "cell", "method", "seed"], keep=False)
    if duplicated.any():
        dup = frame[duplicated][["model", "cell", "method", "seed"]].drop_duplicates().to_dict("records")
        raise ValueError(f"cells given twice for {dup}")
    blocks: list[pd.DataFrame] = []
    for (model, seed), rows in frame.groupby(["model", "seed"], sort=False):
        rows = rows.copy()
        base = rows[rows["method"] == "baseline"]
        if len(base) == 0:
            raise ValueError(f"model {model!r} seed {seed} has cells {sorted(rows['cell'])} but no baseline cell "
                             "(method 'baseline'); boosts and cuts are relative to the baseline of the same seed")
        if len(base) > 1:
            raise ValueError(f"model {model!r} seed {seed} has {len(base)} baseline cells {sorted(base['cell'])}")
        ref = base.iloc[0]
        rows["boost"] = [_ratio(ref["time_s"], t) for t in rows["time_s"]]
        rows["acc_drop_pp"] = ref["top1"] - rows["top1"]
        rows["mem_cut"] = [_ratio(ref["peak_mem_bytes"], p) for p in rows["peak_mem_bytes"]]
        rows["co2e_cut"] = [_ratio(ref["co2e_kg"], c) for c in rows["co2e_kg"]]
        is_base = rows["method"] == "baseline"
        # Exact reference values, not x / x (which would be NaN for a zero or missing value).
        rows.loc[is_base, ["boost", "acc_drop_pp", "mem_cut"]] = [1.0, 0.0, 1.0]
        rows.loc[is_base, "co2e_cut"] = math.nan if math.isnan(_number(ref["co2e_kg"])) else 1.0
        blocks.append(rows)
    return pd.concat(blocks, ignore_index=True)


def _aggregate(rows: pd.DataFrame) -> dict[str, Any]:
    """Mean over seeds (std and n beside the main figures); labels from the first seed."""
    first = rows.iloc[0]
    out: dict[str, Any] = {column: first[column] for column in rows.columns}
    for column in rows.columns:
        values = pd.to_numeric(rows[column], errors="coerce")
        if column != "seed" and values.notna().any() and not isinstance(first[column], str):
            out[column] = float(values.mean())
    for column in SEED_SPREAD_COLUMNS:
        values = pd.to_numeric(rows[column], errors="coerce").dropna()
        out[f"{column}_std"] = float(values.std(ddof=1)) if len(values) > 1 else math.nan
    out["n_seeds"] = int(len(rows))
    out["seeds"] = " ".join(str(int(s)) for s in sorted(rows["seed"]))
    out["seed"] = int(sorted(rows["seed"])[0])
    return out


def build_table1(cells: list[dict[str, Any]]) -> pd.DataFrame:
    """Table 1 rows from cell records, one row per (model, cell): the mean over the seeds
    of every figure, each ratio taken against the baseline of the same seed (so acc drop
    is the seed-matched baseline's top-1 minus the cell's, averaged), with the spread
    (``<column>_std``, sample standard deviation; NaN for one seed) and ``n_seeds``.
    Rows: per model (in order of first appearance) the baseline, then the other cells by
    t descending, then m descending."""
    frame = per_seed_rows(cells)
    rows = [_aggregate(group) for _, group in frame.groupby(["model", "cell"], sort=False)]
    table = pd.DataFrame(rows)
    blocks = []
    for model in dict.fromkeys(table["model"]):
        block = table[table["model"] == model].copy()
        block["_order"] = (block["method"] != "baseline").astype(int)
        block = block.sort_values(["_order", "t", "m", "method"], ascending=[True, False, False, True],
                                  na_position="last", kind="stable")
        blocks.append(block.drop(columns="_order"))
    table = pd.concat(blocks, ignore_index=True)
    spread = [f"{column}_std" for column in SEED_SPREAD_COLUMNS]
    return table[TABLE1_COLUMNS + ["n_seeds", "seeds"] + spread]


def round_for_csv(table: pd.DataFrame, decimals_by_column: dict[str, int | None] | None = None,
                  integer_columns: tuple[str, ...] | None = None) -> pd.DataFrame:
    """A copy with each float column rounded to what its measurement supports (None:
    four significant digits, for tiny quantities such as kg of CO2e); integer columns
    become integers. The defaults are Table 1's columns."""
    decimals_by_column = _CSV_DECIMALS if decimals_by_column is None else decimals_by_column
    integer_columns = _INTEGER_COLUMNS if integer_columns is None else integer_columns
    out = table.copy()
    for column, decimals in decimals_by_column.items():
        if column not in out:
            continue
        values = pd.to_numeric(out[column], errors="coerce")
        if decimals is None:
            out[column] = [float(f"{v:.4g}") if pd.notna(v) else math.nan for v in values]
        else:
            out[column] = values.round(decimals)
    for column in integer_columns:
        if column in out:
            values = pd.to_numeric(out[column], errors="coerce")
            # A mean over seeds that differ (e.g. planned epochs) keeps two decimals.
            integral = values.dropna().map(lambda v: float(v).is_integer()).all()
            out[column] = values.astype("Int64") if integral else values.round(2)
    for column in out.columns:
        if column.endswith("_std"):
            out[column] = pd.to_numeric(out[column], errors="coerce").round(4)
    return out


def load_paper_table1() -> tuple[pd.DataFrame, pd.DataFrame]:
    """The paper's Table 1 (13 DAREL rows) and its baselines (time_s, top1), as
    packaged reference data."""
    folder = resources.files("darel") / "reference"
    with (folder / "table1_paper.csv").open("r", encoding="utf-8") as handle:
        paper = pd.read_csv(handle)
    with (folder / "table1_paper_baselines.csv").open("r", encoding="utf-8") as handle:
        baselines = pd.read_csv(handle)
    return paper, baselines


# ----------------------------------------------------------------------------- comparison


def _fmt(value: Any, column: str) -> str:
    number = _number(value)
    if math.isnan(number):
        return "—"
    if column in _INTEGER_COLUMNS:
        return str(int(round(number)))
    if column == "time_s":
        return f"{number:.1f}"
    return f"{number:.2f}"


def _fmt_ours(row: pd.Series | None, column: str) -> str:
    """Our value; with several seeds "mean ± std (n)" for the figures that have a spread."""
    if row is None:
        return _fmt(None, column)
    text = _fmt(row.get(column), column)
    n = _number(row.get("n_seeds"))
    std = _number(row.get(f"{column}_std"))
    if not math.isnan(n) and n > 1 and not math.isnan(std):
        text += f" ± {std:.2f} (n={int(n)})"
    return text


# A row whose measured training time exceeds t T by more than this share is flagged.
ADHERENCE_LIMIT = 1.05


def _adherence(row: pd.Series | None) -> str:
    """Our budget adherence, flagged in bold when over ADHERENCE_LIMIT."""
    value = _number(None if row is None else row.get("budget_adherence"))
    if math.isnan(value):
        return "—"
    return f"**{value:.3f} over**" if value > ADHERENCE_LIMIT else f"{value:.3f}"


def _budget_key(t: Any, m: Any) -> tuple[float, float] | None:
    tt, mm = _number(t), _number(m)
    if math.isnan(tt) or math.isnan(mm):
        return None
    return round(tt, 2), round(mm, 2)


def _budget_label(method: str, t: Any, m: Any) -> str:
    key = _budget_key(t, m)
    if key is None:
        return str(method)
    label = f"B(t={key[0]:.2f}, m={key[1]:.2f})"
    return label if method == "darel" else f"{method} {label}"


def _method_key(method: Any) -> str:
    return "".join(ch for ch in str(method).lower() if ch.isalnum())


def _markdown_table(header: list[str], rows: Iterable[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _distinct(values: Iterable[Any]) -> list[str]:
    return [str(v) for v in dict.fromkeys(values) if v is not None and not (isinstance(v, float) and math.isnan(v))]


def eta_of(A: float) -> int:
    """Eq. 5: the loss update period for an online ratio A."""
    return 3 if A <= 0.5 else (2 if A < 0.8 else 1)


def _first_seed_records(cells: list[dict[str, Any]]) -> dict[tuple[str, str], dict]:
    first: dict[tuple[str, str], dict] = {}
    for cell in sorted(cells, key=lambda c: c.get("seed", 0)):
        first.setdefault((cell["model"], cell["cell"]), cell)
    return first


def _share(part: Any, whole: Any) -> str:
    return f"{_number(part) / _number(whole):.0%}" if _number(whole) > 0 else "?"


def gap_reasons(table: pd.DataFrame, cells: list[dict[str, Any]], paper: pd.DataFrame,
                baselines: pd.DataFrame) -> dict[tuple[str, str], str]:
    """One line per (model, cell) of ``table`` saying why the row differs from the paper's:
    which of batch (as a share of its own baseline's), alpha, A, eta and epochs (as a share
    of its protocol's) differ and why, from the first seed's cell record and the paper's
    row for the same budget; then our accuracy drop against the paper's and their ratio.
    Rows whose records lack the fields (older or hand-made) get no line rather than a wrong one."""
    first = _first_seed_records(cells)
    lines: dict[tuple[str, str], str] = {}
    for _, row in table.iterrows():
        model, name = str(row["model"]), str(row["cell"])
        cell, base = first.get((model, name)), first.get((model, "baseline"))
        try:
            lines[(model, name)] = _gap_line(row, cell, base, paper[paper["model"] == model], baselines)
        except (KeyError, TypeError, ZeroDivisionError):
            continue
    return lines


def _drop_ratio(ours: Any, theirs: Any) -> str:
    mine, paper = _number(ours), _number(theirs)
    if math.isnan(mine) or math.isnan(paper):
        return ""
    ratio = f" ({mine / paper:.1f}x)" if paper > 0 else ""
    return f"accuracy drop {mine:.2f} vs the paper's {paper:.2f} p.p.{ratio}"


def _gap_line(row: pd.Series, cell: dict | None, base: dict | None, paper: pd.DataFrame,
              baselines: pd.DataFrame) -> str:
    method = str(row["method"])
    reference = paper[(paper["t"].round(2) == 1.0) & (paper["m"].round(2) == 1.0)]
    paper_batch = int(reference.iloc[0]["batch"]) if len(reference) else None
    paper_epochs = int(reference.iloc[0]["epochs"]) if len(reference) else None
    if method == "baseline":
        return (f"the reference of every ratio, no gap by definition: ours trains all {cell['n_train']} samples for "
                f"{cell['epochs']} epochs at batch {cell['batch']} on this profile's data, the paper's "
                f"{paper_epochs or '?'} epochs at batch {paper_batch or '?'} on CIFAR-100")
    theirs = paper_figures(str(row["model"]), method, row["t"], row["m"], paper, baselines)
    drop = _drop_ratio(row["acc_drop_pp"], theirs.get("acc_drop_pp"))
    key = _budget_key(row["t"], row["m"])
    if key is None:  # IDS + ADONIS: fixed settings, reported by the paper as time and top-1 only
        return (f"fixed settings, no budget: ours keeps alpha {cell['alpha']:.2f} of each class (IDS) and trains A "
                f"{cell['A']:.2f} of it for {cell['epochs']} epochs (ADONIS, eta {cell['eta']}; comparisons.ids_adonis); "
                "the paper states no settings for this row, only its time and top-1 (boost and drop come from them)"
                + (f"; {drop}" if drop else ""))
    match = paper[(paper["method"].map(_method_key) == _method_key(method)) & (paper["t"].round(2) == key[0])
                  & (paper["m"].round(2) == key[1])]
    if not len(match):
        return "not a budget of the paper's Table 1: nothing to compare"
    theirs_row = match.iloc[0]
    t, b, B = key[0], int(cell["batch"]), int(base["batch"])
    bp, ap, Ap, etap, ep = (int(theirs_row["batch"]), float(theirs_row["alpha"]), float(theirs_row["A"]),
                            int(theirs_row["eta"]), int(theirs_row["epochs"]))
    alpha, A, eta, epochs, protocol = (float(cell["alpha"]), float(cell["A"]), int(cell["eta"]), int(cell["epochs"]),
                                       int(cell.get("epochs_protocol", cell["epochs"])))
    ratio = float(cell["T_new_s"]) / float(cell["T_full_s"])
    A_eq = t / (alpha * ratio)
    held = " (held at A_max)" if A_eq > A + 1e-9 else (" (raised to A_min)" if A_eq < A - 1e-9 else "")
    implied = t / (ap * Ap)
    differ, same = [], []
    if paper_batch and abs(b / B - bp / paper_batch) > 1e-9:
        differ.append(f"batch {b} of our baseline's {B} vs the paper's {bp} of {paper_batch}: the largest batch whose "
                      "measured peak fits m M on our model (Algorithm 1), its memory falls differently with the batch")
    else:
        same.append(f"batch ({b} of {B}; the paper {bp} of {paper_batch})")
    if abs(alpha - ap) > 0.005:
        why = ("Eq. 3-4 lower alpha only where A would fall below A_min, and ours stays above it" if alpha > ap
               else "ours was lowered to keep A at A_min within the time budget (Eq. 3-4)")
        differ.append(f"alpha {alpha:.2f} vs {ap:.2f}: {why}")
    else:
        same.append(f"alpha {alpha:.2f}")
    if abs(A - Ap) > 0.005:
        differ.append(f"A {A:.2f} vs {Ap:.2f}: ours is t / (alpha T_new/T) = {A_eq:.2f}{held} with T_new = "
                      f"{ratio:.2f} T measured at batch {b}; the paper's A implies T_new = {implied:.2f} T")
    else:
        same.append(f"A {A:.2f}")
    if eta != etap:
        note = "" if eta_of(Ap) == etap else f"; Eq. 5 gives {eta_of(Ap)} for the paper's own A"
        differ.append(f"eta {eta} vs {etap}: Eq. 5 of the unclipped A{note}")
    else:
        same.append(f"eta {eta}")
    if paper_epochs and abs(epochs / protocol - ep / paper_epochs) > 0.02:
        differ.append(f"epochs {epochs} of {protocol} ({_share(epochs, protocol)}) vs {ep} of {paper_epochs} "
                      f"({_share(ep, paper_epochs)}): ours are the most whose predicted time fits t T")
    else:
        same.append(f"epochs ({epochs} of {protocol})")
    parts = differ + (["same " + ", ".join(same)] if same else []) + ([drop] if drop else [])
    return "; ".join(parts)


def _model_rows(model: str, paper_rows: pd.DataFrame, our_rows: pd.DataFrame, paper: pd.DataFrame,
                baselines: pd.DataFrame) -> list[list[str]]:
    """One model's rows of the report: ours in the table's order, each beside the paper's
    row for the same budget or method, then the paper's rows we lack."""
    ours_by_budget: dict[tuple[str, tuple[float, float] | None], pd.Series] = {}
    for _, row in our_rows.iterrows():
        ours_by_budget.setdefault((_method_key(row["method"]), _budget_key(row["t"], row["m"])), row)
    used: set[tuple[str, tuple[float, float] | None]] = set()
    table_rows: list[list[str]] = []

    def our_cells(orow: pd.Series | None, theirs: dict[str, Any]) -> list[str]:
        return [cell for column in COMPARED_COLUMNS
                for cell in (_fmt(theirs.get(column), column), _fmt_ours(orow, column))] + [_adherence(orow)]

    # Our rows in the table's order (the paper's: baseline, its budgets, IDS + ADONIS last),
    # each beside the paper's row for the same budget or method; the paper's rows we lack after.
    for key, orow in ours_by_budget.items():
        used.add(key)
        match = paper_rows[(paper_rows["method"].map(_method_key) == key[0])
                           & (paper_rows["t"].round(2) == (key[1] or (None, None))[0])
                           & (paper_rows["m"].round(2) == (key[1] or (None, None))[1])] if key[1] else paper_rows[:0]
        theirs = ({column: match.iloc[0][column] for column in COMPARED_COLUMNS} if len(match)
                  else paper_figures(model, str(orow["method"]), orow["t"], orow["m"], paper, baselines))
        label = "baseline" if key[0] == "baseline" else _budget_label(orow["method"], orow["t"], orow["m"])
        if not theirs:
            label += " (ours only)"
        table_rows.append([label] + our_cells(orow, theirs))
    for _, prow in paper_rows.iterrows():
        if (_method_key(prow["method"]), _budget_key(prow["t"], prow["m"])) in used:
            continue
        table_rows.append([_budget_label(prow["method"], prow["t"], prow["m"]) + " (paper only)"]
                          + our_cells(None, {column: prow.get(column) for column in COMPARED_COLUMNS}))
    return table_rows


def _baselines_section(ours: pd.DataFrame, baselines: pd.DataFrame) -> list[str]:
    """The report's last section: each baseline's time and top-1 beside the paper's, then
    our baselines the paper does not list."""
    base_rows: list[list[str]] = []
    matched: set[tuple[str, str]] = set()
    for _, brow in baselines.iterrows():
        key = (str(brow["model"]), _method_key(brow["method"]))
        mine = ours[(ours["model"] == brow["model"]) & (ours["method"].map(_method_key) == key[1])]
        orow = mine.iloc[0] if len(mine) else None
        matched.add(key)
        base_rows.append([str(brow["model"]), str(brow["method"]),
                          _fmt(brow["time_s"], "time_s"), _fmt_ours(orow, "time_s"),
                          _fmt(brow["top1"], "top1"), _fmt_ours(orow, "top1")])
    for _, orow in ours[ours["method"] == "baseline"].iterrows():
        if (str(orow["model"]), "baseline") not in matched:
            base_rows.append([str(orow["model"]), "baseline (ours only)", "—", _fmt_ours(orow, "time_s"),
                              "—", _fmt_ours(orow, "top1")])
    return (["## Baselines", "", "Times in seconds, top-1 in percent.", ""]
            + _markdown_table(["model", "method", "time_s paper", "time_s ours", "top1 paper", "top1 ours"],
                              base_rows))


def compare_with_paper(ours: pd.DataFrame, paper: pd.DataFrame, baselines: pd.DataFrame,
                       explanations: dict[tuple[str, str], str] | None = None,
                       notes: dict[tuple[str, str], dict[str, str]] | None = None) -> str:
    """A Markdown report: a narrow summary first (narrow_summary, readable in a terminal)
    with one line per row over its time budget or with an accuracy drop more than twice
    the paper's (``notes``: attention's, computed without cell records when not given);
    then per model the paper's Table 1 rows beside ours matched on (model, t, m), our
    extra rows, then the baselines' time and top-1 beside the paper's. States the
    profile and data set the numbers come from."""
    notes = attention(ours, paper, baselines) if notes is None else notes
    profiles = _distinct(ours["profile"]) if "profile" in ours else []
    datasets = _distinct(ours["dataset_label"]) if "dataset_label" in ours else []
    lines = ["# Table 1: this reproduction beside the paper", "",
             f"- our profile: {', '.join(profiles) or 'unknown'}",
             f"- our data set: {', '.join(datasets) or 'unknown'}",
             "- paper: ResNet18 / ResNet18-HC on CIFAR-100, one 16 GB GPU (DAREL paper, Table 1)", ""]
    if profiles != [PAPER_PROFILE]:
        lines += [
            f"> **WARNING: these results are not from the paper profile** (profile: {', '.join(profiles) or 'unknown'};"
            f" data: {', '.join(datasets) or 'unknown'}).",
            "> Absolute times, accuracies, memory and CO2e are not comparable with the paper's. Only the",
            "> budgeting logic (batch, alpha, A, eta chosen per budget) and the direction of the ratios can be read"
            " against it.",
            "",
        ]
    lines += ["## At a glance", "",
              "Per row its budget B(t, m), boost (x) and top-1 drop (pp), ours/the paper's for the same budget; "
              f"adherence = measured time / t T (over {ADHERENCE_LIMIT}: over the time budget); why: over budget "
              "(busy: other processes held cores beside it), drop Nx (N times the paper's drop); each explained "
              "below.", ""]
    lines += narrow_summary(ours, paper, baselines, notes) + [""]
    numbers = table1_row_numbers(ours)
    reasons = [f"- row {numbers[key]} ({key[0]} {_budget_label(row['method'], row['t'], row['m'])}), {what}: "
               f"{notes[key][kind]}"
               for _, row in ours.iterrows() for key in [(str(row["model"]), str(row["cell"]))] if key in notes
               for kind, what in (("over", "over budget"), ("drop", "accuracy drop")) if kind in notes[key]]
    if reasons:
        lines += ["### Why", ""] + reasons + [""]
    header = (["budget"] + [f"{c} {side}" for c in COMPARED_COLUMNS for side in ("paper", "ours")]
              + ["adherence ours"])
    models = list(dict.fromkeys(list(paper["model"]) + list(ours["model"])))
    over_all: list[str] = []
    for model in models:
        paper_rows = paper[paper["model"] == model]
        our_rows = ours[ours["model"] == model]
        table_rows = _model_rows(model, paper_rows, our_rows, paper, baselines)
        lines += [f"## {model}", ""] + _markdown_table(header, table_rows) + [""]
        over = [f"{_budget_label(r['method'], r['t'], r['m'])} {_number(r['budget_adherence']):.3f}"
                for _, r in our_rows.iterrows() if _number(r.get("budget_adherence")) > ADHERENCE_LIMIT]
        over_all += [f"{model} {text}" for text in over]
        if over:
            lines += [f"**Over the time budget** (adherence above {ADHERENCE_LIMIT}): " + ", ".join(over) + ".", ""]
        notes = [(r, (explanations or {}).get((model, str(r["cell"])))) for _, r in our_rows.iterrows()]
        if any(text for _, text in notes):
            lines += ["Why each row differs from the paper's (batch as a share of its own baseline's, epochs of its "
                      "protocol's):", ""]
            lines += [f"- {'baseline' if r['method'] == 'baseline' else _budget_label(r['method'], r['t'], r['m'])}: "
                      f"{text}" for r, text in notes if text]
            lines.append("")
    if over_all:  # said in the heading's list too, after the paper's line
        at = next(i for i, line in enumerate(lines) if line.startswith("- paper:")) + 1
        lines.insert(at, f"- **over the time budget** (adherence = measured time / t T above {ADHERENCE_LIMIT}): "
                         + "; ".join(over_all))

    lines += _baselines_section(ours, baselines)
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- rows that need a reason

# Other processes' busy cores beside a run above which the machine counts as busy.
BUSY_CORES = 0.5
# An accuracy drop above this multiple of the paper's gets its own explanation.
DROP_RATIO_LIMIT = 2.0


def _load_words(cores: float) -> str:
    """The machine's load beside a run in a few words, from its ``cores_beside``."""
    if math.isnan(cores):
        return "load beside it not recorded"
    return (f"{cores:.1f} other cores busy beside it" if cores > BUSY_CORES
            else f"machine idle beside it ({cores:.1f} cores)")


def rerun_command(row: pd.Series, target: str = "results/table1.csv") -> str:
    """The command that retrains one row's cells (each seed's train_online output) and rebuilds the table."""
    seeds = str(row.get("seeds") or row.get("seed") or 0).split()
    outputs = " ".join(f"runs/{row['profile']}/table1/{row['model']}/s{int(float(seed))}/{row['cell']}/train.json"
                       for seed in seeds)
    return f"snakemake --cores all {target} --forcerun {outputs}"


def over_budget_line(row: pd.Series) -> str:
    """Why a row ran over its time budget, from its figures: its CPU time and wall time
    against t T, what ran beside it, and the command that reruns it on an idle machine."""
    time_s, adherence = _number(row.get("time_s")), _number(row.get("budget_adherence"))
    wall, cores = _number(row.get("wall_time_s")), _number(row.get("cores_beside"))
    budget_s = time_s / adherence
    wall_text = "wall time not recorded" if math.isnan(wall) else f"wall time {wall:.1f} s"
    cause = ("a busy machine slows each step of a CPU run (shared caches, memory bandwidth, clock)"
             if cores > BUSY_CORES else "the plan's time prediction was short of the measured time")
    return (f"adherence {adherence:.3f}: measured time {time_s:.1f} s (CPU time on a CPU) against t T = "
            f"{budget_s:.1f} s, {wall_text}; "
            f"{_load_words(cores)}: {cause}; on an idle machine rerun `{rerun_command(row)}`")


def drop_line(row: pd.Series, paper_drop: float, base_top1: float, paper_base_top1: float,
              paper_epochs: float = math.nan, cell: dict[str, Any] | None = None) -> str:
    """Why a row's accuracy drop is more than DROP_RATIO_LIMIT times the paper's, from its
    figures: the data, the model's size and epochs beside the paper's, the baselines' top-1."""
    drop = _number(row.get("acc_drop_pp"))
    kind = "generated and small" if str(row.get("dataset_label", "")).startswith("GENERATED") else "not CIFAR-100"
    size = f" ({int(cell['n_train']):,} training samples)" if cell and cell.get("n_train") else ""
    params = f" with {int(cell['n_params']):,} parameters" if cell and cell.get("n_params") else ""
    protocol = f" of {int(cell['epochs_protocol'])}" if cell and cell.get("epochs_protocol") else ""
    theirs = "" if math.isnan(paper_epochs) else f" (the paper's row: {int(paper_epochs)} of 200 epochs)"
    return (f"drop {drop:.2f} vs the paper's {paper_drop:.2f} pp ({drop / paper_drop:.1f}x): the data is {kind}{size}, "
            f"the paper's 50,000 CIFAR-100 images; our model trains {int(_number(row['epochs']))}{protocol} epochs"
            f"{params}{theirs}, the paper's a full-width ResNet18 (about 11 M parameters); our baseline's top-1 "
            f"is {base_top1:.2f} % vs the paper's {paper_base_top1:.2f} % (where a network underfits, the studies "
            "measured DAREL below a random subset at equal budget: docs/studies.md)")


def attention(table: pd.DataFrame, paper: pd.DataFrame, baselines: pd.DataFrame,
              cells: list[dict[str, Any]] | None = None) -> dict[tuple[str, str], dict[str, str]]:
    """Per (model, cell) of ``table`` what a reader must be told: ``over`` (over_budget_line)
    for a row over ADHERENCE_LIMIT, ``drop`` (drop_line) for an accuracy drop more than
    DROP_RATIO_LIMIT times the paper's, and ``why``, both in a few words for the narrow table."""
    first = _first_seed_records(cells or [])
    out: dict[tuple[str, str], dict[str, str]] = {}
    for model, rows in table.groupby("model", sort=False):
        base = rows[rows["method"] == "baseline"]
        base_top1 = _number(base.iloc[0]["top1"]) if len(base) else math.nan
        theirs_base = baselines[(baselines["model"] == model) & (baselines["method"] == "baseline")]
        paper_base_top1 = _number(theirs_base.iloc[0]["top1"]) if len(theirs_base) else math.nan
        for _, row in rows.iterrows():
            if row["method"] == "baseline":
                continue
            notes: dict[str, str] = {}
            words = []
            if _number(row.get("budget_adherence")) > ADHERENCE_LIMIT:
                notes["over"] = over_budget_line(row)
                busy = _number(row.get("cores_beside")) > BUSY_CORES
                words.append("over budget, busy" if busy else "over budget")
            paper_drop = _number(paper_figures(str(model), str(row["method"]), row["t"], row["m"], paper,
                                               baselines).get("acc_drop_pp"))
            drop = _number(row.get("acc_drop_pp"))
            if paper_drop > 0 and drop > DROP_RATIO_LIMIT * paper_drop and not math.isnan(base_top1):
                key = _budget_key(row["t"], row["m"])
                same = paper[(paper["model"] == model) & (paper["t"].round(2) == (key or (None, None))[0])
                             & (paper["method"].map(_method_key) == _method_key(row["method"]))
                             & (paper["m"].round(2) == (key or (None, None))[1])] if key else paper[:0]
                notes["drop"] = drop_line(row, paper_drop, base_top1, paper_base_top1,
                                          _number(same.iloc[0]["epochs"]) if len(same) else math.nan,
                                          first.get((str(model), str(row["cell"]))))
                words.append(f"drop {drop / paper_drop:.1f}x")
            if notes:
                notes["why"] = "; ".join(words)
                out[(str(model), str(row["cell"]))] = notes
    return out


def _pair(ours: Any, theirs: Any) -> str:
    mine, paper = _number(ours), _number(theirs)
    return f"{'—' if math.isnan(mine) else f'{mine:.2f}'}/{'—' if math.isnan(paper) else f'{paper:.2f}'}"


def _short_budget(row: pd.Series) -> str:
    key = _budget_key(row["t"], row["m"])
    return (f"{key[0]:.2f}/{key[1]:.2f}" if key else str(row["method"])) if row["method"] != "baseline" \
        else "baseline"


def narrow_summary(table: pd.DataFrame, paper: pd.DataFrame, baselines: pd.DataFrame,
                   notes: dict[tuple[str, str], dict[str, str]]) -> list[str]:
    """Table 1 in seven columns that fit a 100-column terminal: row, model, budget (t/m), boost
    and drop ours/paper, adherence and why the row needs a word (``attention``'s ``why``)."""
    numbers = table1_row_numbers(table)
    rows = []
    for _, row in table.iterrows():
        key = (str(row["model"]), str(row["cell"]))
        theirs = paper_figures(key[0], str(row["method"]), row["t"], row["m"], paper, baselines)
        adherence = _number(row.get("budget_adherence"))
        rows.append([str(numbers[key]), key[0], _short_budget(row), _pair(row["boost"], theirs.get("boost")),
                     _pair(row["acc_drop_pp"], theirs.get("acc_drop_pp")),
                     "—" if math.isnan(adherence) else f"{adherence:.2f}",
                     notes.get(key, {}).get("why", "")])
    return _markdown_table(["#", "model", "t/m", "boost ours/paper", "drop ours/paper", "adherence", "why"], rows)


def _mean(values: Iterable[Any]) -> float | None:
    numbers = [v for v in (_number(x) for x in values) if not math.isnan(v)]
    return round(sum(numbers) / len(numbers), 4) if numbers else None


def headline_metrics(figures: dict[str, float | None]) -> dict[str, float]:
    """A metrics file's content: the given figures, rounded (counts as integers), missing
    ones left out."""
    return {key: int(value) if key in ("darel_rows", "methods") else round(float(value), 4)
            for key, value in figures.items() if value is not None and not math.isnan(float(value))}


def table_metrics(table: pd.DataFrame) -> dict:
    """Table 1's headline figures for ``dvc metrics show`` and ``dvc exp show``: over the
    DAREL rows (every budget of every model) the mean and best boost, the mean accuracy
    drop (p.p.) and the mean budget adherence, and how many DAREL rows they are over
    (``darel_rows``; baselines and IDS + ADONIS are not in them); the table itself is the
    CSV. Flat keys shared with the other tables' files (boost_mean, darel_rows), so the
    commands print one short row per table."""
    darel = table[table["method"] == "darel"]
    boosts = [b for b in (_number(v) for v in darel["boost"]) if not math.isnan(b)]
    return headline_metrics({"boost_mean": _mean(darel["boost"]), "boost_max": max(boosts) if boosts else None,
                             "acc_drop_pp_mean": _mean(darel["acc_drop_pp"]),
                             "adherence_mean": _mean(darel["budget_adherence"]), "darel_rows": len(darel)})


# ----------------------------------------------------------------------------- MLflow view

# Table 1's MLflow view (darel.tracking.TABLE_VIEW_COLUMNS): for each figure ours under a
# short name and the paper's beside it (`<name> paper`), adherence and top-1, rounded (the
# MLflow UI prints a metric with every digit it has): (view name, table column, decimals).
MLFLOW_FIGURES = (("boost", "boost", 2), ("drop", "acc_drop_pp", 2), ("mem", "mem_cut", 2), ("CO2e", "co2e_cut", 2))
MLFLOW_OTHER_FIGURES = (("adherence", "budget_adherence", 3), ("top1", "top1", 2))
PAPER_FIGURES = ("boost", "acc_drop_pp", "mem_cut", "co2e_cut")


def paper_figures(model: str, method: str, t: Any, m: Any, paper: pd.DataFrame,
                  baselines: pd.DataFrame) -> dict[str, float]:
    """The paper's boost, accuracy drop, memory and CO2e cut for the row of ``model`` and
    ``method`` at budget (t, m); the baseline's are 1, 0, 1, 1 by definition, a row the
    paper reports only by time and top-1 (IDS + ADONIS) gets boost and accuracy drop
    from those; {} when the paper has no such row."""
    if method == "baseline":
        return {"boost": 1.0, "acc_drop_pp": 0.0, "mem_cut": 1.0, "co2e_cut": 1.0}
    key = _budget_key(t, m)
    if key is not None:
        match = paper[(paper["model"] == model) & (paper["method"].map(_method_key) == _method_key(method))
                      & (paper["t"].round(2) == key[0]) & (paper["m"].round(2) == key[1])]
        if len(match):
            row = match.iloc[0]
            return {name: float(row[name]) for name in PAPER_FIGURES if not math.isnan(_number(row[name]))}
    mine = baselines[(baselines["model"] == model) & (baselines["method"].map(_method_key) == _method_key(method))]
    base = baselines[(baselines["model"] == model) & (baselines["method"] == "baseline")]
    if len(mine) and len(base):
        return {"boost": float(base.iloc[0]["time_s"]) / float(mine.iloc[0]["time_s"]),
                "acc_drop_pp": float(base.iloc[0]["top1"]) - float(mine.iloc[0]["top1"])}
    return {}


def table1_row_numbers(table: pd.DataFrame) -> dict[tuple[str, str], int]:
    """(model, cell) -> the row's number in Table 1 as built (from 1): the order of the
    paper's Table 1, each model's baseline first and IDS + ADONIS after its budgets."""
    return {(str(row["model"]), str(row["cell"])): number for number, (_, row) in enumerate(table.iterrows(), 1)}


def _settings_text(row: pd.Series) -> str:
    """The calibrated settings of a row as one short text: batch/alpha/A/eta/epochs."""
    def show(name: str, decimals: int) -> str:
        value = _number(row.get(name))
        return "—" if math.isnan(value) else (f"{value:.{decimals}f}" if decimals else str(int(round(value))))
    return "/".join(show(name, decimals) for name, decimals in
                    (("batch", 0), ("alpha", 2), ("A", 2), ("eta", 0), ("epochs", 0)))


def mlflow_row_figures(rows: pd.DataFrame, paper: pd.DataFrame, baselines: pd.DataFrame,
                       row_numbers: dict[tuple[str, str], int] | None = None) -> dict[tuple, dict]:
    """Per (model, seed, cell) row of ``per_seed_rows``: what its MLflow run shows in Table
    1's view. Metrics: each figure rounded, the paper's beside it (``<name> paper``; NaN and
    missing left out), adherence, top-1 and ``row``, the row's number in the table, which
    orders the view. A tag (text): ``calibrated``, batch/alpha/A/eta/epochs. The budget is
    in the run's name (``t0.80_m0.70``)."""
    out: dict[tuple, dict] = {}
    for _, row in rows.iterrows():
        figures: dict[str, float | str] = {}
        for name, column, decimals in MLFLOW_FIGURES + MLFLOW_OTHER_FIGURES:
            value = _number(row.get(column))
            if not math.isnan(value):
                figures[name] = round(value, decimals)
        theirs = paper_figures(str(row["model"]), str(row["method"]), row["t"], row["m"], paper, baselines)
        for name, column, decimals in MLFLOW_FIGURES:
            if column in theirs:
                figures[f"{name} paper"] = round(theirs[column], decimals)
        if row_numbers and (str(row["model"]), str(row["cell"])) in row_numbers:
            figures["row"] = float(row_numbers[(str(row["model"]), str(row["cell"]))])
        figures["calibrated"] = _settings_text(row)
        out[(str(row["model"]), int(row["seed"]), str(row["cell"]))] = figures
    return out
