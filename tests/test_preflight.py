"""darel.preflight on its own: which cells an existing table holds, and which missing files
are a new cell's results (planned) rather than a damage (repaired)."""

from __future__ import annotations

import pandas as pd

from darel import config, preflight
from darel.layout import Layout
from tests.conftest import ROOT


def test_a_tables_cells_are_read_per_profile_and_seed(tmp_path):
    table = tmp_path / "table1.csv"
    pd.DataFrame([{"model": "resnet18", "cell": "baseline", "profile": "quick", "seeds": "0 1"},
                  {"model": "resnet18", "cell": "t0.80_m0.80", "profile": "quick", "seeds": "0"},
                  {"model": "resnet18", "cell": "baseline", "profile": "paper", "seeds": "2"}]).to_csv(table, index=False)
    assert preflight.built_cells(str(table), "quick") == {("resnet18", 0, "baseline"), ("resnet18", 1, "baseline"),
                                                          ("resnet18", 0, "t0.80_m0.80")}
    assert preflight.built_cells(str(table), "smoke") == set()
    table.write_text("not,a,table\n1,2,3\n")
    assert preflight.built_cells(str(table), "quick") is None  # unreadable: every cell counts as built
    assert preflight.built_cells(str(tmp_path / "none.csv"), "quick") is None


def test_a_new_budget_is_planned_not_repaired(tmp_path, monkeypatch):
    """Against a table of the committed quick budgets, one budget more: that cell alone is
    new, and only its own files are a new cell's (the baseline's and the data's are not)."""
    monkeypatch.chdir(tmp_path)
    cfg = config.load_params(ROOT / "params.yaml")
    layout = Layout(cfg["profile"])
    rows = [{"model": m, "cell": c, "profile": cfg["profile"], "seeds": str(s)} for m, s, c in config.table1_cells(cfg)]
    pd.DataFrame(rows).to_csv(tmp_path / "table1.csv", index=False)
    assert preflight.table1_new_cells(cfg, layout, str(tmp_path / "table1.csv")) == ([], set())
    more = config.merge(cfg, {})
    more["profiles"][cfg["profile"]]["table1"]["resnet18"].append([0.6, 0.6])
    cells, files = preflight.table1_new_cells(config.validate(more), layout, str(tmp_path / "table1.csv"))
    assert cells == ["resnet18/s0/t0.60_m0.60"]
    assert files and all("t0.60_m0.60" in f for f in files)
    # The other profile's cells are all new against this profile's table.
    other = config.merge(cfg, {"profile": "paper"})
    cells, _ = preflight.table1_new_cells(config.validate(other), Layout("paper"), str(tmp_path / "table1.csv"))
    assert len(cells) == len(config.table1_cells(other))
