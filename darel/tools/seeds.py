"""How many paired seeds a study needs to detect a margin, from a pilot's own spread.

    python -m darel.tools.seeds --pilot results/study_table1.csv              # the declared primary analysis
    python -m darel.tools.seeds --pilot results/study_table1.csv --margin 2 --family 6
    python -m darel.tools.seeds --sd 2.1 --margin 3 --family 6                # a standard deviation you know

The pilot is a study's per-seed rows (results/study_<table>.csv, or the copy in
docs/studies/): per comparison (DAREL minus a control at a budget) the standard deviation
of the paired differences over the pilot's seeds. A comparison of the primary family must
detect the margin at the study's power whatever its rank among the family's p-values, so
it is sized at the first Holm step's level: level / family size (docs/studies.md, "Power
and seeds"). The margin, metric, methods, family size, level and power default to the
primary analysis declared in params.yaml (``study.<table>.primary``, ``study.level``,
``study.power``); a flag overrides each.
"""

from __future__ import annotations

import argparse
import math
import sys

import pandas as pd

from darel import config
from darel.study import min_detectable_difference, paired_differences, seeds_needed

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


def pilot_spreads(rows: pd.DataFrame, metric: str, methods: list[str] | None) -> pd.DataFrame:
    """Per comparison of the pilot (DAREL minus each control, per model and budget): the
    number of paired seeds and the standard deviation of the differences."""
    if "budget" not in rows:
        rows = rows.assign(budget=rows["cell"])
    frame = paired_differences(rows, metric=metric)
    if frame.empty:
        raise ValueError(f"the pilot has no comparison of darel with a control in {metric!r}")
    if methods:
        frame = frame[frame["control"].isin(methods)]
        if frame.empty:
            raise ValueError(f"the pilot holds none of the methods {methods}")
    return frame[["model", "budget", "control", "n", "mean_diff", "std_diff"]].reset_index(drop=True)


def plan(spreads: pd.DataFrame, *, margin: float, level: float, family: int, power: float) -> pd.DataFrame:
    """Seeds needed per comparison to detect ``margin`` at ``power``, each tested at
    level / family (the first Holm step), and the minimum detectable difference that the
    pilot's own seed count gives at that level."""
    per_test = level / family
    out = spreads.copy()
    out["seeds_needed"] = [seeds_needed(sd, margin, per_test, power) if not math.isnan(sd) else math.nan
                           for sd in out["std_diff"]]
    out["mdd_at_pilot_n"] = [min_detectable_difference(sd, int(n), per_test, power) if not math.isnan(n) else math.nan
                             for sd, n in zip(out["std_diff"], out["n"])]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = ap.add_mutually_exclusive_group(required=True)
    source.add_argument("--pilot", help="a study's per-seed rows (results/study_<table>.csv)")
    source.add_argument("--sd", type=float, help="the standard deviation of the paired differences, known already")
    ap.add_argument("--study", choices=TABLES, default="table1", help="whose declaration gives the defaults")
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--metric", help="default: the primary analysis's metric")
    ap.add_argument("--margin", type=float, help="the difference to detect (default: the primary analysis's)")
    ap.add_argument("--family", type=int, help="comparisons in the primary family (default: the declared one's)")
    ap.add_argument("--methods", nargs="+", help="the controls to size for (default: the primary family's)")
    ap.add_argument("--level", type=float, help="family-wise level (default: study.level)")
    ap.add_argument("--power", type=float, help="default: study.power")
    args = ap.parse_args(argv)

    declared: dict = {}
    cfg = None
    try:
        cfg = config.load_params(args.params)
        declared = declared_family(cfg, args.study)
    except config.ConfigError as err:
        if None in (args.margin, args.family) or (args.pilot and args.metric is None):
            print(f"seeds: {err}", file=sys.stderr)
            return 2
    metric = args.metric or declared.get("metric")
    margin = args.margin if args.margin is not None else declared.get("margin")
    family = args.family if args.family is not None else declared.get("family")
    methods = args.methods or declared.get("methods")
    level = args.level if args.level is not None else (cfg or {}).get("study", {}).get("level", 0.05)
    power = args.power if args.power is not None else (cfg or {}).get("study", {}).get("power", 0.8)
    if not margin or margin <= 0 or not family or family < 1 or not 0 < level < 1 or not 0 < power < 1:
        print(f"seeds: need a positive margin, a family of at least 1, a level and a power in (0, 1); got margin="
              f"{margin}, family={family}, level={level}, power={power}", file=sys.stderr)
        return 2

    if args.sd is not None:
        spreads = pd.DataFrame([{"model": "-", "budget": "-", "control": "(given)", "n": math.nan, "mean_diff": math.nan,
                                 "std_diff": args.sd}])
    else:
        try:
            spreads = pilot_spreads(pd.read_csv(args.pilot), metric, methods)
        except (OSError, ValueError, KeyError) as err:
            print(f"seeds: {args.pilot}: {err}", file=sys.stderr)
            return 2
    table = plan(spreads, margin=margin, level=level, family=family, power=power)
    print(f"margin ±{margin:g} in {metric}, {power:.0%} power, family of {family} at family-wise level {level:g}: "
          f"each comparison sized at level {level / family:.4g} (the first Holm step)")
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    needed = table["seeds_needed"].dropna()
    if len(needed):
        print(f"seeds needed for every comparison: {int(needed.max())}"
              + (" (or more: the pilot's standard deviation is itself uncertain with few seeds; round up)"
                 if args.pilot else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
