"""Parameters: loading, validation and the per-stage slices.

``params.yaml`` is the only place a parameter is set. Snakemake and DVC both read
it; Snakemake merges ``--config`` overrides on top. Everything is validated here
before any stage runs, and each stage receives only the slice of parameters it
depends on, so that changing one value re-runs only the jobs that use it.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import jsonschema
import yaml

KNOWN_MODELS = ("resnet18", "resnet18_hc")
KNOWN_ALGEBRAS = ("complex", "dual", "double")
IDS_ADONIS = "ids_adonis"
KNOWN_DATASETS = ("cifar100", "digits")
TABLE1_BASELINE = "baseline"

_fraction = {"type": "number", "exclusiveMinimum": 0, "maximum": 1}
_pos_int = {"type": "integer", "minimum": 1}
_nonneg_int = {"type": "integer", "minimum": 0}
_pos_num = {"type": "number", "exclusiveMinimum": 0}

_protocol_props = {
    "optimizer": {"enum": ["sgd"]},
    "lr": _pos_num,
    "momentum": {"type": "number", "minimum": 0, "maximum": 1},
    "weight_decay": {"type": "number", "minimum": 0},
    "schedule": {"enum": ["multistep", "cosine"]},
    "milestones": {"type": "array", "items": _pos_int},
    "lr_gamma": _fraction,
    "epochs": _pos_int,
    "batch": _pos_int,
    "warmup_epochs": _nonneg_int,
    "width": _pos_int,
    "input_size": {"type": "integer", "minimum": 8},
    "algebra": {"enum": list(KNOWN_ALGEBRAS)},
    "stem": {"enum": ["cifar", "imagenet"]},
}
_PROTOCOL_REQUIRED = ["optimizer", "lr", "momentum", "weight_decay", "schedule", "milestones", "lr_gamma", "epochs",
                      "batch", "warmup_epochs", "width"]

_augment = {
    "type": "object",
    "additionalProperties": False,
    "required": ["pad", "hflip", "rotation_deg"],
    "properties": {
        "pad": _nonneg_int,
        "hflip": {"type": "boolean"},
        "rotation_deg": {"type": "number", "minimum": 0, "maximum": 180},
    },
}

SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["profile", "seed", "tracking", "carbon", "darel", "protocols", "datasets", "profiles", "table1"],
    "additionalProperties": False,
    "properties": {
        "profile": {"type": "string"},
        "seed": _nonneg_int,
        "tracking": {
            "type": "object",
            "required": ["uri"],
            "additionalProperties": False,
            "properties": {"uri": {"type": "string", "pattern": "^(sqlite:///|https?://)"}},
        },
        "carbon": {
            "type": "object",
            "required": ["country_iso_code", "pue", "measure_power_secs"],
            "additionalProperties": False,
            "properties": {
                "country_iso_code": {"type": "string", "pattern": "^[A-Z]{3}$"},
                "pue": {"type": "number", "minimum": 1},
                "measure_power_secs": _pos_num,
            },
        },
        "darel": {
            "type": "object",
            "additionalProperties": False,
            "required": ["mode", "alpha_default", "A_min", "A_max", "history_size", "bins", "budget_schedule",
                         "probe_warmup", "probe_repeats"],
            "properties": {
                "mode": {"enum": ["easy", "hard"]},
                "alpha_default": _fraction,
                "A_min": _fraction,
                "A_max": _fraction,
                "history_size": _pos_int,
                "bins": {"type": "integer", "minimum": 2},
                "budget_schedule": {"enum": ["keep", "rescale"]},
                "probe_warmup": _nonneg_int,
                "probe_repeats": _pos_int,
            },
        },
        "protocols": {
            "type": "object",
            "propertyNames": {"enum": list(KNOWN_MODELS)},
            "additionalProperties": {
                "type": "object",
                "additionalProperties": False,
                "required": _PROTOCOL_REQUIRED,
                "properties": _protocol_props,
            },
        },
        "datasets": {
            "type": "object",
            "propertyNames": {"enum": list(KNOWN_DATASETS)},
            "additionalProperties": {
                "type": "object",
                "additionalProperties": False,
                "required": ["augment"],
                "properties": {
                    "augment": _augment,
                    "image_size": {"type": "integer", "minimum": 8},
                    "test_fraction": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
                },
            },
        },
        "profiles": {
            "type": "object",
            "minProperties": 1,
            "additionalProperties": {
                "type": "object",
                "additionalProperties": False,
                "required": ["dataset", "device", "threads", "amp", "eval_batch", "models"],
                "properties": {
                    "dataset": {"enum": list(KNOWN_DATASETS)},
                    "device": {"enum": ["cpu", "cuda", "auto"]},
                    "threads": _pos_int,
                    "amp": {"type": "boolean"},
                    "eval_batch": _pos_int,
                    "models": {
                        "type": "object",
                        "propertyNames": {"enum": list(KNOWN_MODELS)},
                        "additionalProperties": {
                            "type": "object",
                            "additionalProperties": False,
                            "properties": _protocol_props,
                        },
                    },
                },
            },
        },
        "comparisons": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                IDS_ADONIS: {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["model", "keep_ratio", "clusters_per_class", "distance", "keep", "A", "eta"],
                    "properties": {
                        "model": {"enum": list(KNOWN_MODELS)},
                        "keep_ratio": _fraction,
                        "clusters_per_class": _pos_int,
                        "distance": {"enum": ["cosine", "euclidean"]},
                        "keep": {"enum": ["far", "near"]},
                        "A": _fraction,
                        "eta": _pos_int,
                    },
                },
            },
        },
        "table1": {
            "type": "object",
            "propertyNames": {"enum": list(KNOWN_MODELS)},
            "additionalProperties": {
                "type": "array",
                "items": {"type": "array", "prefixItems": [_fraction, _fraction], "minItems": 2, "maxItems": 2},
            },
        },
    },
}


class ConfigError(ValueError):
    """A parameter value that the workflow refuses to run with."""


def _where(path: Any) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"


def merge(base: dict, override: dict) -> dict:
    """Recursive merge, the same rule Snakemake applies to --config overrides."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def validate(cfg: dict) -> dict:
    """Raise ConfigError naming the first bad value; return cfg unchanged when valid."""
    errors = sorted(jsonschema.Draft202012Validator(SCHEMA).iter_errors(cfg), key=lambda e: list(e.absolute_path))
    if errors:
        err = errors[0]
        raise ConfigError(f"params: {_where(err.absolute_path)} = {err.instance!r}: {err.message}")
    if cfg["profile"] not in cfg["profiles"]:
        raise ConfigError(f"params: profile = {cfg['profile']!r}: unknown profile; known: {sorted(cfg['profiles'])}")
    darel = cfg["darel"]
    if darel["A_min"] > darel["A_max"]:
        raise ConfigError(f"params: darel.A_min = {darel['A_min']} is larger than darel.A_max = {darel['A_max']}")
    for name, prof in cfg["profiles"].items():
        if prof["dataset"] not in cfg["datasets"]:
            raise ConfigError(f"params: profiles.{name}.dataset = {prof['dataset']!r} has no entry under datasets")
        for model in cfg["table1"]:
            if model not in cfg["protocols"]:
                raise ConfigError(f"params: table1.{model}: no protocol for model {model!r} under protocols")
            proto = model_protocol(cfg, model, name)
            if proto["warmup_epochs"] > proto["epochs"]:
                raise ConfigError(f"params: profiles.{name} model {model}: warmup_epochs = "
                                  f"{proto['warmup_epochs']} exceeds epochs = {proto['epochs']}")
            late = [m for m in proto["milestones"] if m >= proto["epochs"]]
            if late:
                raise ConfigError(f"params: profiles.{name} model {model}: milestones {late} are not "
                                  f"below epochs = {proto['epochs']}")
    ids_cfg = cfg.get("comparisons", {}).get(IDS_ADONIS)
    if ids_cfg and ids_cfg["model"] not in cfg["table1"]:
        raise ConfigError(f"params: comparisons.{IDS_ADONIS}.model = {ids_cfg['model']!r} has no table1 entry "
                          "(its baseline is the scorer)")
    for model, budgets in cfg["table1"].items():
        ids = [cell_id(t, m) for t, m in budgets]
        if len(set(ids)) != len(ids):
            raise ConfigError(f"params: table1.{model} lists a budget twice: {ids}")
    return cfg


