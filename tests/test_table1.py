from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from darel import table1
from darel.provenance import write_record

ROOT = Path(__file__).resolve().parents[1]


def _cell(model: str, cell: str, t, m, *, time_s, top1, peak, co2e, batch=128, alpha=None, A=None, eta=None,
          epochs=12, profile="quick") -> dict:
    return {"model": model, "method": "baseline" if cell == "baseline" else "darel", "cell": cell, "t": t, "m": m,
            "batch": batch, "alpha": alpha, "A": A, "eta": eta, "epochs": epochs, "epochs_planned": epochs,
            "enforce": "none" if cell == "baseline" else "plan",
            "budget_adherence": None if t is None else time_s / (100.0 * t), "energy_covers": "whole run",
            "time_s": time_s, "top1": top1,
            "peak_mem_bytes": peak, "co2e_kg": co2e, "energy_kwh": None if co2e is None else co2e * 2.5,
            "profile": profile, "seed": 0, "dataset_label": "digits 16x16 (scikit-learn), not CIFAR-100",
            "n_train": 1000, "samples_trained": 1000 * epochs, "T_new_s": 100.0, "T_full_s": 100.0,
            "extra_key_ignored": "x"}


def _cells() -> list[dict]:
    return [
        _cell("resnet18", "t0.80_m0.70", 0.8, 0.7, time_s=80.0, top1=88.0, peak=500, co2e=0.004, batch=64,
              alpha=0.8, A=0.43, eta=3, epochs=9),
        _cell("resnet18", "baseline", None, None, time_s=100.0, top1=90.5, peak=1000, co2e=0.01),
        _cell("resnet18", "t0.80_m0.80", 0.8, 0.8, time_s=50.0, top1=89.0, peak=800, co2e=None, batch=64,
              alpha=0.8, A=0.5, eta=2, epochs=10),
        _cell("resnet18", "t1.00_m1.00", 1.0, 1.0, time_s=90.0, top1=90.0, peak=1000, co2e=0.008, alpha=0.8,
              A=0.28, eta=3, epochs=12),
    ]


def test_ratios_recomputed_by_hand_and_row_order():
    df = table1.build_table1(_cells())
    assert list(df["cell"]) == ["baseline", "t1.00_m1.00", "t0.80_m0.80", "t0.80_m0.70"]
    row = df.set_index("cell").loc["t0.80_m0.70"]
    assert row["boost"] == pytest.approx(100.0 / 80.0)
    assert row["acc_drop_pp"] == pytest.approx(90.5 - 88.0)
    assert row["mem_cut"] == pytest.approx(1000 / 500)
    assert row["co2e_cut"] == pytest.approx(0.01 / 0.004)
    row = df.set_index("cell").loc["t0.80_m0.80"]
    assert row["boost"] == pytest.approx(2.0) and row["mem_cut"] == pytest.approx(1.25)
    assert math.isnan(row["co2e_cut"])  # its CO2e is missing
    base = df.set_index("cell").loc["baseline"]
    assert (base["boost"], base["acc_drop_pp"], base["mem_cut"], base["co2e_cut"]) == (1.0, 0.0, 1.0, 1.0)


def test_columns_start_with_the_paper_columns():
    df = table1.build_table1(_cells())
    assert table1.TABLE1_LEADING == ["model", "method", "batch", "alpha", "A", "eta", "epochs", "boost",
                                    "acc_drop_pp", "mem_cut", "co2e_cut"]
    assert list(df.columns) == table1.TABLE1_LEADING + [
        "t", "m", "budget_adherence", "epochs_planned", "enforce", "time_s", "wall_time_s", "cores_beside", "top1",
        "peak_mem_bytes", "co2e_kg", "energy_kwh", "energy_covers", "profile", "seed", "dataset_label", "cell", "n_seeds", "seeds"] + [
        f"{c}_std" for c in table1.SEED_SPREAD_COLUMNS]
    assert df.set_index("cell").loc["t0.80_m0.70", "budget_adherence"] == pytest.approx(80.0 / 80.0)
    assert (df["n_seeds"] == 1).all() and df["boost_std"].isna().all()


