"""Each stage's slice of the parameters: what a job depends on, so that changing one
value re-runs exactly the jobs that use it."""

from __future__ import annotations

from darel.config.cells import alpha_of, budget_of, split_nlg_cell
from darel.config.errors import ConfigError
from darel.grammar import IDS_ADONIS

def control_params(cfg: dict, model: str, cell: str, seed: int, method: str) -> dict:
    """What a method's run of the study depends on: the online stage's slice plus the
    method and its own settings, at their params.yaml path (``controls.rs2``, ``darel``):
    changing another method's settings, or adding a method, leaves this job alone.
    ``method`` may name one of a method's runs (``Method.runs``: darel-restream-2, the
    second restream): the slice holds that run's settings alone."""
    from darel import methods

    try:
        chosen = methods.of_run(method)
        own = chosen.settings_slice(cfg, run=method)
    except ValueError as err:
        raise ConfigError(f"params: {err}") from None
    return {**online_params(cfg, model, cell, seed), "method": chosen.name, **own,
            "study_schedule": cfg["study"].get("schedule", "matched")}


def model_protocol(cfg: dict, model: str, profile: str | None = None) -> dict:
    profile = profile or cfg["profile"]
    overrides = cfg["profiles"][profile]["models"].get(model, {})
    return {**cfg["protocols"][model], **overrides}


def runtime_params(cfg: dict) -> dict:
    prof = cfg["profiles"][cfg["profile"]]
    # cudnn_benchmark and curve_test only where a profile sets them: the other profiles'
    # slices, and so their jobs, stay as they were.
    return {key: prof[key] for key in ("device", "threads", "precision", "compile", "eval_batch", "eval_every",
                                       "checkpoint_every", "cudnn_benchmark", "curve_test") if key in prof}


def dataset_params(cfg: dict) -> dict:
    """What the data set depends on; for the generated benchmark its settings and the
    entries of the profile's size only (another size's change leaves it alone)."""
    prof = cfg["profiles"][cfg["profile"]]
    name = prof["dataset"]
    settings = dict(cfg["datasets"][name])
    if name == "synth":
        size = prof["dataset_size"]
        settings = {**{k: v for k, v in settings.items() if k != "sizes"}, "size": size, **settings["sizes"][size]}
    return {"dataset": name, "seed": cfg["seed"], **settings}


def training_params(cfg: dict, model: str, seed: int | None = None) -> dict:
    """What a training run of `model` with `seed` (default: the global seed) depends on
    under the active profile."""
    return {
        "model": model,
        "seed": cfg["seed"] if seed is None else int(seed),
        # The scorer choice is not part of how a model trains (it only picks losses.npz).
        "protocol": {k: v for k, v in model_protocol(cfg, model).items() if k != "scorer"},
        "augment": dataset_params(cfg)["augment"],
        "carbon": cfg["carbon"],
        **runtime_params(cfg),
    }


def calibration_params(cfg: dict, model: str, cell: str, seed: int | None = None) -> dict:
    t, m = budget_of(cfg, model, cell)
    keys = ("alpha_default", "A_min", "A_max", "history_size", "bins")
    # Not budget.lr_rule: the calibration's probes time and meter steps, whatever the rate.
    return {**training_params(cfg, model, seed), "t": t, "m": m, **{k: cfg["darel"][k] for k in keys},
            "budget": {k: v for k, v in cfg["budget"].items() if k != "lr_rule"}}


def online_params(cfg: dict, model: str, cell: str, seed: int | None = None) -> dict:
    keys = ("history_size", "bins")
    budget = ({"ids_adonis": ids_adonis_params(cfg)} if cell == IDS_ADONIS
              else dict(zip(("t", "m"), budget_of(cfg, model, cell))))
    return {**training_params(cfg, model, seed), **budget, **{k: cfg["darel"][k] for k in keys},
            "budget": {k: cfg["budget"][k] for k in ("enforce", "schedule", "lr_rule")}}


def scorer_of(cfg: dict, model: str) -> str:
    """The model whose baseline scores the data for Algorithm 2 in this model's cells."""
    return model_protocol(cfg, model)["scorer"]


def ids_adonis_params(cfg: dict) -> dict:
    return dict(cfg["comparisons"][IDS_ADONIS])


