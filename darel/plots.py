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


def _budget_text(t: float, m: float) -> str:
    if pd.isna(t) or pd.isna(m):
        return ""
    return f"t={t:.2f}\nm={m:.2f}"


def plot_table1(table: pd.DataFrame, path: str | os.PathLike, paper: pd.DataFrame | None = None) -> None:
    """Speed-up against accuracy cost: boost (y) vs accuracy drop in p.p. (x), one
    panel per model, each point labelled with its budget; the paper's points, when
    given, as hollow markers for reference. Written atomically as PNG."""
    for column in ("model", "method", "t", "m", "boost", "acc_drop_pp"):
        if column not in table:
            raise ValueError(f"table lacks column {column!r} needed for the plot")
    models = list(dict.fromkeys(table["model"]))
    if not models:
        raise ValueError("table has no rows to plot")
    fig = Figure(figsize=(5.5 * len(models), 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(models), squeeze=False)[0]
    for ax, model in zip(axes, models):
        rows = table[table["model"] == model]
        ax.scatter(rows["acc_drop_pp"], rows["boost"], color="tab:blue", label="ours", zorder=3)
        for _, row in rows.iterrows():
            if row["method"] == "baseline":
                text = "baseline"
            else:
                text = _budget_text(row["t"], row["m"]) or str(row["method"])
            if not (math.isnan(float(row["acc_drop_pp"])) or math.isnan(float(row["boost"]))):
                ax.annotate(text, (row["acc_drop_pp"], row["boost"]), textcoords="offset points", xytext=(4, 3),
                            fontsize=7, color="tab:blue")
        if paper is not None:
            reference = paper[paper["model"] == model]
            if len(reference):
                ax.scatter(reference["acc_drop_pp"], reference["boost"], facecolors="none", edgecolors="tab:red",
                           label="paper", zorder=2)
        ax.axhline(1.0, color="grey", linewidth=0.6, linestyle=":")
        ax.set_title(str(model))
        ax.set_xlabel("accuracy drop vs baseline (p.p.)")
        ax.set_ylabel("boost vs baseline (x)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="best")
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
               ylabel: str = "test top-1 (%)") -> None:
    """``metric`` against training time, one colour per method, error bars over seeds (one
    standard deviation), the Pareto frontier of the method means (baseline included) drawn
    per panel, the baseline marked; one panel per ``panel`` value (the memory level for
    Table 1, the model for Tables 2/3). Written atomically as PNG."""
    y_mean, y_std = f"{metric}_mean", f"{metric}_std"
    for column in ("method", "panel", "model", "time_s_mean", y_mean):
        if column not in summary:
            raise ValueError(f"summary lacks column {column!r} needed for the plot")
    budgets = summary[summary["method"] != "baseline"]
    panels = list(dict.fromkeys(budgets["panel"].dropna()))
    if not panels:
        raise ValueError("the study has no budgeted rows to plot")
    methods = list(dict.fromkeys(budgets["method"]))
    colours = {method: f"C{i}" for i, method in enumerate(methods)}
    fig = Figure(figsize=(5.2 * len(panels), 4.6), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, panel in zip(axes, panels):
        rows = budgets[budgets["panel"] == panel]
        base = summary[(summary["method"] == "baseline") & summary["model"].isin(set(rows["model"]))]
        for method in methods:
            mine = rows[rows["method"] == method]
            if not len(mine):
                continue
            ax.errorbar(mine["time_s_mean"], mine[y_mean], xerr=mine["time_s_std"].fillna(0).to_numpy(),
                        yerr=mine[y_std].fillna(0).to_numpy(), fmt="o", ms=5, capsize=3, color=colours[method],
                        label=method, zorder=3)
            for row in mine.itertuples():
                ax.annotate(str(row.budget).replace("B(", "").replace(")", ""), (row.time_s_mean, getattr(row, y_mean)),
                            textcoords="offset points", xytext=(3, -9), fontsize=6, color=colours[method])
        points = list(zip(rows["time_s_mean"], rows[y_mean])) + list(zip(base["time_s_mean"], base[y_mean]))
        front = pareto_front([p for p in points if not (math.isnan(p[0]) or math.isnan(p[1]))])
        if len(front) > 1:
            ax.step([p[0] for p in front], [p[1] for p in front], where="post", color="grey", linewidth=2.5,
                    alpha=0.45, label="Pareto frontier (means)", zorder=1)
        if len(base):
            b = base.iloc[0]
            ax.errorbar([b["time_s_mean"]], [b[y_mean]], xerr=[0 if pd.isna(b["time_s_std"]) else b["time_s_std"]],
                        yerr=[0 if pd.isna(b[y_std]) else b[y_std]], fmt="*", ms=11, color="black",
                        label="baseline (all data)", zorder=4)
        ax.set_title(str(panel))
        ax.set_xlabel("training time (s)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(textwrap.fill(title, width=int(60 * len(panels))), fontsize=9)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
