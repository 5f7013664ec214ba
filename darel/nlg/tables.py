"""Tables 2 and 3 (GPT-2 + LoRA, E2E-NLG / WebNLG) from cell records: pure functions.

Scores keep the official E2E scorer's scales in the CSV (BLEU, METEOR, ROUGE_L in 0-1,
NIST and CIDEr raw, TER in percent as sacrebleu reports it). The paper prints BLEU and
METEOR in percent, so the comparison multiplies ours by 100 for those two columns and
says so.
"""

from __future__ import annotations

import io as _io
from importlib import resources
from typing import Any

import pandas as pd

from darel.nlg.metrics import VARIANT_KEYS

NLG_LEADING = ["model", "method", "alpha", "boost", "BLEU", "TER", "METEOR", "NIST"]
NLG_EXTRA = ["ROUGE_L", "CIDEr", "time_s", "peak_mem_bytes", "co2e_kg", "energy_kwh", *VARIANT_KEYS, "n_train",
             "n_outputs_cut", "profile", "seed", "dataset_label", "cell"]
CSV_DECIMALS: dict[str, int | None] = {
    "alpha": 2, "boost": 3, "BLEU": 4, "TER": 2, "METEOR": 4, "NIST": 4, "ROUGE_L": 4, "CIDEr": 4, "time_s": 2,
    "co2e_kg": None, "energy_kwh": None, **{key: 2 for key in VARIANT_KEYS},
}
CSV_INTEGERS = ("peak_mem_bytes", "n_train", "n_outputs_cut", "seed", "n_seeds")
# The candidate implementation behind each paper column whose scale the official scorer does not give.
PAPER_SCALE_VARIANT = {"METEOR": "METEOR_nltk_exact_x100", "NIST": "NIST_nltk"}
PAPER_PERCENT = ("BLEU", "METEOR")  # columns the paper prints x100


SEED_SPREAD = ("boost", "BLEU", "TER", "METEOR", "NIST", "time_s")