def study_verdict_params(cfg: dict, table: str = "table1") -> dict:
    """What a study's verdicts depend on: its schedule rule (named in the verdict), its
    equivalence margins, its family-wise level, the power its minimum detectable
    differences are stated at, and its primary analysis (``primary``: the declaration with
    its budgets or alphas resolved to cell ids in ``cells``, None for all; absent when the
    study declares none); its own controls (``validation``, with ``negative_runs``, the
    negative control's restreams, where it trains more than one)."""
    from darel.config.cells import alpha_cell, cell_id

    study = cfg["study"]
    out = {"schedule": study.get("schedule", "matched"), "margin": dict(study.get("margin", {})),
           "level": study.get("level", 0.05), "power": study.get("power", 0.8)}
    declared = study.get(table, {}).get("primary")
    if declared:
        chosen = declared.get("budgets", declared.get("alphas"))
        cells = None if chosen == "all" else (
            [cell_id(t, m) for t, m in chosen] if table == "table1" else [alpha_cell(a) for a in chosen])
        out["primary"] = {**declared, "cells": cells}
    if table == "table1":
        from darel.config.cells import study_fit_check

        if study_fit_check(cfg):  # absent otherwise: a study without it keeps its table job's parameters
            out["fit_check"] = dict(study_fit_check(cfg))
    if study.get(table, {}).get("validation"):
        from darel.config.cells import study_budgets, study_methods

        validation = dict(study[table]["validation"])
        if any(m not in study_methods(cfg) for m in validation.get("positive", [])):
            validation.pop("positive")  # this data set records no label noise: the verdict says it was not run
        chosen = validation.pop("positive_budgets", "all")
        if chosen != "all" and "positive" in validation:
            # judged at the declared budgets the study runs; when an override runs none of them, at
            # every budget (the strictest rule; the verdict file names the budgets it judged)
            run = {cell_id(t, m) for model in study[table]["models"] for t, m in study_budgets(cfg, model)}
            judged = [cell_id(t, m) for t, m in chosen if cell_id(t, m) in run]
            if judged:
                validation["positive_cells"] = judged
        negative = validation.get("negative")
        runs = methods_runs(cfg, negative) if negative else []
        if len(runs) > 1:  # several restreams per seed (one adds no key: its verdict reads as it always did)
            validation["negative_runs"] = runs
        out["validation"] = validation
    return out


def methods_runs(cfg: dict, method: str) -> list[str]:
    """The study runs of ``method`` under ``cfg`` (darel.methods.base.Method.runs)."""
    from darel import methods

    return methods.get(method).runs(cfg)


def report_params(cfg: dict, seed: int | None = None) -> dict:
    """What a cell's report depends on. Not the tracking store: the report never writes to
    it, and switching stores must not re-run a report (only the tracking jobs)."""
    return {"profile": cfg["profile"], "seed": cfg["seed"] if seed is None else int(seed),
            "pue": cfg["carbon"]["pue"]}


# ---- Tables 2 and 3 (GPT-2 + LoRA) -------------------------------------------

def _profile_nlg(cfg: dict) -> dict:
    prof = cfg["profiles"][cfg["profile"]]
    if "nlg" not in prof:
        raise ConfigError(f"params: profiles.{cfg['profile']} has no nlg section: Tables 2/3 cannot run on it")
    return prof["nlg"]


def nlg_synthetic(cfg: dict) -> bool:
    """The quick profile generates its data and trains its tokenizer and tiny GPT-2s here."""
    return "data" in _profile_nlg(cfg)


def nlg_data_params(cfg: dict, dataset: str) -> dict:
    nlg = _profile_nlg(cfg)
    data = nlg.get("data", {})
    return {"dataset": dataset, "seed": cfg["seed"], "synthetic": nlg_synthetic(cfg), **data,
            **({"source": data.get("source", "synthetic")} if data else {})}


def nlg_precision(cfg: dict) -> str:
    """Precision of the NLG jobs: profiles.<p>.nlg.precision, else the profile's own."""
    prof = cfg["profiles"][cfg["profile"]]
    nlg = _profile_nlg(cfg)
    return nlg.get("precision", prof["precision"])


def nlg_model_params(cfg: dict, dataset: str, model: str) -> dict:
    nlg = _profile_nlg(cfg)
    return {"dataset": dataset, "model": model, "seed": cfg["seed"], "synthetic": nlg_synthetic(cfg),
            "architecture": nlg["models"][model], "tokenizer": nlg.get("tokenizer", {}),
            "pretrain": nlg.get("pretrain", {}), **runtime_params(cfg), "precision": nlg_precision(cfg),
            "decoding": {**cfg["nlg"]["decoding"], **nlg.get("decoding", {})}}


def nlg_finetune_settings(cfg: dict) -> dict:
    """The fine-tuning's settings of the active profile. ``nodes`` (Slurm) appears only when
    above 1: the slices of the one-node runs stay those they were built with."""
    settings = {**cfg["nlg"]["finetune"], **_profile_nlg(cfg).get("finetune", {})}
    if settings.get("nodes", 1) == 1:
        settings.pop("nodes", None)
    return settings


def nlg_finetune_params(cfg: dict, table: str, model: str, cell: str, seed: int | None = None) -> dict:
    """What one fine-tuning depends on. ``seed`` (default: the global seed) drives the LoRA
    initialisation, dropout and batch order (data, tokenizer and pretraining keep the global
    seed). The cell picks the subset: the LoRA baseline all pairs, an alpha cell
    Algorithm 2's (darel.mode), its study controls a random or the lowest-loss (easy) one."""
    nlg = _profile_nlg(cfg)
    base, method = split_nlg_cell(cell)
    mode = {"random": "random", "easy": "easy"}.get(method, cfg["darel"]["mode"])
    return {**nlg_model_params(cfg, cfg[table]["dataset"], model), "table": table, "cell": cell,
            "seed": cfg["seed"] if seed is None else int(seed), "method": method,
            "alpha": alpha_of(cfg, table, base), "mode": mode,
            "finetune": nlg_finetune_settings(cfg), "lora": cfg["nlg"]["lora"],
            "decoding": {**cfg["nlg"]["decoding"], **nlg.get("decoding", {})}, "carbon": cfg["carbon"]}
