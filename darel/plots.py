"""Figures for the results. Rendered with matplotlib's Agg canvas directly, so
importing this module never changes the process's global matplotlib backend."""

from __future__ import annotations

import math
import os
import textwrap

import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from darel.io import atomic_path


def _budget_key(t: float, m: float) -> tuple[float, float] | None:
    if pd.isna(t) or pd.isna(m):
        return None
    return round(float(t), 2), round(float(m), 2)


def plot_table1(table: pd.DataFrame, path: str | os.PathLike, paper: pd.DataFrame | None = None,
                title: str | None = None) -> None:
    """Speed-up against accuracy cost: boost (y) vs accuracy drop in p.p. (x), one panel
    per model. Each budget has a number; our point (filled) and the paper's point for the
    same budget (hollow) carry it and are joined by a thin line, and a key beside each
    panel says which budget each number is (numbers instead of long labels keep every
    label readable and inside the figure). Written atomically as PNG."""
    for column in ("model", "method", "t", "m", "boost", "acc_drop_pp"):
        if column not in table:
            raise ValueError(f"table lacks column {column!r} needed for the plot")
    models = list(dict.fromkeys(table["model"]))
    if not models:
        raise ValueError("table has no rows to plot")
    fig = Figure(figsize=(7.2 * len(models), 5.4), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(models), squeeze=False)[0]
    for ax, model in zip(axes, models):
        rows = table[table["model"] == model]
        reference = paper[paper["model"] == model] if paper is not None else pd.DataFrame()
        numbers: dict = {}
        key_lines: list[str] = []
        for _, row in rows.iterrows():
            key = _budget_key(row["t"], row["m"])
            label = "baseline" if row["method"] == "baseline" else (
                f"B({key[0]:.2f}, {key[1]:.2f})" if key and row["method"] == "darel" else str(row["method"]))
            numbers[(row["method"], key)] = len(numbers) + 1
            key_lines.append(f"{numbers[(row['method'], key)]:>2}  {label}")
        xs, ys = [], []
        for _, row in rows.iterrows():
            key = _budget_key(row["t"], row["m"])
            number = numbers[(row["method"], key)]
            x, y = float(row["acc_drop_pp"]), float(row["boost"])
            if math.isnan(x) or math.isnan(y):
                continue
            colour = "black" if row["method"] == "baseline" else "tab:blue"
            ax.scatter([x], [y], color=colour, s=28, zorder=3)
            ax.annotate(str(number), (x, y), textcoords="offset points", xytext=(4, 3), fontsize=7, color=colour)
            xs.append(x)
            ys.append(y)
            if len(reference) and key is not None:
                match = reference[(reference["t"].round(2) == key[0]) & (reference["m"].round(2) == key[1])
                                  & (reference["method"].str.lower().str.replace(" ", "")
                                     == str(row["method"]).lower().replace(" ", ""))]
                for _, ref in match.iterrows():
                    px, py = float(ref["acc_drop_pp"]), float(ref["boost"])
                    ax.plot([x, px], [y, py], color="grey", linewidth=0.6, alpha=0.6, zorder=1)
                    ax.scatter([px], [py], facecolors="none", edgecolors="tab:red", s=28, zorder=2)
                    ax.annotate(str(number), (px, py), textcoords="offset points", xytext=(4, -9), fontsize=7,
                                color="tab:red")
                    xs.append(px)
                    ys.append(py)
        if xs:
            span_x = max(max(xs) - min(xs), 1.0)
            span_y = max(max(ys) - min(ys), 0.2)
            ax.set_xlim(min(xs) - 0.08 * span_x, max(xs) + 0.15 * span_x)
            ax.set_ylim(min(ys) - 0.08 * span_y, max(ys) + 0.12 * span_y)
        ax.scatter([], [], color="tab:blue", s=28, label="ours")
        if len(reference):
            ax.scatter([], [], facecolors="none", edgecolors="tab:red", s=28, label="paper (same budget)")
        ax.axhline(1.0, color="grey", linewidth=0.6, linestyle=":")
        ax.set_title(str(model))
        ax.set_xlabel("accuracy drop vs baseline (p.p.)")
        ax.set_ylabel("boost vs baseline (x)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
        ax.text(1.02, 1.0, "\n".join(key_lines), transform=ax.transAxes, fontsize=7, va="top", ha="left",
                family="monospace")
    if title:
        fig.suptitle(textwrap.fill(title, width=int(95 * len(models))), fontsize=10)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)  # explicit: the temp name ends in .tmp


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The points no other point beats on both counts (less time, more accuracy), by time."""
    front: list[tuple[float, float]] = []
    for x, y in sorted(points, key=lambda p: (p[0], -p[1])):
        if not front or y > front[-1][1]:
            front.append((x, y))
    return front


def plot_study(summary: pd.DataFrame, path: str | os.PathLike, *, title: str, metric: str = "top1",
               ylabel: str = "test top-1 (%)",
               times: tuple[tuple[str, str], ...] = (("time_s", "training time (s)"),)) -> None:
    """``metric`` against time, one colour per method, error bars over seeds (one
    standard deviation), the Pareto frontier of the method means (baseline included) drawn
    per panel, the baseline marked; one panel per ``panel`` value (the memory level for
    Table 1, the model for Tables 2/3) and one row of panels per accounting of time in
    ``times`` ((column, axis label), e.g. the training time and the total time with the
    scorer's costs). Written atomically as PNG."""
    y_mean, y_std = f"{metric}_mean", f"{metric}_std"
    for column in ("method", "panel", "model", y_mean, *(f"{t}_mean" for t, _ in times)):
        if column not in summary:
            raise ValueError(f"summary lacks column {column!r} needed for the plot")
    budgets = summary[summary["method"] != "baseline"]
    panels = list(dict.fromkeys(budgets["panel"].dropna()))
    if not panels:
        raise ValueError("the study has no budgeted rows to plot")
    methods = list(dict.fromkeys(budgets["method"]))
    colours = {method: f"C{i}" for i, method in enumerate(methods)}
    fig = Figure(figsize=(5.2 * len(panels), 4.6 * len(times)), layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.subplots(len(times), len(panels), squeeze=False)
    for (time_column, xlabel), axes in zip(times, grid):
        x_mean, x_std = f"{time_column}_mean", f"{time_column}_std"
        for ax, panel in zip(axes, panels):
            rows = budgets[budgets["panel"] == panel]
            base = summary[(summary["method"] == "baseline") & summary["model"].isin(set(rows["model"]))]
            for method in methods:
                mine = rows[rows["method"] == method]
                if not len(mine):
                    continue
                ax.errorbar(mine[x_mean], mine[y_mean], xerr=mine[x_std].fillna(0).to_numpy(),
                            yerr=mine[y_std].fillna(0).to_numpy(), fmt="o", ms=5, capsize=3, color=colours[method],
                            label=method, zorder=3)
                for row in mine.itertuples():
                    ax.annotate(str(row.budget).replace("B(", "").replace(")", ""),
                                (getattr(row, x_mean), getattr(row, y_mean)), textcoords="offset points",
                                xytext=(3, -9), fontsize=6, color=colours[method])
            points = list(zip(rows[x_mean], rows[y_mean])) + list(zip(base[x_mean], base[y_mean]))
            front = pareto_front([p for p in points if not (math.isnan(p[0]) or math.isnan(p[1]))])
            if len(front) > 1:
                ax.step([p[0] for p in front], [p[1] for p in front], where="post", color="grey", linewidth=2.5,
                        alpha=0.45, label="Pareto frontier (means)", zorder=1)
            if len(base):
                b = base.iloc[0]
                ax.errorbar([b[x_mean]], [b[y_mean]], xerr=[0 if pd.isna(b[x_std]) else b[x_std]],
                            yerr=[0 if pd.isna(b[y_std]) else b[y_std]], fmt="*", ms=11, color="black",
                            label="baseline (all data)", zorder=4)
            ax.set_title(str(panel))
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(textwrap.fill(title, width=int(60 * len(panels))), fontsize=9)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
