"""How many paired seeds a study needs to detect a margin, from a pilot's own spread.

    python -m darel.tools.seeds --pilot results/study_table1.csv              # the declared primary analysis
    python -m darel.tools.seeds --pilot results/study_table1.csv --margin 2 --family 6
    python -m darel.tools.seeds --sd 2.1 --margin 3 --family 6                # a standard deviation you know
    python -m darel.tools.seeds --pilot results/study_table1.csv --positive --seeds 12   # the study's positive control

The pilot is a study's per-seed rows (results/study_<table>.csv, or the copy in
docs/studies/): per comparison (DAREL minus a control at a budget) the standard deviation
of the paired differences over the pilot's seeds. A comparison of the primary family must
detect the margin at the study's power whatever its rank among the family's p-values, so
it is sized at the first Holm step's level: level / family size (docs/studies.md, "Power
and seeds"). The margin, metric, methods, family size, level and power default to the
primary analysis declared in params.yaml (``study.<table>.primary``, ``study.level``,
``study.power``); a flag overrides each.

``--positive`` sizes the study's own positive control instead (``study.table1.validation.positive``:
the oracle minus its partner at every budget it is judged at, ``positive_budgets``, one Holm
family over them, passed only when every one is significant): by default each budget's comparison is sized to detect the
gain the pilot itself measured there (the gain the benchmark builds in, as far as the pilot
can tell); ``--margin`` names one instead. ``--seeds N`` adds each comparison's power at N
seeds, and, for the positive control, the chance that every budget passes (the product of
the powers at the first Holm step: a lower bound where the budgets' tests are independent).
"""

from __future__ import annotations

import argparse
import math
import sys

import pandas as pd

from darel import config
from darel.study import min_detectable_difference, paired_differences, paired_power, seeds_needed

TABLES = ("table1", "table2", "table3")


def declared_family(cfg: dict, table: str) -> dict:
    """The primary declaration of ``table``'s study and its family size under the active
    profile (controls x budgets or alphas x models)."""
    section = cfg["study"][table]
    primary = section.get("primary")
    if not primary:
        raise config.ConfigError(f"params: study.{table} declares no primary analysis; give --metric, --margin and "
                                 "--family")
    if table == "table1":
        budgets = {model: config.study_budgets(cfg, model) for model in section["models"]}
        chosen = sum(len(b) if primary["budgets"] == "all" else len(primary["budgets"]) for b in budgets.values())
    else:
        chosen = len(section["models"]) * (len(section["alphas"]) if primary["alphas"] == "all"
                                           else len(primary["alphas"]))
    return {**primary, "family": len(primary["methods"]) * chosen}


def positive_control(cfg: dict) -> dict:
    """The study's declared positive control as a family to size: its oracle (the reference),
    its partner and the number of budgets it is tested at (table 1 only: the oracle needs the
    generated benchmark's recorded categories)."""
    section = cfg["study"]["table1"]
    validation = section.get("validation") or {}
    if not validation.get("positive"):
        raise config.ConfigError("params: study.table1.validation declares no positive control")
    # the judged budgets exactly as the study stage resolves them (config.study_verdict_params)
    cells = config.study_verdict_params(cfg)["validation"].get("positive_cells")
    budgets = sum(len(config.study_budgets(cfg, model)) if cells is None else len(cells) for model in section["models"])
    return {"reference": validation["positive"][0], "methods": [validation["positive"][1]], "family": budgets,
            "cells": cells}


def pilot_spreads(rows: pd.DataFrame, metric: str, methods: list[str] | None,
                  reference: str = "darel") -> pd.DataFrame:
    """Per comparison of the pilot (``reference`` minus each control, per model and budget):
    the number of paired seeds, the mean and the standard deviation of the differences."""
    if "budget" not in rows:
        rows = rows.assign(budget=rows["cell"])
    frame = paired_differences(rows, metric=metric, reference=reference)
    if frame.empty:
        raise ValueError(f"the pilot has no comparison of {reference} with a control in {metric!r}")
    if methods:
        frame = frame[frame["control"].isin(methods)]
        if frame.empty:
            raise ValueError(f"the pilot holds none of the methods {methods}")
    return frame[["model", "budget", "control", "n", "mean_diff", "std_diff"]].reset_index(drop=True)


