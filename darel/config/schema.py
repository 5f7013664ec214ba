"""The schema of params.yaml and its loading: every value validated, with one line
naming the key, the value and the rule it breaks, before any stage runs."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from darel import grammar
from darel.config.cells import cell_id
from darel.config.errors import ConfigError
from darel.config.slices import model_protocol
from darel.grammar import IDS_ADONIS

KNOWN_MODELS = ("resnet18", "resnet18_hc")
KNOWN_ALGEBRAS = ("complex", "dual", "double")
KNOWN_DATASETS = ("cifar100", "digits")
NLG_DATASETS = ("e2e", "webnlg")
NLG_MODELS = ("gpt2-small", "gpt2-medium", "gpt2-large")
NLG_TABLES = {"table2": "e2e", "table3": "webnlg"}

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
    "scorer": {"enum": list(KNOWN_MODELS)},
}
_PROTOCOL_REQUIRED = ["optimizer", "lr", "momentum", "weight_decay", "schedule", "milestones", "lr_gamma", "epochs",
                      "batch", "warmup_epochs", "width", "scorer"]

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

_finetune_props = {
    "lr": _pos_num,
    "betas": {"type": "array", "items": {"type": "number", "minimum": 0, "exclusiveMaximum": 1},
              "minItems": 2, "maxItems": 2},
    "weight_decay": {"type": "number", "minimum": 0},
    "warmup_steps": _nonneg_int,
    "label_smoothing": {"type": "number", "minimum": 0, "exclusiveMaximum": 1},
    "epochs": _pos_int,
    "batch": _pos_int,
    # auto: the longest encoded training pair (quick profile; darel.nlg.lm.derive_lengths)
    "max_length": {"oneOf": [{"type": "integer", "minimum": 16}, {"const": "auto"}]},
    "processes": _pos_int,
}
_decoding_props = {
    "num_beams": _pos_int,
    "length_penalty": {"type": "number"},
    "no_repeat_ngram_size": _nonneg_int,
    "max_new_tokens": _pos_int,
}
_nlg_table = {
    "type": "object",
    "additionalProperties": False,
    "required": ["dataset", "models", "alphas"],
    "properties": {
        "dataset": {"enum": list(NLG_DATASETS)},
        "models": {"type": "array", "items": {"enum": list(NLG_MODELS)}, "uniqueItems": True},
        "alphas": {"type": "array", "items": _fraction, "uniqueItems": True},
    },
}
_profile_nlg_schema = {
    "type": "object",
    "additionalProperties": False,
    "required": ["models"],
    "properties": {
        # synthetic: generated stand-ins; local: a slice of the official files a user put in data/raw
        "data": {"type": "object", "additionalProperties": False,
                 "properties": {"source": {"enum": ["synthetic", "local"]}, "n_train": _pos_int, "n_dev": _pos_int,
                                "n_test": _pos_int}},
        "tokenizer": {"type": "object", "additionalProperties": False,
                      "properties": {"vocab_size": {"oneOf": [{"type": "integer", "minimum": 300}, {"const": "auto"}]},
                                     "min_frequency": _pos_int}},
        "pretrain": {"type": "object", "additionalProperties": False,
                     "properties": {"epochs": _pos_int, "batch": _pos_int, "lr": _pos_num}},
        "models": {
            "type": "object",
            "propertyNames": {"enum": list(NLG_MODELS)},
            "additionalProperties": {
                "type": "object", "additionalProperties": False,
                "properties": {"hub": {"type": "string"}, "revision": {"type": "string", "minLength": 1},
                               "n_embd": _pos_int, "n_layer": _pos_int, "n_head": _pos_int,
                               "n_positions": {"type": "integer", "minimum": 16}},
            },
        },
        "finetune": {"type": "object", "additionalProperties": False, "properties": _finetune_props},
        "decoding": {"type": "object", "additionalProperties": False, "properties": _decoding_props},
        # fine-tuning, scoring and decoding precision (darel.step): fp16 = autocast + GradScaler (the
        # paper's), bf16, auto = bf16 where the GPU supports it; absent: the profile's precision
        "precision": {"enum": ["fp32", "fp16", "bf16", "auto"]},
    },
}

_budget_pair = {"type": "array", "prefixItems": [_fraction, _fraction], "minItems": 2, "maxItems": 2}
CONTROL_METHODS = ("darel", "random-offline", "uniform-online", "random", "short-schedule", "selective-backprop",
                   "infobatch", "rs2")
_study_table1 = {
    "type": "object",
    "additionalProperties": False,
    "required": ["models", "budgets", "methods"],
    "properties": {
        "models": {"type": "array", "items": {"enum": list(KNOWN_MODELS)}, "minItems": 1, "uniqueItems": True},
        # Per profile: a list of [t, m] budgets, or "table1" for every budget of Table 1.
        "budgets": {"type": "object", "additionalProperties": {
            "oneOf": [{"const": "table1"}, {"type": "array", "items": _budget_pair, "minItems": 1}]}},
        "methods": {"type": "array", "items": {"enum": list(CONTROL_METHODS)}, "minItems": 1, "uniqueItems": True},
    },
}

NLG_STUDY_METHODS = ("darel", "random", "easy")
_study_nlg = {
    "type": "object",
    "additionalProperties": False,
    "required": ["models", "alphas", "methods"],
    "properties": {
        "models": {"type": "array", "items": {"enum": list(NLG_MODELS)}, "minItems": 1, "uniqueItems": True},
        "alphas": {"type": "array", "items": _fraction, "minItems": 1, "uniqueItems": True},
        "methods": {"type": "array", "items": {"enum": list(NLG_STUDY_METHODS)}, "minItems": 1, "uniqueItems": True},
    },
}

SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["profile", "seed", "tracking", "carbon", "darel", "budget", "protocols", "datasets", "profiles",
                 "table1"],
    "additionalProperties": False,
    "properties": {
        "profile": {"type": "string"},
        "seed": _nonneg_int,
        "tracking": {
            "type": "object",
            "required": ["uri"],
            "additionalProperties": False,
            "properties": {"uri": {"type": "string"}},  # its grammar: darel.grammar.check_tracking_uri
        },
        "carbon": {
            "type": "object",
            "required": ["country_iso_code", "pue", "measure_power_secs"],
            "additionalProperties": False,
            "properties": {
                "country_iso_code": {"type": "string"},  # three capital letters, checked in validate
                "pue": {"type": "number", "minimum": 1},
                "measure_power_secs": _pos_num,
            },
        },
        "darel": {
            "type": "object",
            "additionalProperties": False,
            "required": ["mode", "alpha_default", "A_min", "A_max", "history_size", "bins"],
            "properties": {
                "mode": {"enum": ["easy", "hard"]},
                "alpha_default": _fraction,
                "A_min": _fraction,
                "A_max": _fraction,
                "history_size": _pos_int,
                "bins": {"type": "integer", "minimum": 2},
            },
        },
        "budget": {
            "type": "object",
            "additionalProperties": False,
            "required": ["enforce", "schedule", "probe_warmup", "probe_repeats", "probe_rounds"],
            "properties": {
                "enforce": {"enum": ["plan", "wallclock"]},
                "schedule": {"enum": ["keep", "rescale"]},
                "probe_warmup": _nonneg_int,
                "probe_repeats": _pos_int,
                "probe_rounds": _pos_int,
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
                "required": ["dataset", "device", "threads", "precision", "compile", "eval_batch", "eval_every",
                             "checkpoint_every", "seeds", "models"],
                "properties": {
                    "seeds": {"type": "array", "items": _nonneg_int, "minItems": 1, "uniqueItems": True},
                    "dataset": {"enum": list(KNOWN_DATASETS)},
                    "device": {"enum": ["cpu", "cuda", "auto"]},
                    "threads": _pos_int,
                    "precision": {"enum": ["fp32", "fp16", "bf16", "auto"]},
                    # true: torch.compile the training step and the scoring forward; graphs: the same,
                    # with the step's forward and backward replayed as CUDA graphs on a GPU (darel.step)
                    "compile": {"enum": [True, False, "graphs"]},
                    "eval_batch": _pos_int,
                    "eval_every": _pos_int,
                    "checkpoint_every": _pos_int,
                    "nlg": _profile_nlg_schema,
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
        "nlg": {
            "type": "object",
            "additionalProperties": False,
            "required": ["finetune", "lora", "decoding", "scorer", "datasets"],
            "properties": {
                "finetune": {"type": "object", "additionalProperties": False, "required": list(_finetune_props),
                             "properties": _finetune_props},
                "lora": {"type": "object", "additionalProperties": False, "required": ["r", "alpha", "dropout"],
                         "properties": {"r": _pos_int, "alpha": _pos_num,
                                        "dropout": {"type": "number", "minimum": 0, "maximum": 1}}},
                "decoding": {"type": "object", "additionalProperties": False, "required": list(_decoding_props),
                             "properties": _decoding_props},
                "scorer": {"enum": list(NLG_MODELS)},
                "datasets": {"type": "object", "propertyNames": {"enum": list(NLG_DATASETS)}},
            },
        },
        "table2": _nlg_table,
        "table3": _nlg_table,
        "study": {
            "type": "object",
            "additionalProperties": False,
            "required": ["seeds", "table1"],
            "properties": {
                "seeds": {"type": "array", "items": _nonneg_int, "minItems": 1, "uniqueItems": True},
                # matched: every method's schedule scaled to its own planned run (ends fully decayed);
                # paper: the protocol's milestones cut at the planned epochs (the paper's Table 1)
                "schedule": {"enum": ["matched", "paper"]},
                # equivalence margins of the verdicts, per metric (DAREL minus a control)
                "margin": {"type": "object", "additionalProperties": False,
                           "properties": {"top1": _pos_num, "BLEU": _pos_num}},
                "level": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},  # family-wise error
                "table1": _study_table1,
                "table2": _study_nlg,
                "table3": _study_nlg,
            },
        },
        "controls": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "short_schedule": {"type": "object", "additionalProperties": False,
                                   "properties": {"schedule": {"enum": ["linear", "milestones"]}}},
                "infobatch": {"type": "object", "additionalProperties": False,
                              "properties": {"anneal_fraction": {"type": "number", "minimum": 0, "exclusiveMaximum": 1},
                                             "r_max": {"type": "number", "minimum": 0, "exclusiveMaximum": 1},
                                             "below_fraction_plan": _fraction}},
                "selective_backprop": {"type": "object", "additionalProperties": False,
                                       "properties": {"beta": {"type": "number", "minimum": 0},
                                                      "history_size": _pos_int}},
                "rs2": {"type": "object", "additionalProperties": False,
                        "properties": {"ratio": {"oneOf": [{"const": "auto"}, _fraction]}}},
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


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 5] + " ...]"


def _explain(err: jsonschema.ValidationError) -> str:
    """One line naming the key, the value and the rule broken (never the whole config)."""
    where = _where(err.absolute_path)
    if err.validator == "required":
        missing = [key for key in err.validator_value if key not in err.instance]
        return f"params: {where}: missing key {missing[0]!r} (required: {', '.join(err.validator_value)})"
    if err.validator == "additionalProperties" and isinstance(err.instance, dict):
        allowed = sorted(err.schema.get("properties", {}))
        unknown = [key for key in err.instance if key not in allowed]
        return (f"params: {where}: unknown key {unknown[0]!r}"
                + (f" (allowed: {', '.join(allowed)})" if allowed else ""))
    if err.validator == "propertyNames":
        return f"params: {where}: key {err.instance!r} is not allowed here (must be one of {err.validator_value.get('enum')})"
    rule = err.message if len(err.message) <= 160 else err.message[:155] + " ..."
    if "propertyNames" in err.schema_path:  # a key of a mapping, not a value
        return f"params: {where}: unknown name {err.instance!r} (known: {', '.join(map(str, err.validator_value))})"
    if err.validator in ("enum", "const"):
        rule = f"must be one of {err.validator_value}" if err.validator == "enum" else f"must be {err.validator_value!r}"
    elif err.validator in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        words = {"minimum": ">=", "maximum": "<=", "exclusiveMinimum": ">", "exclusiveMaximum": "<"}
        rule = f"must be {words[err.validator]} {err.validator_value}"
    elif err.validator == "type":
        rule = f"must be of type {err.validator_value}"
    return f"params: {where} = {_short(err.instance)}: {rule}"


def check_grammar(cfg: dict) -> None:
    """Every value that reaches a path or a shell command against its pattern
    (darel.grammar): profile names, the tracking URI, hub names and revisions."""
    try:
        grammar.check_name(cfg["profile"], "params: profile")
        for name, prof in cfg["profiles"].items():
            grammar.check_name(name, f"params: profiles.{ascii(name)[1:-1]} (a profile name)")
            for model, spec in prof.get("nlg", {}).get("models", {}).items():
                if "hub" in spec:
                    grammar.check_pattern(spec["hub"], grammar.HUB_NAME, f"params: profiles.{name}.nlg.models.{model}.hub",
                                          "hub model name (name or org/name)")
                if "revision" in spec:
                    grammar.check_pattern(spec["revision"], grammar.REVISION,
                                          f"params: profiles.{name}.nlg.models.{model}.revision", "hub revision")
        for name in cfg.get("study", {}).get("table1", {}).get("budgets", {}):
            grammar.check_name(name, f"params: study.table1.budgets.{ascii(name)[1:-1]} (a profile name)")
        grammar.check_tracking_uri(cfg["tracking"]["uri"], "params: tracking.uri")
    except grammar.GrammarError as err:
        raise ConfigError(str(err)) from None
    code = cfg["carbon"]["country_iso_code"]
    if not grammar.matches(r"[A-Z]{3}", code):
        raise ConfigError(f"params: carbon.country_iso_code = {ascii(code)}: must be three capital letters (ISO 3166 "
                          "alpha-3, e.g. USA)")


def validate(cfg: dict) -> dict:
    """Raise ConfigError naming the first bad value; return cfg unchanged when valid."""
    errors = sorted(jsonschema.Draft202012Validator(SCHEMA).iter_errors(cfg), key=lambda e: list(e.absolute_path))
    if errors:
        raise ConfigError(_explain(errors[0]))
    check_grammar(cfg)
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
            if proto["scorer"] not in cfg["protocols"]:
                raise ConfigError(f"params: protocols.{model}.scorer = {proto['scorer']!r} has no protocol")
            if proto["warmup_epochs"] > proto["epochs"]:
                raise ConfigError(f"params: profiles.{name} model {model}: warmup_epochs = "
                                  f"{proto['warmup_epochs']} exceeds epochs = {proto['epochs']}")
            late = [m for m in proto["milestones"] if m >= proto["epochs"]]
            if late:
                raise ConfigError(f"params: profiles.{name}.models.{model}: milestones {late} are not below epochs "
                                  f"= {proto['epochs']}; set milestones with the epochs, e.g. "
                                  f"{{epochs: {proto['epochs']}, milestones: "
                                  f"{[max(1, round(proto['epochs'] * f)) for f in (0.3, 0.6, 0.8)]}}}")
    ids_cfg = cfg.get("comparisons", {}).get(IDS_ADONIS)
    if ids_cfg and ids_cfg["model"] not in cfg["table1"]:
        raise ConfigError(f"params: comparisons.{IDS_ADONIS}.model = {ids_cfg['model']!r} has no table1 entry "
                          "(its baseline is the scorer)")
    for name, prof in cfg["profiles"].items() if "nlg" in cfg else ():
        finetune = {**cfg["nlg"]["finetune"], **prof.get("nlg", {}).get("finetune", {})}
        if finetune["batch"] % finetune["processes"]:
            raise ConfigError(f"params: profiles.{name} nlg finetune: batch = {finetune['batch']} does not split "
                              f"over processes = {finetune['processes']} (it is the global batch)")
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


def read_yaml(path: str | Path) -> dict:
    """params.yaml as a dict; a syntax error names the line and column."""
    try:
        with open(path, encoding="utf-8") as handle:
            cfg = yaml.safe_load(handle)
    except yaml.MarkedYAMLError as err:
        def at(mark) -> str:
            return f"line {mark.line + 1}, column {mark.column + 1}"

        text = f"{err.problem} at {at(err.problem_mark)}" if err.problem_mark is not None else str(err.problem)
        if err.context and err.context_mark is not None:
            text = f"{err.context} started at {at(err.context_mark)}: {text}"
        raise ConfigError(f"{path}: YAML syntax error: {text}") from None
    except OSError as err:
        raise ConfigError(f"{path}: cannot read it ({err.strerror})") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{path}: expected a mapping of keys at the top level")
    return cfg


def load_params(path: str | Path = "params.yaml", overrides: dict | None = None) -> dict:
    return validate(merge(read_yaml(path), overrides or {}))


def params_file(cli_config: dict, default: str = "params.yaml") -> str:
    """The parameter file a workflow run reads: ``--config params_file=...`` or params.yaml;
    a YAML file inside the project (relative, no '..')."""
    path = cli_config.get("params_file", default)
    parts = str(path).split("/")
    if (not isinstance(path, str) or not path.endswith((".yaml", ".yml")) or path.startswith("/")
            or any(part in ("", "..") for part in parts) or not grammar.matches(r"[A-Za-z0-9_./-]+", path)):
        raise ConfigError(f"params_file = {ascii(path)}: a .yaml file inside the project, given relative to it "
                          "(e.g. .test/params.yaml)")
    return path


def workflow_config(path: str | Path, cli_overrides: dict) -> dict:
    """The workflow's parameters: params.yaml with Snakemake's --config overrides merged
    on top (their scalars coerced back from strings), validated."""
    return validate(merge(read_yaml(path), coerce_cli_scalars(cli_overrides)))
