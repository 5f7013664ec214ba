"""The study's composition plot: what each method trained on against the data's shares."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from darel.plots import composition_groups, plot_composition, plot_note

PNG = b"\x89PNG\r\n\x1a\n"
GROUPS = ("clean", "label-noise", "near-duplicate", "hard", "common-class", "rare-class")
DATA = {"clean": 0.7, "label-noise": 0.1, "near-duplicate": 0.1, "hard": 0.1, "common-class": 0.95,
        "rare-class": 0.05}


def _rows() -> pd.DataFrame:
    """Two methods, two budget cells, two seeds; every seed's shares a little different."""
    rows = []
    for cell, budget in (("t0.50_m0.55", "B(t=0.50, m=0.55)"), ("t0.30_m0.55", "B(t=0.30, m=0.55)")):
        for j, method in enumerate(("darel", "random")):
            for seed in (0, 1):
                shift = 0.01 * (seed + 1) * (j + 1) * (2 if cell.startswith("t0.30") else 1)
                trained = {"clean": 0.6 - 3 * shift, "label-noise": 0.2 + shift, "near-duplicate": 0.1 + shift,
                           "hard": 0.1 + shift, "common-class": 0.97 - shift, "rare-class": 0.03 + shift}
                rows.append({"model": "resnet18", "cell": cell, "budget": budget, "method": method, "seed": seed,
                             "top1": 50.0, **{f"trained_share_{g}": trained[g] for g in GROUPS},
                             **{f"data_share_{g}": DATA[g] for g in GROUPS}})
    return pd.DataFrame(rows)


def test_the_plot_draws_the_mean_over_seeds_of_each_share(tmp_path):
    rows = _rows()
    path = tmp_path / "study_table1_composition.png"
    drawn = plot_composition(rows, path, title="GENERATED: synth benchmark, a test")
    assert path.read_bytes()[:8] == PNG
    # Four categories and the rare-class share, for every (cell, method).
    assert set(drawn["group"]) == {"clean", "label-noise", "near-duplicate", "hard", "rare-class"}
    assert len(drawn) == 2 * 2 * 5
    for group in set(drawn["group"]):
        expected = rows.groupby(["cell", "method"])[f"trained_share_{group}"].agg(["mean", "std", "count"])
        mine = drawn[drawn["group"] == group].set_index(["cell", "method"]).loc[expected.index]
        assert list(mine["trained_share"]) == pytest.approx(list(expected["mean"]))
        assert list(mine["trained_share_std"]) == pytest.approx(list(expected["std"]))
        assert list(mine["n"]) == list(expected["count"])
        assert list(mine["data_share"]) == pytest.approx([DATA[group]] * len(mine))
    assert list(dict.fromkeys(drawn["cell"])) == ["t0.50_m0.55", "t0.30_m0.55"]  # the rows' order


def test_a_missing_seed_is_left_out_of_the_mean(tmp_path):
    rows = _rows()
    rows.loc[(rows["method"] == "random") & (rows["seed"] == 1), "trained_share_hard"] = math.nan
    drawn = plot_composition(rows, tmp_path / "c.png", title="GENERATED: test")
    hard = drawn[(drawn["group"] == "hard") & (drawn["method"] == "random")]
    seed0 = rows[(rows["method"] == "random") & (rows["seed"] == 0)].set_index("cell")["trained_share_hard"]
    assert list(hard["n"]) == [1, 1] and list(hard["trained_share"]) == pytest.approx(list(seed0.loc[hard["cell"]]))


def test_rows_without_groups_raise_and_write_nothing(tmp_path):
    rows = _rows()
    bare = rows.drop(columns=[c for c in rows if c.startswith(("trained_share_", "data_share_"))])
    assert composition_groups(bare.columns) == []
    path = tmp_path / "c.png"
    with pytest.raises(ValueError, match="no per-sample groups"):
        plot_composition(bare, path, title="GENERATED: test")
    assert not path.exists()
    # Only the category columns: one row of panels, no rare-class share.
    only = rows.drop(columns=[c for c in rows if c.endswith("-class")])
    assert composition_groups(only.columns) == [("category", ["clean", "label-noise", "near-duplicate", "hard"])]
    assert set(plot_composition(only, path, title="t")["group"]) == {"clean", "label-noise", "near-duplicate", "hard"}


def test_the_note_figure_is_a_png(tmp_path):
    path = tmp_path / "note.png"
    plot_note(path, title="study_table1 (CIFAR-10)", note="no per-sample groups on this data set")
    assert path.read_bytes()[:8] == PNG


def _stage():
    from tests.conftest import load_script

    return load_script("stages/study_table.py", "study_table_stage")


def test_the_stage_writes_a_note_where_the_data_has_no_groups(tmp_path, caplog):
    """The workflow declares the file on every data set: with the groups it holds the plot,
    without them a figure that says there are none."""
    import logging

    stage, log = _stage(), logging.getLogger("test_plots")
    rows = _rows()
    bare = rows.drop(columns=[c for c in rows if c.startswith(("trained_share_", "data_share_"))])
    with caplog.at_level(logging.INFO, logger="test_plots"):
        stage.write_composition(bare, str(tmp_path / "none.png"), title="CIFAR-10", log=log)
        stage.write_composition(rows, str(tmp_path / "some.png"), title="GENERATED: test", log=log)
    assert (tmp_path / "none.png").read_bytes()[:8] == PNG and (tmp_path / "some.png").read_bytes()[:8] == PNG
    assert "no per-sample groups" in caplog.text and "composition plot: 4 (model, cell, method) groups" in caplog.text