def plan(spreads: pd.DataFrame, *, margin: float | None, level: float, family: int, power: float,
         seeds: int | None = None) -> pd.DataFrame:
    """Seeds needed per comparison to detect ``margin`` (None: each comparison's own pilot
    mean, a gain the study must find) at ``power``, each tested at level / family (the first
    Holm step), the minimum detectable difference that the pilot's own seed count gives at
    that level and, with ``seeds``, the power at that many seeds."""
    per_test = level / family
    out = spreads.copy()
    out["target"] = margin if margin is not None else out["mean_diff"]
    out["seeds_needed"] = [seeds_needed(sd, target, per_test, power) if not (math.isnan(sd) or target <= 0)
                           else math.nan for sd, target in zip(out["std_diff"], out["target"])]
    out["mdd_at_pilot_n"] = [min_detectable_difference(sd, int(n), per_test, power) if not math.isnan(n) else math.nan
                             for sd, n in zip(out["std_diff"], out["n"])]
    if seeds is not None:
        out[f"power_at_{seeds}"] = [paired_power(target, sd, seeds, per_test) if target > 0 else math.nan
                                    for sd, target in zip(out["std_diff"], out["target"])]
    return out


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = ap.add_mutually_exclusive_group(required=True)
    source.add_argument("--pilot", nargs="+", help="a study's per-seed rows (results/study_<table>.csv); several "
                        "files are pooled (their seeds must differ)")
    source.add_argument("--sd", type=float, help="the standard deviation of the paired differences, known already")
    ap.add_argument("--study", choices=TABLES, default="table1", help="whose declaration gives the defaults")
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--metric", help="default: the primary analysis's metric")
    ap.add_argument("--margin", type=float, help="the difference to detect (default: the primary analysis's)")
    ap.add_argument("--family", type=int, help="comparisons in the primary family (default: the declared one's)")
    ap.add_argument("--methods", nargs="+", help="the controls to size for (default: the primary family's)")
    ap.add_argument("--level", type=float, help="family-wise level (default: study.level)")
    ap.add_argument("--power", type=float, help="default: study.power")
    ap.add_argument("--positive", action="store_true",
                    help="size the study's positive control (its oracle minus its partner at every budget) instead")
    ap.add_argument("--seeds", type=int, help="also print each comparison's power at this many seeds")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.seeds is not None and args.seeds < 2:
        print(f"seeds: --seeds needs at least 2 paired seeds, got {args.seeds}", file=sys.stderr)
        return 2
    if args.positive and args.pilot is None:
        print("seeds: --positive sizes a gain the pilot measured: give --pilot", file=sys.stderr)
        return 2

    declared: dict = {}
    cfg = None
    try:
        cfg = config.load_params(args.params)
        declared = declared_family(cfg, args.study)
        if args.positive:
            declared = {**declared, **positive_control(cfg), "margin": None}
    except config.ConfigError as err:
        if args.positive or None in (args.margin, args.family) or (args.pilot and args.metric is None):
            print(f"seeds: {err}", file=sys.stderr)
            return 2
    metric = args.metric or declared.get("metric")
    margin = args.margin if args.margin is not None else declared.get("margin")
    family = args.family if args.family is not None else declared.get("family")
    methods = args.methods or declared.get("methods")
    level = args.level if args.level is not None else (cfg or {}).get("study", {}).get("level", 0.05)
    power = args.power if args.power is not None else (cfg or {}).get("study", {}).get("power", 0.8)
    bad_margin = (margin is None and not args.positive) or (margin is not None and margin <= 0)
    if bad_margin or not family or family < 1 or not 0 < level < 1 or not 0 < power < 1:
        print(f"seeds: need a positive margin, a family of at least 1, a level and a power in (0, 1); got margin="
              f"{margin}, family={family}, level={level}, power={power}", file=sys.stderr)
        return 2

    if args.sd is not None:
        spreads = pd.DataFrame([{"model": "-", "budget": "-", "control": "(given)", "n": math.nan, "mean_diff": math.nan,
                                 "std_diff": args.sd}])
    else:
        try:
            pilot = pd.concat([pd.read_csv(path) for path in args.pilot], ignore_index=True)
            shared = pilot.duplicated(["model", "cell", "method", "seed"])
            if shared.any():
                raise ValueError(f"the pilots share seeds {sorted(set(pilot.loc[shared, 'seed']))}: pool only "
                                 "distinct seeds")
            if declared.get("cells") is not None:  # the positive control's judged budgets only
                pilot = pilot[pilot["cell"].isin(declared["cells"])]
            spreads = pilot_spreads(pilot, metric, methods, reference=declared.get("reference", "darel"))
        except (OSError, ValueError, KeyError) as err:
            print(f"seeds: {' '.join(args.pilot)}: {err}", file=sys.stderr)
            return 2
    table = plan(spreads, margin=margin, level=level, family=family, power=power, seeds=args.seeds)
    target = f"margin ±{margin:g}" if margin is not None else "each budget's own pilot gain (the positive control)"
    print(f"{target} in {metric}, {power:.0%} power, family of {family} at family-wise level {level:g}: "
          f"each comparison sized at level {level / family:.4g} (the first Holm step)")
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    if table["target"].le(0).any():
        print("a comparison's pilot gain is not positive: no number of seeds detects it", file=sys.stderr)
    needed = table["seeds_needed"].dropna()
    if len(needed):
        print(f"seeds needed for every comparison: {int(needed.max())}"
              + (" (or more: the pilot's standard deviation is itself uncertain with few seeds; round up)"
                 if args.pilot else ""))
    if args.seeds is not None and args.positive:
        every = math.prod(table[f"power_at_{args.seeds}"].fillna(0.0))
        print(f"chance that the positive control passes at every budget with {args.seeds} seeds: at least "
              f"{every:.0%} (if the pilot's gains and spreads are the true ones)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