def test_several_seeds_give_mean_std_n_against_the_seed_matched_baseline():
    cells = []
    # Seed 0: baseline 100 s / 90 %, DAREL 50 s / 88 %; seed 1: baseline 120 s / 92 %, DAREL 40 s / 89 %.
    for seed, (bt, ba, dt, da) in enumerate([(100.0, 90.0, 50.0, 88.0), (120.0, 92.0, 40.0, 89.0)]):
        base = _cell("resnet18", "baseline", None, None, time_s=bt, top1=ba, peak=1000, co2e=0.01)
        cell = _cell("resnet18", "t0.50_m0.80", 0.5, 0.8, time_s=dt, top1=da, peak=500, co2e=0.005, batch=64,
                     alpha=0.8, A=0.3, eta=3, epochs=6 + seed)
        cells += [dict(base, seed=seed), dict(cell, seed=seed)]
    df = table1.build_table1(cells).set_index("cell")
    row = df.loc["t0.50_m0.80"]
    assert row["n_seeds"] == 2 and row["seeds"] == "0 1"
    # boost per seed 2.0 and 3.0; acc drop per seed 2.0 and 3.0 p.p.
    assert row["boost"] == pytest.approx(2.5) and row["boost_std"] == pytest.approx(0.5 ** 0.5)
    assert row["acc_drop_pp"] == pytest.approx(2.5) and row["acc_drop_pp_std"] == pytest.approx(0.5 ** 0.5)
    assert row["top1"] == pytest.approx(88.5) and row["epochs"] == pytest.approx(6.5)
    assert df.loc["baseline", "boost"] == 1.0 and df.loc["baseline", "time_s"] == pytest.approx(110.0)
    csv = table1.round_for_csv(df.reset_index())
    assert csv.set_index("cell").loc["t0.50_m0.80", "epochs"] == 6.5  # not forced to an integer
    with pytest.raises(ValueError, match="seed 1"):
        table1.build_table1([c for c in cells if not (c["seed"] == 1 and c["cell"] == "baseline")])


def test_model_without_baseline_is_an_error():
    cells = _cells() + [_cell("resnet18_hc", "t0.80_m0.80", 0.8, 0.8, time_s=1, top1=1, peak=1, co2e=1)]
    with pytest.raises(ValueError, match="resnet18_hc.*no baseline"):
        table1.build_table1(cells)
    with pytest.raises(ValueError, match="lacks keys"):
        table1.build_table1([{"model": "resnet18", "cell": "baseline"}])


def test_paper_reference_data():
    paper, baselines = table1.load_paper_table1()
    assert len(paper) == 13
    assert list(paper.columns) == ["model", "method", "t", "m", "batch", "alpha", "A", "eta", "epochs", "boost",
                                   "acc_drop_pp", "mem_cut", "co2e_cut"]
    assert (paper["model"] == "resnet18").sum() == 10 and (paper["model"] == "resnet18_hc").sum() == 3
    row = paper[(paper["model"] == "resnet18") & (paper["t"] == 0.5) & (paper["m"] == 0.55)].iloc[0]
    assert (row["batch"], row["alpha"], row["A"], row["eta"], row["epochs"]) == (32, 0.6, 0.1, 3, 49)
    assert (row["boost"], row["acc_drop_pp"], row["mem_cut"], row["co2e_cut"]) == (2.03, 32.18, 2.03, 7.83)
    row = paper[(paper["model"] == "resnet18_hc") & (paper["t"] == 0.7)].iloc[0]
    assert (row["m"], row["batch"], row["eta"], row["epochs"], row["boost"], row["co2e_cut"]) == \
        (0.8, 64, 2, 195, 1.60, 1.72)
    base = baselines.set_index(["model", "method"])
    assert base.loc[("resnet18", "baseline"), "time_s"] == 2458
    assert base.loc[("resnet18_hc", "baseline"), "top1"] == 77.47
    assert base.loc[("resnet18", "ids+adonis"), "top1"] == 73.06


def test_compare_with_paper_puts_both_numbers_side_by_side():
    paper, baselines = table1.load_paper_table1()
    text = table1.compare_with_paper(table1.build_table1(_cells()), paper, baselines)
    assert "WARNING" in text and "quick" in text and "digits" in text
    line = next(ln for ln in text.splitlines() if ln.startswith("| B(t=0.80, m=0.70)"))
    # batch paper | batch ours, ..., boost paper | boost ours
    assert "| 64 | 64 |" in line and "| 1.26 | 1.25 |" in line and "| 4.97 | 2.50 |" in line
    assert "| resnet18 | baseline | 2458.0 | 100.0 | 75.86 | 90.50 |" in text
    assert "## resnet18_hc" in text  # paper-only rows are still listed, ours as "—"
    paper_profile = table1.compare_with_paper(
        table1.build_table1([dict(c, profile="paper") for c in _cells()]), paper, baselines)
    assert "WARNING" not in paper_profile