def coerce_cli_scalars(obj: Any) -> Any:
    """Snakemake hands nested --config values over as strings ('3', 'true'); turn numeric
    and true/false strings back into numbers and booleans so the schema sees real types.
    (Only these forms: YAML's yes/no/on/off would turn a country code like NO into False.)"""
    if isinstance(obj, dict):
        return {key: coerce_cli_scalars(value) for key, value in obj.items()}
    if isinstance(obj, list):
        return [coerce_cli_scalars(value) for value in obj]
    if isinstance(obj, str):
        if obj.lower() in ("true", "false"):
            return obj.lower() == "true"
        for kind in (int, float):
            try:
                return kind(obj)
            except ValueError:
                pass
    return obj


def load_params(path: str | Path = "params.yaml", overrides: dict | None = None) -> dict:
    text = Path(path).read_text(encoding="utf-8")
    cfg = yaml.safe_load(text)
    if not isinstance(cfg, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return validate(merge(cfg, overrides or {}))


# ---- cells -----------------------------------------------------------------

_CELL_RE = re.compile(r"^t(\d\.\d\d)_m(\d\.\d\d)$")


def cell_id(t: float, m: float) -> str:
    return f"t{t:.2f}_m{m:.2f}"


def parse_cell(cell: str) -> tuple[float, float]:
    match = _CELL_RE.match(cell)
    if not match:
        raise ConfigError(f"cell {cell!r} is not of the form t0.80_m0.70")
    return float(match.group(1)), float(match.group(2))


def table1_cells(cfg: dict) -> list[tuple[str, str]]:
    """(model, cell) pairs of Table 1, the baseline first for each model."""
    cells = []
    for model, budgets in cfg["table1"].items():
        cells.append((model, TABLE1_BASELINE))
        cells.extend((model, cell_id(t, m)) for t, m in budgets)
        ids_cfg = cfg.get("comparisons", {}).get(IDS_ADONIS)
        if ids_cfg and ids_cfg["model"] == model:
            cells.append((model, IDS_ADONIS))
    return cells


def budget_of(cfg: dict, model: str, cell: str) -> tuple[float, float]:
    t, m = parse_cell(cell)
    for bt, bm in cfg["table1"].get(model, []):
        if cell_id(bt, bm) == cell:
            return float(bt), float(bm)
    raise ConfigError(f"cell {cell!r} of model {model!r} is not listed under table1.{model}")


# ---- per-stage slices ------------------------------------------------------

def model_protocol(cfg: dict, model: str, profile: str | None = None) -> dict:
    profile = profile or cfg["profile"]
    overrides = cfg["profiles"][profile]["models"].get(model, {})
    return {**cfg["protocols"][model], **overrides}


def runtime_params(cfg: dict) -> dict:
    prof = cfg["profiles"][cfg["profile"]]
    return {key: prof[key] for key in ("device", "threads", "amp", "eval_batch")}


def dataset_params(cfg: dict) -> dict:
    prof = cfg["profiles"][cfg["profile"]]
    name = prof["dataset"]
    return {"dataset": name, "seed": cfg["seed"], **cfg["datasets"][name]}


def training_params(cfg: dict, model: str) -> dict:
    """What a training run of `model` depends on under the active profile."""
    return {
        "model": model,
        "seed": cfg["seed"],
        "protocol": model_protocol(cfg, model),
        "augment": dataset_params(cfg)["augment"],
        "carbon": cfg["carbon"],
        **runtime_params(cfg),
    }


def calibration_params(cfg: dict, model: str, cell: str) -> dict:
    t, m = budget_of(cfg, model, cell)
    keys = ("alpha_default", "A_min", "A_max", "probe_warmup", "probe_repeats")
    return {**training_params(cfg, model), "t": t, "m": m, **{k: cfg["darel"][k] for k in keys}}


def online_params(cfg: dict, model: str, cell: str) -> dict:
    keys = ("history_size", "bins", "budget_schedule")
    budget = ({"ids_adonis": ids_adonis_params(cfg)} if cell == IDS_ADONIS
              else dict(zip(("t", "m"), budget_of(cfg, model, cell))))
    return {**training_params(cfg, model), **budget, **{k: cfg["darel"][k] for k in keys}}


def ids_adonis_params(cfg: dict) -> dict:
    return dict(cfg["comparisons"][IDS_ADONIS])


def report_params(cfg: dict) -> dict:
    return {"profile": cfg["profile"], "seed": cfg["seed"], "tracking_uri": cfg["tracking"]["uri"],
            "pue": cfg["carbon"]["pue"]}
