"""Figures for the results. Rendered with matplotlib's Agg canvas directly, so
importing this module never changes the process's global matplotlib backend."""

from __future__ import annotations

import math
import os

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