def nlg_per_seed_rows(cells: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per (model, cell, seed); boost = the LoRA baseline's time of the same model
    and seed / the cell's time."""
    if not cells:
        raise ValueError("no cells given")
    frame = pd.DataFrame(cells)
    if "seed" not in frame:
        frame["seed"] = 0
    out = []
    for (model, seed), rows in frame.groupby(["model", "seed"], sort=False):
        base = rows[rows["method"] == "lora"]
        if len(base) != 1:
            raise ValueError(f"model {model!r} seed {seed} needs exactly one LoRA baseline cell, found {len(base)}")
        base_time = float(base["time_s"].iloc[0])
        out.append(rows.assign(boost=base_time / rows["time_s"].astype(float)))
    return pd.concat(out, ignore_index=True)


def build_nlg_table(cells: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per (model, cell): the mean over seeds (boost against the seed-matched LoRA
    baseline), with ``<column>_std`` and ``n_seeds``; per model the baseline first, then
    alpha descending."""
    frame = nlg_per_seed_rows(cells)
    rows = []
    for (_, _), group in frame.groupby(["model", "cell"], sort=False):
        record = group.iloc[0].to_dict()
        for column in group.columns:
            values = pd.to_numeric(group[column], errors="coerce")
            if column not in ("seed", "alpha") and values.notna().all() and not isinstance(record[column], str):
                record[column] = float(values.mean())
        for column in SEED_SPREAD:
            values = pd.to_numeric(group[column], errors="coerce").dropna()
            record[f"{column}_std"] = float(values.std(ddof=1)) if len(values) > 1 else float("nan")
        record["n_seeds"] = int(len(group))
        record["seeds"] = " ".join(str(int(s)) for s in sorted(group["seed"]))
        rows.append(record)
    table = pd.DataFrame(rows)
    table = table.assign(_order=(table["method"] != "lora").astype(int), _alpha=table["alpha"].fillna(1.0))
    table = table.sort_values(["model", "_order", "_alpha"], ascending=[True, True, False], kind="stable")
    table = pd.concat([table[table["model"] == m] for m in dict.fromkeys(frame["model"])], ignore_index=True)
    extra = [c for c in NLG_EXTRA if c in table.columns] + ["n_seeds", "seeds"] + [f"{c}_std" for c in SEED_SPREAD]
    return table[NLG_LEADING + extra]


def load_paper_table(table: str) -> pd.DataFrame:
    text = (resources.files("darel") / "reference" / f"{table}_paper.csv").read_text(encoding="utf-8")
    return pd.read_csv(_io.StringIO(text))


def compare_nlg_with_paper(ours: pd.DataFrame, paper: pd.DataFrame, title: str) -> str:
    labels = sorted(set(ours["dataset_label"].astype(str)))
    profiles = sorted(set(ours["profile"].astype(str)))
    lines = [f"# {title}: this reproduction beside the paper", "",
             f"- our profile: {', '.join(profiles)}", f"- our data: {'; '.join(labels)}",
             "- our BLEU and METEOR are multiplied by 100 here to match the paper's printing; the CSV keeps the "
             "official 0-1 scale. Our METEOR is METEOR 1.5 and our NIST mteval-v13a (the official E2E scorer); the "
             "paper's METEOR/NIST scale differs (see docs/deviations.md).", ""]
    if profiles != ["paper"]:
        lines += ["> **WARNING: not the paper profile.** Synthetic data and tiny models: only the pipeline and the "
                  "direction of the ratios can be compared, not the scores.", ""]
    # paper column -> (our column, factor to the paper's printing)
    main = {c: (c, 100 if c in PAPER_PERCENT else 1) for c in ("boost", "BLEU", "TER", "METEOR", "NIST")}
    lines += _side_by_side(ours, paper, main, ours_label="ours")
    if all(key in ours.columns and ours[key].notna().all() for key in PAPER_SCALE_VARIANT.values()):
        lines += _variant_section(ours, paper)
    return "\n".join(lines) + "\n"


def _paper_row(paper: pd.DataFrame, row: pd.Series) -> pd.DataFrame:
    alpha = row["alpha"]
    return paper[(paper["model"] == row["model"]) & (paper["method"] == row["method"])
                 & ((paper["alpha"].isna() & pd.isna(alpha)) | (paper["alpha"] == alpha))]


def _side_by_side(ours: pd.DataFrame, paper: pd.DataFrame, columns: dict[str, tuple[str, float]],
                  ours_label: str) -> list[str]:
    """Markdown rows: per cell, each paper column beside our column (times its factor)."""
    header = ["model", "method"] + [f"{c} {who}" for c in columns for who in ("paper", ours_label)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for _, row in ours.iterrows():
        match = _paper_row(paper, row)
        method = "LoRA" if row["method"] == "lora" else f"LoRA + DAREL (alpha {row['alpha']:.1f})"
        cells = [row["model"], method]
        for paper_column, (our_column, factor) in columns.items():
            ref = match[paper_column].iloc[0] if len(match) else float("nan")
            cells += ["—" if pd.isna(ref) else f"{ref:.2f}", f"{float(row[our_column]) * factor:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _variant_section(ours: pd.DataFrame, paper: pd.DataFrame) -> list[str]:
    lines = ["", "## METEOR and NIST on the paper's scale (candidate implementations)", "",
             "The paper's METEOR (73-82) and NIST (6-7) do not fit the official scorer for its BLEU. The columns "
             "below put the paper's figures beside the implementations that most plausibly produced them: "
             + ", ".join(f"{col} = `{var}`" for col, var in PAPER_SCALE_VARIANT.items())
             + " (what each is and how sure we are: `darel/nlg/metrics.py`, docs/deviations.md).", ""]
    variants = {column: (variant, 1) for column, variant in PAPER_SCALE_VARIANT.items()}
    return lines + _side_by_side(ours, paper, variants, ours_label="ours (variant)")