def test_every_row_says_why_it_differs_from_the_paper():
    """One line per row from the cell records and the paper's row: which of batch (as a share
    of its baseline's), alpha, A (recomputed as t / (alpha T_new / T), the clip named, the
    paper's implied T_new), eta (Eq. 5) and epochs differ, and the accuracy-drop ratio."""
    cells = _cells()
    extra = {"t1.00_m1.00": (100.0, 100.0), "t0.80_m0.80": (160.0, 100.0), "t0.80_m0.70": (300.0, 100.0)}
    for cell in cells:
        cell["n_train"], cell["epochs_protocol"] = 1000, 12
        if cell["cell"] in extra:
            cell["T_new_s"], cell["T_full_s"] = extra[cell["cell"]]
        if cell["cell"] == "t1.00_m1.00":  # what the calibration gives at B(1, 1)
            cell["A"], cell["eta"] = 0.8, 1
    paper, baselines = table1.load_paper_table1()
    built = table1.build_table1(cells)
    lines = table1.gap_reasons(built, cells, paper, baselines)
    assert lines[("resnet18", "baseline")].startswith("the reference of every ratio")
    # B(1, 1): alpha 0.8 and T_new = T give A = 1.25, held at A_max; the paper's 0.28 implies T_new = 4.46 T.
    full = lines[("resnet18", "t1.00_m1.00")]
    assert "A 0.80 vs 0.28: ours is t / (alpha T_new/T) = 1.25 (held at A_max)" in full
    assert "implies T_new = 4.46 T" in full and "eta 1 vs 3" in full and "same batch" in full
    assert "accuracy drop 0.50 vs the paper's 3.01 p.p. (0.2x)" in full
    # B(0.8, 0.7): batch 64 of 128 is the paper's 64 of 128 (same share); A 0.43 = paper's; epochs 9 of 12 vs 121/200.
    line = lines[("resnet18", "t0.80_m0.70")]
    assert "same batch (64 of 128; the paper 64 of 128)" in line and "alpha 0.80" in line
    assert "eta 3 vs 2: Eq. 5 of the unclipped A" in line and "epochs 9 of 12 (75%) vs 121 of 200 (60%)" in line
    assert "accuracy drop 2.50 vs the paper's 4.97 p.p. (0.5x)" in line
    text = table1.compare_with_paper(built, paper, baselines, lines)
    assert "Why each row differs from the paper's" in text
    assert "- B(t=0.80, m=0.70): " + line in text
    assert table1.eta_of(0.5) == 3 and table1.eta_of(0.79) == 2 and table1.eta_of(0.8) == 1


def test_the_comparison_flags_rows_over_their_time_budget_and_gives_ids_adonis_the_papers_figures():
    paper, baselines = table1.load_paper_table1()
    cells = _cells()
    over = next(c for c in cells if c["cell"] == "t0.80_m0.80")
    over["budget_adherence"] = 1.227
    cells.append(dict(_cell("resnet18", "ids_adonis", None, None, time_s=40.0, top1=60.0, peak=900, co2e=0.002,
                            alpha=0.8, A=0.3, eta=1), method="ids+adonis"))
    text = table1.compare_with_paper(table1.build_table1(cells), paper, baselines)
    assert "**1.227 over**" in text and "over the time budget" in text and "B(t=0.80, m=0.80) 1.227" in text
    ids = next(ln for ln in text.splitlines() if ln.startswith("| ids+adonis"))
    assert "ours only" not in ids and "| 1.49 | 2.50 |" in ids and "| 2.80 | 30.50 |" in ids


def test_round_for_csv_keeps_small_quantities():
    df = table1.round_for_csv(table1.build_table1(_cells()))
    assert df.loc[0, "co2e_kg"] == 0.01 and df.loc[3, "co2e_kg"] == 0.004
    assert str(df["batch"].dtype) == "Int64"


