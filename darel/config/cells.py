"""The cells of every table and study: the lists the workflow builds (their ids and
patterns are darel.grammar's)."""

from __future__ import annotations

from darel.config.errors import ConfigError
from darel.grammar import IDS_ADONIS, NLG_BASELINE, NLG_CONTROL_SUFFIX, TABLE1_BASELINE, alpha_cell, budget_of_cell, cell_id


def parse_cell(cell: str) -> tuple[float, float]:
    budget = budget_of_cell(cell)
    if budget is None:
        raise ConfigError(f"cell {cell!r} is not of the form t0.80_m0.70")
    return budget


def seeds(cfg: dict) -> list[int]:
    """The seeds every table cell is trained with under the active profile."""
    return [int(s) for s in cfg["profiles"][cfg["profile"]]["seeds"]]


def table1_budgets(cfg: dict, profile: str | None = None) -> dict[str, list]:
    """Table 1's budgets per model on a profile (default: the active one): its own
    ``profiles.<profile>.table1``, so that one profile's budgets never change another's plan."""
    return cfg["profiles"][profile or cfg["profile"]]["table1"]


def table1_cells(cfg: dict) -> list[tuple[str, int, str]]:
    """(model, seed, cell) of Table 1, per model and seed the baseline first."""
    cells = []
    for model, budgets in table1_budgets(cfg).items():
        for seed in seeds(cfg):
            cells.append((model, seed, TABLE1_BASELINE))
            cells.extend((model, seed, cell_id(t, m)) for t, m in budgets)
            ids_cfg = cfg.get("comparisons", {}).get(IDS_ADONIS)
            if ids_cfg and ids_cfg["model"] == model:
                cells.append((model, seed, IDS_ADONIS))
    return cells


def study_budgets(cfg: dict, model: str) -> list[tuple[float, float]]:
    """The budgets the Table 1 study runs for ``model`` under the active profile."""
    study = cfg.get("study", {}).get("table1")
    if not study or model not in study["models"]:
        return []
    chosen = study["budgets"].get(cfg["profile"], [])
    if chosen == "table1":
        return [(float(t), float(m)) for t, m in table1_budgets(cfg).get(model, [])]
    return [(float(t), float(m)) for t, m in chosen]


def budget_of(cfg: dict, model: str, cell: str) -> tuple[float, float]:
    t, m = parse_cell(cell)
    for bt, bm in list(table1_budgets(cfg).get(model, [])) + study_budgets(cfg, model):
        if cell_id(bt, bm) == cell:
            return float(bt), float(bm)
    raise ConfigError(f"cell {cell!r} of model {model!r} is listed neither under profiles.{cfg['profile']}.table1."
                      f"{model} nor under study.table1.budgets.{cfg['profile']}")


def study_seeds(cfg: dict) -> list[int]:
    return [int(s) for s in cfg["study"]["seeds"]]


def study_trains_darel(cfg: dict) -> bool:
    """Whether the study trains its DAREL runs itself: unless its schedule rule is Table 1's
    (``paper`` beside ``budget.schedule: keep``), Table 1's own DAREL cells cannot stand in."""
    return not (cfg["study"].get("schedule", "matched") == "paper" and cfg["budget"]["schedule"] == "keep")


# The data sets that record every sample's category (label noise among them).
DATASETS_WITH_CATEGORIES = ("synth",)


def study_methods(cfg: dict) -> list[str]:
    """The Table 1 study's methods this profile's data set can train: a method that draws
    its training set from the recorded label noise (the positive control's oracle) is left
    out on data that records none (its verdict file says the control was not run)."""
    from darel import methods

    dataset = cfg["profiles"][cfg["profile"]]["dataset"]
    return [m for m in cfg["study"]["table1"]["methods"]
            if dataset in DATASETS_WITH_CATEGORIES or not methods.get(m).needs_category]


def study_runs(cfg: dict) -> list[str]:
    """The Table 1 study's runs of each seed and budget: every method of ``study_methods``
    by its runs (darel.methods.base.Method.runs: its name; the negative control one per
    stream, darel-restream, darel-restream-2, ...)."""
    from darel import methods

    return [run for method in study_methods(cfg) for run in methods.get(method).runs(cfg)]


def study_table1_cells(cfg: dict) -> list[tuple[str, int, str, str]]:
    """(model, seed, budget cell, run) of the Table 1 study (``study_runs``)."""
    study = cfg["study"]["table1"]
    runs = study_runs(cfg)
    return [(model, seed, cell_id(t, m), run) for model in study["models"] for seed in study_seeds(cfg)
            for t, m in study_budgets(cfg, model) for run in runs]


def study_fit_check(cfg: dict) -> dict | None:
    """The fitting regime the Table 1 study declares for the active profile
    (``study.table1.fit_check.<profile>``: the least training top-1 and the largest rise
    of the test curve's last quarter), None when it declares none."""
    return (cfg["study"].get("table1", {}).get("fit_check") or {}).get(cfg["profile"])


def study_fit_baselines(cfg: dict) -> list[tuple[str, int]]:
    """(model, seed) of every baseline whose fit the study's verdict file reports: the
    study's baselines when it declares a fitting regime, none otherwise."""
    if not study_fit_check(cfg):
        return []
    return sorted({(model, seed) for model, seed, _, _ in study_table1_cells(cfg)})


def study_nlg_cells(cfg: dict, table: str) -> list[tuple[str, int, str]]:
    """(model, seed, cell) of a Table 2/3 study: per model and seed the LoRA baseline, and
    every method of every alpha (darel's cell is the table's own)."""
    study = cfg["study"][table]
    cells = []
    for model in study["models"]:
        for seed in study_seeds(cfg):
            cells.append((model, seed, NLG_BASELINE))
            cells += [(model, seed, nlg_study_cell(alpha_cell(a), method)) for a in study["alphas"]
                      for method in study["methods"]]
    return cells


def nlg_cells(cfg: dict, table: str) -> list[tuple[str, int, str]]:
    """(model, seed, cell) of Table 2 or 3: per model and seed the LoRA baseline, then one
    cell per alpha."""
    spec = cfg[table]
    return [(model, seed, cell) for model in spec["models"] for seed in seeds(cfg)
            for cell in [NLG_BASELINE] + [alpha_cell(a) for a in spec["alphas"]]]


def alpha_of(cfg: dict, table: str, cell: str) -> float | None:
    if cell == NLG_BASELINE:
        return None
    study = cfg.get("study", {}).get(table, {})
    for alpha in list(cfg[table]["alphas"]) + list(study.get("alphas", [])):
        if alpha_cell(alpha) == cell:
            return float(alpha)
    raise ConfigError(f"cell {cell!r} is one of neither {table}.alphas {cfg[table]['alphas']} nor study.{table}.alphas")


def nlg_study_cell(cell: str, method: str) -> str:
    """The cell id of a Table 2/3 study method: darel is the table's own cell."""
    return cell if method == "darel" else cell + NLG_CONTROL_SUFFIX[method]


def split_nlg_cell(cell: str) -> tuple[str, str]:
    """(alpha cell or lora, method): 'a0.70_easy' -> ('a0.70', 'easy'), 'a0.70' -> ('a0.70', 'darel')."""
    for method, suffix in NLG_CONTROL_SUFFIX.items():
        if cell.endswith(suffix):
            return cell[: -len(suffix)], method
    return cell, "lora" if cell == NLG_BASELINE else "darel"
