"""Figures for the results. Rendered with matplotlib's Agg canvas directly, so
importing this module never changes the process's global matplotlib backend."""

from __future__ import annotations

import math
import os
import textwrap

import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Text

from darel.io import atomic_path


def _budget_key(t: float, m: float) -> tuple[float, float] | None:
    if pd.isna(t) or pd.isna(m):
        return None
    return round(float(t), 2), round(float(m), 2)


def _off_scale(values: list[float]) -> float:
    """The accuracy drop above which a point leaves the main axis for the side axis: far
    beyond the rest (3 interquartile ranges above the upper quartile, at least 10 p.p.
    past it); infinity when nothing is that far."""
    if len(values) < 4:
        return math.inf
    ordered = sorted(values)
    q1, q3 = ordered[len(ordered) // 4], ordered[(3 * len(ordered)) // 4]
    limit = q3 + max(3 * (q3 - q1), 10.0)
    return limit if ordered[-1] > limit else math.inf


# Where a point's number may go, in points from the point: close first, then further out
# on rings of 12 directions (joined to the point by a thin line).
_LABEL_OFFSETS = [(5, 4), (5, -11), (-13, 4), (-13, -11), (-4, 8), (-4, -16)] + [
    (round(r * math.cos(a * math.pi / 6)) - 4, round(r * math.sin(a * math.pi / 6)) - 4)
    for r in (16, 26, 38, 52, 68) for a in range(12)]


# The least room between two numbers, in pixels: numbers that touch read as one ("2" and
# "7" side by side as "27").
LABEL_GAP_PX = 3.0


def _overlap_area(box, boxes, gap: float = 0.0) -> float:
    """The area of ``box`` within ``gap`` of ``boxes``, summed (0: clear of them all)."""
    return sum(max(0.0, min(box.x1, other.x1 + gap) - max(box.x0, other.x0 - gap))
               * max(0.0, min(box.y1, other.y1 + gap) - max(box.y0, other.y0 - gap)) for other in boxes)


def _text_box(note, renderer):
    """Where an annotation's text is drawn, without its line to the point."""
    note.update_positions(renderer)
    return Text.get_window_extent(note, renderer)


def _segment_hits(x0: float, y0: float, x1: float, y1: float, box) -> bool:
    """Whether the segment from (x0, y0) to (x1, y1) passes through ``box`` (display units)."""
    steps = 24
    return any(box.x0 <= x0 + (x1 - x0) * i / steps <= box.x1 and box.y0 <= y0 + (y1 - y0) * i / steps <= box.y1
               for i in range(steps + 1))


def marker_box(ax, x: float, y: float, renderer=None):
    """The display box a plotted marker (size 30 points squared) takes, with a little room."""
    from matplotlib.transforms import Bbox

    px, py = ax.transData.transform((x, y))
    half = 4 * ax.figure.dpi / 72
    return Bbox.from_extents(px - half, py - half, px + half, py + half)


def _place_labels(ax, labels: list[tuple[float, float, str, str]], renderer, taken: list) -> None:
    """Number each point without overlaps: each label takes the first offset (in the fixed
    order of _LABEL_OFFSETS, so the placement is deterministic) where it keeps LABEL_GAP_PX
    from every earlier label, overlaps no marker and nothing in ``taken`` and stays inside
    the axes; a label set further out is joined to its point by a thin line that crosses
    no other marker (a marker at the point itself, another row with the same figures, does
    not count: every line from the point starts inside it). Where no offset is clear, the
    one that overlaps least."""
    inside = ax.get_window_extent(renderer)
    markers = [(x, y, marker_box(ax, x, y)) for x, y, _, _ in labels]
    marker_boxes = [box for _, _, box in markers]
    taken.extend(marker_boxes)
    numbers: list = []
    for x, y, text, colour in labels:
        px, py = ax.transData.transform((x, y))
        others = [box for _, _, box in markers if not box.contains(px, py)]
        best = None  # (overlap, offset) of the least-overlapping spot inside the axes
        for dx, dy in _LABEL_OFFSETS:
            far = abs(dx) > 14 or abs(dy) > 17
            note = _annotate(ax, text, x, y, (dx, dy), colour, far)
            box = _text_box(note, renderer)
            note.remove()
            if not (inside.contains(box.x0, box.y0) and inside.contains(box.x1, box.y1)):
                continue
            if far and any(_segment_hits(px, py, (box.x0 + box.x1) / 2, (box.y0 + box.y1) / 2, other)
                           for other in others):
                continue
            clash = _overlap_area(box, taken) + _overlap_area(box, numbers, LABEL_GAP_PX)
            if best is None or clash < best[0]:
                best = (clash, (dx, dy), far)
            if clash == 0:
                break
        offset, far = (best[1], best[2]) if best is not None else (_LABEL_OFFSETS[-1], True)
        note = _annotate(ax, text, x, y, offset, colour, far)
        box = _text_box(note, renderer)
        taken.append(box)
        numbers.append(box)


def _annotate(ax, text: str, x: float, y: float, offset: tuple[int, int], colour: str, far: bool):
    """A point's number at ``offset`` points from it, joined by a thin line when ``far``."""
    return ax.annotate(text, (x, y), textcoords="offset points", xytext=offset, fontsize=7, color=colour, zorder=5,
                       arrowprops=dict(arrowstyle="-", color=colour, linewidth=0.7, alpha=0.9, shrinkA=0, shrinkB=3)
                       if far else None)


# Table 1's figure: inches per model panel and dots per inch, so that two panels stay under
# 1,500 pixels wide (`dvc plots show` draws the image at its own size in a 1600 px window).
TABLE1_PANEL_INCHES = (7.3, 5.6)
TABLE1_DPI = 100


def _panel_points(rows: pd.DataFrame, model: str, paper: pd.DataFrame | None,
                  baselines: pd.DataFrame | None) -> list[tuple[int, str, tuple[float, float] | None,
                                                               tuple[float, float] | None, str]]:
    """One model's points of Table 1's figure: (number, label, ours (x, y), the paper's (x, y)
    or None, colour), in the table's row order."""
    from darel.table1 import paper_figures

    # (number, label, ours (x, y), paper (x, y) or None, colour)
    points: list[tuple[int, str, tuple[float, float] | None, tuple[float, float] | None, str]] = []
    for _, row in rows.iterrows():
        key = _budget_key(row["t"], row["m"])
        label = "baseline" if row["method"] == "baseline" else (
            f"B({key[0]:.2f}, {key[1]:.2f})" if key and row["method"] == "darel" else str(row["method"]))
        x, y = float(row["acc_drop_pp"]), float(row["boost"])
        ours = None if math.isnan(x) or math.isnan(y) else (x, y)
        theirs = None
        if paper is not None and row["method"] != "baseline":
            figures = paper_figures(model, str(row["method"]), row["t"], row["m"], paper,
                                    baselines if baselines is not None else paper.iloc[:0])
            if "acc_drop_pp" in figures and "boost" in figures:
                theirs = (figures["acc_drop_pp"], figures["boost"])
        colour = "black" if row["method"] == "baseline" else "tab:blue"
        points.append((len(points) + 1, label, ours, theirs, colour))
    return points


def _draw_panel(panel, model: str, points: list, has_reference: bool) -> tuple[bool, list]:
    """Draw one model's panel of Table 1's figure (the side axis "off scale" when a point is
    far beyond the others): whether it has that side axis, and each axis with the numbers to
    place on it once the layout is final."""
    xs = [p[0] for _, _, a, b, _ in points for p in (a, b) if p is not None]
    ys = [p[1] for _, _, a, b, _ in points for p in (a, b) if p is not None]
    limit = _off_scale(xs)
    side = any(p is not None and p[0] > limit for _, _, a, b, _ in points for p in (a, b))
    if side:
        ax, ax_side = panel.subplots(1, 2, sharey=True, width_ratios=[5, 1])
    else:
        ax, ax_side = panel.subplots(1, 1), None
    labels: dict = {id(ax): [], id(ax_side): []}
    for number, _, ours, theirs, colour in points:
        for where, style in ((ours, "ours"), (theirs, "paper")):
            if where is None:
                continue
            target = ax_side if where[0] > limit else ax
            if style == "ours":
                target.scatter([where[0]], [where[1]], color=colour, s=30, zorder=3)
            else:
                target.scatter([where[0]], [where[1]], facecolors="none", edgecolors="tab:red", s=30, zorder=2)
            labels[id(target)].append((where[0], where[1], str(number),
                                       colour if style == "ours" else "tab:red"))
        if ours is not None and theirs is not None and (ours[0] > limit) == (theirs[0] > limit):
            (ax_side if ours[0] > limit else ax).plot([ours[0], theirs[0]], [ours[1], theirs[1]], color="grey",
                                                      linewidth=0.6, alpha=0.6, zorder=1)
    main_x = [x for x in xs if x <= limit]
    span_x = max(max(main_x) - min(main_x), 1.0)
    span_y = max(max(ys) - min(ys), 0.2)
    ax.set_xlim(min(main_x) - 0.08 * span_x, max(main_x) + 0.12 * span_x)
    ax.set_ylim(min(ys) - 0.1 * span_y, max(ys) + 0.14 * span_y)
    ax.scatter([], [], color="black", s=30, label="baseline (boost 1, drop 0)")
    ax.scatter([], [], color="tab:blue", s=30, label="ours")
    if has_reference:
        ax.scatter([], [], facecolors="none", edgecolors="tab:red", s=30, label="paper, same budget or method")
        ax.plot([], [], color="grey", linewidth=0.6, label="joins ours and the paper's")
    for target in (ax, ax_side):
        if target is None:
            continue
        target.axhline(1.0, color="grey", linewidth=0.6, linestyle=":")
        target.grid(alpha=0.3)
    ax.set_title(model)
    ax.set_xlabel("accuracy drop vs baseline (p.p.)")
    ax.set_ylabel("boost vs baseline (x)")
    # Beside the panel, under the key, on the panel's last axis (so the layout makes room
    # there): inside the axes a legend covers points.
    (ax_side or ax).legend(*ax.get_legend_handles_labels(), fontsize=7, loc="lower left",
                           bbox_to_anchor=(1.04, 0.0), borderaxespad=0.0)
    key_lines = [f"{number:>2}  {label}" for number, label, *_ in points]
    if ax_side is not None:
        far = [x for x in xs if x > limit]
        pad = max(0.1 * (max(far) - min(far)), 2.0)
        ax_side.set_xlim(min(far) - pad, max(far) + pad)
        ax_side.set_title("off scale", fontsize=8)
        ax_side.tick_params(labelleft=False, labelsize=7)
        ax_side.set_xlabel("drop (p.p.)", fontsize=8)
    (ax_side or ax).text(1.04, 1.0, "\n".join(key_lines), transform=(ax_side or ax).transAxes, fontsize=7,
                         va="top", ha="left", family="monospace")
    placements = [(ax, labels[id(ax)])]
    if ax_side is not None:
        placements.append((ax_side, labels[id(ax_side)]))
    return side, placements


def plot_table1(table: pd.DataFrame, path: str | os.PathLike, paper: pd.DataFrame | None = None,
                title: str | None = None, caption: str | None = None,
                baselines: pd.DataFrame | None = None) -> Figure:
    """Speed-up against accuracy cost: boost (y) vs accuracy drop in p.p. (x), one panel
    per model. Each row has a number (the key beside the panel says which budget); our
    point (filled) and the paper's for the same budget or method (hollow; the figures of
    darel.table1.paper_figures, IDS + ADONIS's from the paper's time and top-1 when
    ``baselines`` is given) carry it and are joined by a thin line. Numbers are placed so
    that none overlaps another or a marker; the legend sits beside the panel, under the key,
    where it covers nothing. A point whose accuracy drop is far beyond the others' (3
    interquartile ranges above the upper quartile and at least 10 p.p. past it) goes to a
    narrow side axis "off scale" with the same y scale, so it does not squeeze the rest.
    ``caption`` (below the panels) says what the data and the marks are. Written atomically
    as PNG; returns the figure (for checks)."""
    for column in ("model", "method", "t", "m", "boost", "acc_drop_pp"):
        if column not in table:
            raise ValueError(f"table lacks column {column!r} needed for the plot")
    models = list(dict.fromkeys(table["model"]))
    if not models:
        raise ValueError("table has no rows to plot")
    fig = Figure(figsize=(TABLE1_PANEL_INCHES[0] * len(models), TABLE1_PANEL_INCHES[1]), layout="constrained")
    canvas = FigureCanvasAgg(fig)
    panels = fig.subfigures(1, len(models), squeeze=False)[0]
    placements = []
    any_side = False
    for panel, model in zip(panels, models):
        points = _panel_points(table[table["model"] == model], str(model), paper, baselines)
        has_reference = paper is not None and bool(len(paper[paper["model"] == model]))
        side, panel_placements = _draw_panel(panel, str(model), points, has_reference)
        any_side = any_side or side
        placements += panel_placements
    if title:
        fig.suptitle(textwrap.fill(title, width=int(13 * TABLE1_PANEL_INCHES[0] * len(models))), fontsize=10)
    if caption and any_side:
        caption += (" Narrow axis \"off scale\": a point whose accuracy drop is far beyond the others', on the same "
                    "boost scale.")
    if caption:
        fig.supxlabel(textwrap.fill(caption, width=int(16 * TABLE1_PANEL_INCHES[0] * len(models))), fontsize=8,
                      ha="center")
    # Numbers are placed once the layout is final, then the layout is frozen so that
    # saving does not move the axes under them.
    canvas.draw()
    renderer = canvas.get_renderer()
    for ax, labels in placements:
        _place_labels(ax, labels, renderer, [])
    fig.set_layout_engine("none")
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=TABLE1_DPI)  # explicit: the temp name ends in .tmp
    return fig


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
    fig = Figure(figsize=(5.2 * len(panels) + 1.6, 4.6 * len(times)), layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.subplots(len(times), len(panels), squeeze=False)
    for (time_column, xlabel), axes in zip(times, grid):
        x_mean, x_std = f"{time_column}_mean", f"{time_column}_std"
        for ax, panel in zip(axes, panels):
            rows = budgets[budgets["panel"] == panel]
            # One budget in a panel goes in its title; several are labelled point by point.
            panel_budgets = rows["budget"].dropna().unique()
            base = summary[(summary["method"] == "baseline") & summary["model"].isin(set(rows["model"]))]
            for method in methods:
                mine = rows[rows["method"] == method]
                if not len(mine):
                    continue
                ax.errorbar(mine[x_mean], mine[y_mean], xerr=mine[x_std].fillna(0).to_numpy(),
                            yerr=mine[y_std].fillna(0).to_numpy(), fmt="o", ms=5, capsize=3, color=colours[method],
                            label=method, zorder=3)
                for row in (mine.itertuples() if len(panel_budgets) > 1 else ()):
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
            ax.set_title(f"{panel}: {panel_budgets[0]}" if len(panel_budgets) == 1 else str(panel))
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
        # One legend per row, beside its last panel: inside a panel it hid points.
        entries: dict = {}
        for ax in axes:
            for handle, label in zip(*ax.get_legend_handles_labels()):
                entries.setdefault(label, handle)
        axes[-1].legend(list(entries.values()), list(entries), fontsize=7, loc="upper left",
                        bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    fig.suptitle(textwrap.fill(title, width=int(60 * len(panels))), fontsize=9)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)


def composition_groups(columns) -> list[tuple[str, list[str]]]:
    """The per-sample groups a study's rows carry, as (row of panels, groups): the
    category groups (clean, label-noise, near-duplicate, hard) and the rare-class share
    (common-class is its complement, so it is left out). Only groups whose
    ``trained_share_<group>`` and ``data_share_<group>`` columns are both there; empty
    when the data set has no per-sample groups."""
    from darel.composition import GROUPS

    found = []
    for column, names in (("category", GROUPS["category"]), ("rare", ("rare-class",))):
        present = [name for name in names if f"trained_share_{name}" in columns and f"data_share_{name}" in columns]
        if present:
            found.append((column, present))
    return found


def plot_composition(rows: pd.DataFrame, path: str | os.PathLike, *, title: str) -> pd.DataFrame:
    """What each method trained on: per (model, budget cell) one panel, per method one group
    of bars, the mean over seeds of each group's share of the trained sample-steps
    (``trained_share_<group>``; error bar: one standard deviation over seeds), and over each
    bar a black tick at the group's share of the data itself (``data_share_<group>``, the
    mean over the panel's rows: the same data for every method). Top row: the category
    groups; bottom row: the rare-class share on its own scale (one scale per row, shared
    by its panels). Written atomically as PNG.

    Returns the values drawn, one row per (model, cell, method, group): budget,
    trained_share (mean), trained_share_std, n (seeds with a value) and data_share.
    Raises ValueError when the rows carry no per-sample groups (no ``trained_share_``
    columns): whether to draw something else then is the caller's choice."""
    groups = composition_groups(rows.columns)
    if not groups:
        raise ValueError("the rows carry no trained_share_<group> / data_share_<group> columns: "
                         "this data set has no per-sample groups to plot")
    for column in ("model", "cell", "method", "budget"):
        if column not in rows:
            raise ValueError(f"rows lack column {column!r} needed for the plot")
    names = [name for _, present in groups for name in present]
    panels = list(dict.fromkeys(zip(rows["model"], rows["cell"])))
    drawn = []
    for model, cell in panels:
        mine = rows[(rows["model"] == model) & (rows["cell"] == cell)]
        data_share = {name: float(pd.to_numeric(mine[f"data_share_{name}"], errors="coerce").mean())
                      for name in names}
        for method, group in mine.groupby("method", sort=False):
            for name in names:
                values = pd.to_numeric(group[f"trained_share_{name}"], errors="coerce").dropna()
                drawn.append({"model": model, "cell": cell, "budget": group["budget"].iloc[0], "method": method,
                              "group": name, "trained_share": float(values.mean()) if len(values) else math.nan,
                              "trained_share_std": float(values.std(ddof=1)) if len(values) > 1 else math.nan,
                              "n": int(len(values)), "data_share": data_share[name]})
    table = pd.DataFrame(drawn)
    colours = {name: f"C{i}" for i, name in enumerate(names)}
    most_methods = max(table.groupby(["model", "cell"])["method"].nunique())
    fig_width = (0.8 * most_methods + 1.4) * len(panels) + 1.8
    fig = Figure(figsize=(fig_width, 3.8 * len(groups)), layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.subplots(len(groups), len(panels), squeeze=False)
    several_models = len({model for model, _ in panels}) > 1
    for (column, present), axes in zip(groups, grid):
        width = 0.8 / len(present)
        # One scale per row of panels, so that the budgets compare by eye.
        shown = table[table["group"].isin(present)]
        top = pd.concat([shown["trained_share"] + shown["trained_share_std"].fillna(0), shown["data_share"]]).max()
        for ax, (model, cell) in zip(axes, panels):
            mine = table[(table["model"] == model) & (table["cell"] == cell)]
            methods = list(dict.fromkeys(mine["method"]))
            for k, name in enumerate(present):
                bars = mine[mine["group"] == name].set_index("method").loc[methods]
                x = [i - 0.4 + width * (k + 0.5) for i in range(len(methods))]
                ax.bar(x, bars["trained_share"], width=width * 0.92, color=colours[name], label=name, zorder=2,
                       yerr=bars["trained_share_std"].fillna(0).to_numpy(), capsize=2,
                       error_kw={"elinewidth": 0.8, "ecolor": "0.3"})
                ax.hlines(bars["data_share"], [p - width / 2 for p in x], [p + width / 2 for p in x],
                          colors="black", linewidth=2, zorder=3, label="the data's own share")
            ax.set_xticks(range(len(methods)))
            ax.set_xticklabels(methods, rotation=30, ha="right", fontsize=8)
            budget = str(mine["budget"].iloc[0])
            ax.set_title(f"{model}: {budget}" if several_models else budget, fontsize=9)
            ax.set_ylim(0, 1.05 if column == "category" else max(1.25 * (0 if pd.isna(top) else top), 0.01))
            ax.set_ylabel("share of trained sample-steps" if column == "category"
                          else "rare-class share of trained sample-steps", fontsize=8)
            ax.grid(axis="y", alpha=0.3)
        entries: dict = {}
        for ax in axes:
            for handle, label in zip(*ax.get_legend_handles_labels()):
                entries.setdefault(label, handle)
        axes[-1].legend(list(entries.values()), list(entries), fontsize=7, loc="upper left", title_fontsize=7,
                        title="bars: mean over seeds,\nerror bar: 1 sd", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    fig.suptitle(textwrap.fill(title, width=max(60, int(12 * fig_width))), fontsize=9)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    return table


def plot_note(path: str | os.PathLike, *, title: str, note: str) -> None:
    """A figure that says why there is nothing to draw (``note``), under ``title``; for an
    output the workflow declares on every data set. Written atomically as PNG."""
    fig = Figure(figsize=(7.0, 2.4), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    ax.axis("off")
    ax.text(0.5, 0.5, textwrap.fill(note, width=70), ha="center", va="center", fontsize=11, transform=ax.transAxes)
    fig.suptitle(textwrap.fill(title, width=90), fontsize=9)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