def _with_sources(folder, cell: dict) -> dict:
    """``cell`` with the source records the cell-record stage names (train, eval, ...), each
    written in ``folder`` holding the figures the cell copied from it (records.IMAGE_FIGURES)."""
    from darel import io, records

    folder.mkdir(parents=True, exist_ok=True)
    sources: dict[str, dict] = {}
    for field, (source, key) in records.IMAGE_FIGURES.items():
        if field in cell:
            sources.setdefault(source, {})[key] = cell[field]
    places = {}
    for name, record in sources.items():
        write_record(folder / f"{name}.json", record)
        places[name] = (folder / f"{name}.json").relative_to(folder.parents[1]).as_posix()
    return {**cell, "sources": places,
            "sources_sha256": {name: io.file_sha256(folder / f"{name}.json") for name in sources}}


def test_cli_writes_csv_markdown_and_plot(tmp_path):
    paths = []
    for cell in _cells():
        path = tmp_path / "cells" / f"{cell['cell']}.json"
        path.parent.mkdir(exist_ok=True)
        # sealed, as the cell-record stage writes it, beside the records it names as its sources
        write_record(path, _with_sources(tmp_path / "runs" / cell["cell"], cell))
        paths.append(str(path))
    out, compare, plot, log = (tmp_path / "results" / name for name in
                               ("table1.csv", "table1_vs_paper.md", "table1.png", "table1.log"))
    done = subprocess.run([sys.executable, str(ROOT / "stages" / "table1.py"), "--cells", *paths, "--out", str(out),
                           "--compare", str(compare), "--plot", str(plot), "--log", str(log)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    written = pd.read_csv(out)
    assert len(written) == 4 and list(written.columns[:11]) == table1.TABLE1_LEADING
    assert written.loc[written["cell"] == "t0.80_m0.70", "boost"].item() == 1.25
    assert "B(t=0.80, m=0.70)" in compare.read_text()
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Table 1: 4 rows" in log.read_text()

    # A cell whose figures are not those of its sources (edited, resealed by a key holder) stops the table.
    forged = dict(_cells()[1], time_s=_cells()[1]["time_s"] / 10)
    cell_path = tmp_path / "cells" / f"{forged['cell']}.json"
    sources = _with_sources(tmp_path / "runs" / forged["cell"], _cells()[1])
    write_record(cell_path, {**forged, "sources": sources["sources"], "sources_sha256": sources["sources_sha256"]})
    done = subprocess.run([sys.executable, str(ROOT / "stages" / "table1.py"), "--cells", *paths, "--out", str(out),
                           "--log", str(log)], cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert done.returncode != 0 and "does not hold the figures of the records it was made from (time_s" in done.stderr


# Table 1 of the quick profile as `make quick` built it (2026-11-26): (boost, accuracy drop)
# per row in the table's order, IDS + ADONIS after ResNet18's budgets.
QUICK_TABLE1 = {"resnet18": [(1.0, 0.0), (1.31, 6.94), (1.294, 11.39), (1.161, 16.94), (1.367, 30.0), (1.5, 21.11),
                             (1.384, 14.17), (1.391, 33.06), (2.039, 18.61), (2.243, 17.22), (2.083, 25.28),
                             (2.853, 29.72)],
                "resnet18_hc": [(1.0, 0.0), (1.203, 6.39), (1.281, 1.94), (1.277, 4.44)]}


def _quick_like_table(ids_drop: float | None = None) -> pd.DataFrame:
    """Table 1 as the quick profile builds it: the figures of QUICK_TABLE1 (IDS + ADONIS's
    drop replaced by ``ids_drop`` when given)."""
    paper, _ = table1.load_paper_table1()
    rows = []
    for model in ("resnet18", "resnet18_hc"):
        figures = iter(QUICK_TABLE1[model])
        boost, drop = next(figures)
        rows.append(dict(model=model, method="baseline", t=math.nan, m=math.nan, boost=boost, acc_drop_pp=drop,
                         profile="quick", dataset_label="QUICK PROFILE: digits", cell="baseline"))
        for ref in paper[paper["model"] == model].itertuples():
            boost, drop = next(figures)
            rows.append(dict(model=model, method="darel", t=ref.t, m=ref.m, boost=boost, acc_drop_pp=drop,
                             profile="quick", dataset_label="QUICK PROFILE: digits", cell=f"t{ref.t:.2f}_m{ref.m:.2f}"))
        if model == "resnet18":
            boost, drop = next(figures)
            rows.append(dict(model=model, method="ids+adonis", t=math.nan, m=math.nan, boost=boost,
                             acc_drop_pp=drop if ids_drop is None else ids_drop, profile="quick",
                             dataset_label="QUICK PROFILE: digits", cell="ids_adonis"))
    return pd.DataFrame(rows)


def _plot_boxes(fig):
    """Every number's box, every marker's centre and every leader line of a Table 1 figure."""
    from matplotlib.text import Annotation, Text

    renderer = fig.canvas.get_renderer()
    boxes, markers, leaders = [], [], []
    for ax in fig.axes:
        for collection in ax.collections:
            for x, y in ax.transData.transform(collection.get_offsets()):
                markers.append((x, y))
        for note in [t for t in ax.texts if isinstance(t, Annotation)]:
            note.update_positions(renderer)
            box = Text.get_window_extent(note, renderer)
            assert ax.get_window_extent(renderer).contains(box.x0, box.y0), note.get_text()
            boxes.append((note.get_text(), box))
            if note.arrow_patch is not None:
                leaders.append((note.get_text(), ax.transData.transform(note.xy), box))
    return boxes, markers, leaders


def test_table1_plot_covers_no_marker_and_the_outlier_has_its_own_axis(tmp_path):
    """On the quick profile's Table 1 as built: no number overlaps another number or any
    marker, no leader line crosses another marker, the legend sits outside the panels, IDS +
    ADONIS has the paper's point too, and the image fits a 1600 px window (dvc plots show
    draws it at its own size). With IDS + ADONIS's drop far beyond the rest, it goes to a
    side axis "off scale" and the main axis keeps the others' scale."""
    import matplotlib.image as mpimg
    from matplotlib.text import Annotation

    from darel.plots import plot_table1

    paper, baselines = table1.load_paper_table1()
    fig = plot_table1(_quick_like_table(), tmp_path / "table1.png", paper=paper, baselines=baselines,
                      title="Table 1, quick profile", caption="quick profile, data: QUICK PROFILE: digits. Filled blue dot: ours")
    assert mpimg.imread(tmp_path / "table1.png").shape[1] <= 1500
    renderer = fig.canvas.get_renderer()
    half = 3 * fig.dpi / 72  # a marker of size 30 points squared: radius about 2.7 points
    boxes, markers, leaders = _plot_boxes(fig)
    # Every point numbered: 12 + 4 of ours, 13 of the paper's and its IDS + ADONIS.
    assert len(boxes) == 30 and len(markers) == 30
    for i, (name, box) in enumerate(boxes):
        for other, second in boxes[i + 1:]:
            assert not box.overlaps(second), (name, other)
        for x, y in markers:
            assert not (box.x0 < x + half and x - half < box.x1 and box.y0 < y + half and y - half < box.y1), (name, x, y)
    for name, (x0, y0), box in leaders:
        x1, y1 = (box.x0 + box.x1) / 2, (box.y0 + box.y1) / 2
        for x, y in markers:
            if abs(x - x0) > 1 or abs(y - y0) > 1:  # not its own point
                assert not any(abs(x0 + (x1 - x0) * k / 50 - x) < half and abs(y0 + (y1 - y0) * k / 50 - y) < half
                               for k in range(51)), (name, x, y)
    for ax in fig.axes:
        legend = ax.get_legend()
        if legend is not None:
            frame = legend.get_window_extent(renderer)
            assert not any(frame.overlaps(other.get_window_extent(renderer)) for other in fig.axes), "legend on a panel"
    main = [ax for ax in fig.axes if ax.get_title() == "resnet18"][0]
    hollow = [tuple(xy) for c in main.collections for xy in c.get_offsets() if len(c.get_facecolors()) == 0]
    assert (pytest.approx(2.80), pytest.approx(2458 / 1650)) in hollow  # the paper's IDS + ADONIS
    assert "quick profile" in fig.get_supxlabel() and "Filled blue dot" in fig.get_supxlabel()

    # IDS + ADONIS at 95 p.p. (a collapse to chance) sits alone on the side axis; the main axis ends well before it.
    fig = plot_table1(_quick_like_table(ids_drop=95.0), tmp_path / "far.png", paper=paper, baselines=baselines)
    side = [ax for ax in fig.axes if ax.get_title() == "off scale"]
    assert len(side) == 1 and [t.get_text() for t in side[0].texts if isinstance(t, Annotation)] == ["12"]
    assert [ax for ax in fig.axes if ax.get_title() == "resnet18"][0].get_xlim()[1] < 40
    boxes, markers, _ = _plot_boxes(fig)
    for i, (name, box) in enumerate(boxes):
        assert not any(box.overlaps(second) for _, second in boxes[i + 1:]), name


def test_each_rows_mlflow_figures_are_rounded_with_the_papers_beside():
    paper, baselines = table1.load_paper_table1()
    rows = table1.per_seed_rows(_cells())
    built = table1.build_table1(_cells())
    figures = table1.mlflow_row_figures(rows, paper, baselines, table1.table1_row_numbers(built))
    budget = figures[("resnet18", 0, "t0.80_m0.70")]
    assert budget["boost"] == 1.25 and budget["boost paper"] == 1.26 and budget["drop paper"] == 4.97
    assert budget["calibrated"] == "64/0.80/0.43/3/9" and budget["row"] == 4.0  # the table's fourth row
    assert all(len(f"{v}".split(".")[-1]) <= 3 for v in budget.values() if not isinstance(v, str))
    assert figures[("resnet18", 0, "baseline")]["boost paper"] == 1.0 and figures[("resnet18", 0, "baseline")]["row"] == 1
    ids = table1.paper_figures("resnet18", "ids+adonis", None, None, paper, baselines)
    assert ids == pytest.approx({"boost": 2458 / 1650, "acc_drop_pp": 75.86 - 73.06})


def test_table1_rows_follow_the_papers_order():
    """Baseline first, then the paper's budgets in the paper's order, IDS + ADONIS last."""
    paper, _ = table1.load_paper_table1()
    built = _quick_like_table()
    cells = [dict(row, batch=32, alpha=0.8, A=0.4, eta=3, epochs=10, epochs_planned=10, enforce="plan",
                  budget_adherence=1.0, time_s=100.0 / row["boost"], top1=90.0 - row["acc_drop_pp"], peak_mem_bytes=1000,
                  co2e_kg=0.01, energy_kwh=0.02, energy_covers="whole run", seed=0)
             for row in built.sample(frac=1.0, random_state=3).to_dict("records")]
    order = table1.build_table1(cells)
    for model in ("resnet18", "resnet18_hc"):
        mine = order[order["model"] == model]
        expected = ["baseline"] + [f"t{t:.2f}_m{m:.2f}" for t, m in paper.loc[paper["model"] == model, ["t", "m"]]
                                   .itertuples(index=False)] + (["ids_adonis"] if model == "resnet18" else [])
        assert list(mine["cell"]) == expected


def test_headline_metrics_are_a_handful_of_flat_rounded_figures():
    built = table1.build_table1(_cells())
    metrics = table1.table_metrics(built)
    assert set(metrics) == {"boost_mean", "boost_max", "acc_drop_pp_mean", "adherence_mean", "darel_rows"}
    darel = built[built["method"] == "darel"]
    assert metrics["boost_mean"] == pytest.approx(darel["boost"].mean(), abs=1e-4)
    assert metrics["darel_rows"] == len(darel) == 3  # the means' rows, not the table's 4


def _attention_cells() -> list[dict]:
    """A made-up quick table on generated data: row 2 over budget on a busy machine, row 3 a
    drop 2.2x the paper's, row 4 over budget on an idle machine."""
    cells = [
        _cell("resnet18", "baseline", None, None, time_s=100.0, top1=40.0, peak=1000, co2e=0.01),
        _cell("resnet18", "t1.00_m1.00", 1.0, 1.0, time_s=110.0, top1=39.5, peak=1000, co2e=0.008, alpha=0.8,
              A=0.28, eta=3),
        _cell("resnet18", "t0.80_m0.80", 0.8, 0.8, time_s=80.0, top1=30.0, peak=800, co2e=0.005, batch=64,
              alpha=0.8, A=0.5, eta=2, epochs=10),
        _cell("resnet18", "t0.80_m0.70", 0.8, 0.7, time_s=96.0, top1=37.0, peak=500, co2e=0.004, batch=64,
              alpha=0.8, A=0.43, eta=3, epochs=9),
    ]
    for cell in cells:
        cell.update(dataset_label="GENERATED: synth benchmark, cpu size (not a real data set)",
                    wall_time_s=cell["time_s"] * 1.2, cores_beside=1.4 if cell["cell"] == "t1.00_m1.00" else 0.1,
                    n_params=700_000, epochs_protocol=12)
    return cells


def test_rows_over_budget_and_large_drops_are_explained_one_line_each():
    cells = _attention_cells()
    paper, baselines = table1.load_paper_table1()
    built = table1.build_table1(cells)
    notes = table1.attention(built, paper, baselines, cells)
    assert set(notes) == {("resnet18", "t1.00_m1.00"), ("resnet18", "t0.80_m0.80"), ("resnet18", "t0.80_m0.70")}
    assert notes[("resnet18", "t1.00_m1.00")] == {
        "why": "over budget, busy",
        "over": "adherence 1.100: measured time 110.0 s (CPU time on a CPU) against t T = 100.0 s, wall time 132.0 s; "
                "1.4 other cores busy beside it: a busy machine slows each step of a CPU run (shared caches, memory "
                "bandwidth, clock); on an idle machine rerun `snakemake --cores all results/table1.csv --forcerun "
                "runs/quick/table1/resnet18/s0/t1.00_m1.00/train.json`"}
    assert notes[("resnet18", "t0.80_m0.70")]["why"] == "over budget"
    assert ("machine idle beside it (0.1 cores): the plan's time prediction was short of the measured time"
            in notes[("resnet18", "t0.80_m0.70")]["over"])
    assert notes[("resnet18", "t0.80_m0.80")] == {
        "why": "drop 2.2x",
        "drop": "drop 10.00 vs the paper's 4.57 pp (2.2x): the data is generated and small (1,000 training samples), "
                "the paper's 50,000 CIFAR-100 images; our model trains 10 of 12 epochs with 700,000 parameters (the "
                "paper's row: 121 of 200 epochs), the paper's a full-width ResNet18 (about 11 M parameters); our "
                "baseline's top-1 is 40.00 % vs the paper's 75.86 % (where a network underfits, the studies measured "
                "DAREL below a random subset at equal budget: docs/studies.md)"}


def test_the_comparison_opens_with_a_narrow_summary_and_the_reasons():
    cells = _attention_cells()
    paper, baselines = table1.load_paper_table1()
    built = table1.build_table1(cells)
    notes = table1.attention(built, paper, baselines, cells)
    lines = table1.compare_with_paper(built, paper, baselines, notes=notes).splitlines()
    start = lines.index("## At a glance")
    assert lines[start + 4:start + 10] == [
        "| # | model | t/m | boost ours/paper | drop ours/paper | adherence | why |",
        "|---|---|---|---|---|---|---|",
        "| 1 | resnet18 | baseline | 1.00/1.00 | 0.00/0.00 | — |  |",
        "| 2 | resnet18 | 1.00/1.00 | 0.91/1.46 | 0.50/3.01 | 1.10 | over budget, busy |",
        "| 3 | resnet18 | 0.80/0.80 | 1.25/1.25 | 10.00/4.57 | 1.00 | drop 2.2x |",
        "| 4 | resnet18 | 0.80/0.70 | 1.04/1.26 | 3.00/4.97 | 1.20 | over budget |"]
    assert all(len(line) <= 100 for line in lines[start + 4:start + 10])
    why = lines.index("### Why")
    assert lines[why + 2] == ("- row 2 (resnet18 B(t=1.00, m=1.00)), over budget: "
                              + notes[("resnet18", "t1.00_m1.00")]["over"])
    assert lines[why + 3] == ("- row 3 (resnet18 B(t=0.80, m=0.80)), accuracy drop: "
                              + notes[("resnet18", "t0.80_m0.80")]["drop"])
    assert lines[why + 4].startswith("- row 4 (resnet18 B(t=0.80, m=0.70)), over budget: adherence 1.200")
    assert lines[why + 5] == "" and why < lines.index("## resnet18")  # the wide tables after


def test_rows_within_budget_and_near_the_papers_drop_need_no_reason():
    cells = [c for c in _cells()]  # adherence <= 1 everywhere, drops at most the paper's
    paper, baselines = table1.load_paper_table1()
    built = table1.build_table1(cells)
    assert table1.attention(built, paper, baselines, cells) == {}
    assert "### Why" not in table1.compare_with_paper(built, paper, baselines)


def test_the_rerun_command_names_every_seeds_training_of_the_row():
    row = pd.Series({"profile": "quick", "model": "resnet18_hc", "cell": "t0.70_m0.80", "seeds": "0 1", "seed": 0})
    assert table1.rerun_command(row) == ("snakemake --cores all results/table1.csv --forcerun "
                                         "runs/quick/table1/resnet18_hc/s0/t0.70_m0.80/train.json "
                                         "runs/quick/table1/resnet18_hc/s1/t0.70_m0.80/train.json")


def test_table1_plot_pushes_apart_the_numbers_of_rows_with_the_same_figures(tmp_path):
    """Rows whose points coincide (ours on the paper's, several budgets with the same boost
    and drop): every number keeps LABEL_GAP_PX from every other (numbers that touch read as
    one, "2" and "7" as "27") and stays inside its axes, and the placement is the same on
    every run."""
    from darel.plots import LABEL_GAP_PX, plot_table1

    paper, baselines = table1.load_paper_table1()
    table = _quick_like_table()
    together = {cell: (4.57, 1.25) for cell in ("t1.00_m1.00", "t0.80_m0.80", "t0.80_m0.70", "t0.80_m0.55",
                                                 "t0.70_m0.80", "t0.70_m0.70", "t0.70_m0.55")}
    together.update({cell: (11.43, 1.99) for cell in ("t0.50_m0.80", "t0.50_m0.70", "t0.50_m0.55")})
    for cell, (drop, boost) in together.items():
        row = (table["model"] == "resnet18") & (table["cell"] == cell)
        table.loc[row, ["acc_drop_pp", "boost"]] = [drop, boost]
    placed = []
    for run in range(2):
        fig = plot_table1(table, tmp_path / f"table1_{run}.png", paper=paper, baselines=baselines)
        boxes, _, _ = _plot_boxes(fig)  # asserts each number inside its axes
        assert len(boxes) == 30
        for i, (name, box) in enumerate(boxes):
            for other, second in boxes[i + 1:]:
                apart = max(second.x0 - box.x1, box.x0 - second.x1, second.y0 - box.y1, box.y0 - second.y1)
                assert apart >= LABEL_GAP_PX, (name, other, apart)
        placed.append([(name, round(box.x0, 3), round(box.y0, 3)) for name, box in boxes])
    assert placed[0] == placed[1]


def test_the_narrow_summary_fits_100_columns_with_the_widest_figures():
    """Two-digit row numbers, the longest model name, a row both over budget on a busy
    machine and with a drop over twice the paper's, boosts and drops of two digits."""
    paper, baselines = table1.load_paper_table1()
    rows = []
    for model in ("resnet18", "resnet18_hc"):
        rows.append(dict(model=model, method="baseline", cell="baseline", t=math.nan, m=math.nan, boost=1.0,
                         acc_drop_pp=0.0, budget_adherence=math.nan, top1=40.0))
        for ref in paper[paper["model"] == model].itertuples():
            rows.append(dict(model=model, method="darel", cell=f"t{ref.t:.2f}_m{ref.m:.2f}", t=ref.t, m=ref.m,
                             boost=10.28, acc_drop_pp=ref.acc_drop_pp * 4.5, budget_adherence=1.19, top1=30.0))
        if model == "resnet18":
            rows.append(dict(model=model, method="ids+adonis", cell="ids_adonis", t=math.nan, m=math.nan, boost=2.6,
                             acc_drop_pp=53.91, budget_adherence=math.nan, top1=10.0))
    table = pd.DataFrame(rows).assign(time_s=100.0, wall_time_s=150.0, cores_beside=1.4, profile="quick", seed=0,
                                      seeds="0", epochs=4, dataset_label="GENERATED: synth")
    lines = table1.narrow_summary(table, paper, baselines, table1.attention(table, paper, baselines))
    assert max(len(line) for line in lines) <= 100, max(lines, key=len)
    assert lines[2 + 15] == ("| 16 | resnet18_hc | 0.70/0.80 | 10.28/1.60 | 11.92/2.65 | 1.19 | over budget, busy; "
                             "drop 4.5x |")
    assert lines[2 + 11] == "| 12 | resnet18 | ids+adonis | 2.60/1.49 | 53.91/2.80 | — | drop 19.3x |"
