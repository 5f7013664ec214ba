"""The schema of params.yaml and its loading: every value validated, with one line
naming the key, the value and the rule it breaks, before any stage runs."""

from __future__ import annotations

import copy
import errno
import math
import os
import re
import stat
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from darel import grammar, methods
from darel.bounds import (MAX_BATCH, MAX_EPOCHS, MAX_IMAGE_SIDE, MAX_LIST, MAX_PROBES,
                          MAX_SEED, MAX_STEPS, MAX_TEXT, MAX_THREADS, MAX_URI, MAX_WIDTH)
from darel.bounds import int_range as _int
from darel.bounds import num_range as _num
from darel.config.cells import cell_id
from darel.config.errors import ConfigError
from darel.config.memory import check_memory
from darel.config.slices import model_protocol
from darel.grammar import IDS_ADONIS
from darel.plans import LR_RULES
from darel.synth import NUISANCE_KEYS

KNOWN_MODELS = ("resnet18", "resnet18_hc")
KNOWN_ALGEBRAS = ("complex", "dual", "double")
KNOWN_DATASETS = ("cifar100", "digits", "synth")
NLG_DATASETS = ("e2e", "webnlg")
NLG_MODELS = ("gpt2-small", "gpt2-medium", "gpt2-large")
NLG_TABLES = ("table2", "table3")  # the tables of language cells (each names its data set: table2.dataset)

# Every value has a finite range (darel.bounds); NaN and infinities are refused before the
# schema sees them (check_shape).
_fraction = {"type": "number", "exclusiveMinimum": 0, "maximum": 1}
_pos_int = _int(1, MAX_STEPS)
_nonneg_int = _int(0, MAX_STEPS)
_epochs = _int(1, MAX_EPOCHS)
_batch = _int(1, MAX_BATCH)
_lr = _num(0, 10, exclusive_low=True)
_seeds = {"type": "array", "items": _int(0, MAX_SEED), "minItems": 1, "maxItems": MAX_LIST, "uniqueItems": True}


def _names_from(choices) -> dict:
    """A non-empty list of distinct names, each one of ``choices`` (a study's models or methods)."""
    return {"type": "array", "items": {"enum": list(choices)}, "minItems": 1, "uniqueItems": True}

# A budget's t and m: cell ids carry two decimals (t0.50_m0.55), so 0.01 is the smallest step.
_budget_fraction = {"type": "number", "minimum": 0.01, "maximum": 1}

_protocol_props = {
    "optimizer": {"enum": ["sgd"]},
    "lr": _lr,
    "momentum": {"type": "number", "minimum": 0, "maximum": 1},
    "weight_decay": _num(0, 1),
    "schedule": {"enum": ["multistep", "cosine"]},
    "milestones": {"type": "array", "items": _epochs, "maxItems": MAX_LIST},
    "lr_gamma": _fraction,
    "epochs": _epochs,
    "batch": _batch,
    "warmup_epochs": _int(0, MAX_EPOCHS),
    "width": _int(1, MAX_WIDTH),
    "input_size": _int(8, MAX_IMAGE_SIDE),
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
        "pad": _int(0, 64),
        "hflip": {"type": "boolean"},
        "rotation_deg": {"type": "number", "minimum": 0, "maximum": 180},
    },
}

_share = {"type": "number", "minimum": 0, "exclusiveMaximum": 1}
_synth_size = {
    "type": "object",
    "additionalProperties": False,
    "required": ["num_classes", "n_train", "n_test", "image_size", "classes_per_group"],
    "properties": {
        "num_classes": _int(2, 100_000),
        "n_train": _int(1, 1_000_000),   # 1e6 x 32x32x3 bytes: 3 GB in memory
        "n_test": _int(1, 1_000_000),
        "image_size": _int(8, 256),
        "classes_per_group": _int(1, 100_000),   # classes sharing a colour field and one pattern (confusable)
    },
}
_NUISANCE_KEYS = NUISANCE_KEYS
# The generated benchmark (darel.synth, docs/data_card_synth.md): shares of the training
# set, the per-sample nuisance, and named sizes a profile picks with dataset_size.
_synth = {
    "type": "object",
    "additionalProperties": False,
    "required": ["augment", "label_noise", "near_duplicate", "hard", "rare_classes", "rare_size", "own_atoms",
                 "colour_spread", "frequency", "envelope", "nuisance", "sizes"],
    "properties": {
        "augment": _augment,
        "label_noise": _share,
        "near_duplicate": _share,
        "hard": _share,
        "rare_classes": _share,
        "rare_size": _fraction,
        "own_atoms": _int(1, 64),
        "colour_spread": _num(0, 100),
        "frequency": {"type": "array", "prefixItems": [_num(0, 100, exclusive_low=True), _num(0, 100, exclusive_low=True)], "minItems": 2, "maxItems": 2},
        "envelope": {"type": "array", "prefixItems": [_num(0, 100, exclusive_low=True), _num(0, 100, exclusive_low=True)], "minItems": 2, "maxItems": 2},
        "nuisance": {"type": "object", "additionalProperties": False, "required": list(_NUISANCE_KEYS),
                     "properties": {**{key: _num(0, 100) for key in _NUISANCE_KEYS},
                                    "log_scale": {"type": "number", "minimum": 0, "maximum": 1},
                                    "contrast": {"type": "number", "minimum": 0, "exclusiveMaximum": 1},
                                    "clutter_atoms": _int(0, 64)}},
        "sizes": {"type": "object", "minProperties": 1, "maxProperties": MAX_LIST, "additionalProperties": _synth_size},
    },
}

_finetune_props = {
    "lr": _lr,
    "betas": {"type": "array", "items": {"type": "number", "minimum": 0, "exclusiveMaximum": 1},
              "minItems": 2, "maxItems": 2},
    "weight_decay": _num(0, 1),
    "warmup_steps": _nonneg_int,
    "label_smoothing": {"type": "number", "minimum": 0, "exclusiveMaximum": 1},
    "epochs": _epochs,
    "batch": _batch,
    # auto: the longest encoded training pair (quick profile; darel.nlg.lm.derive_lengths)
    "max_length": {"oneOf": [_int(16, 65536), {"const": "auto"}]},
    "processes": _int(1, 64),
    "nodes": _int(1, 1024),
}
_decoding_props = {
    "num_beams": _int(1, 64),
    "length_penalty": _num(-10, 10),
    "no_repeat_ngram_size": _int(0, 100),
    "max_new_tokens": _int(1, 4096),
}
_nlg_table = {
    "type": "object",
    "additionalProperties": False,
    "required": ["dataset", "models", "alphas"],
    "properties": {
        "dataset": {"enum": list(NLG_DATASETS)},
        "models": {"type": "array", "items": {"enum": list(NLG_MODELS)}, "uniqueItems": True},
        "alphas": {"type": "array", "items": _fraction, "maxItems": MAX_LIST, "uniqueItems": True},
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
                      "properties": {"vocab_size": {"oneOf": [_int(300, 1_000_000), {"const": "auto"}]},
                                     "min_frequency": _pos_int}},
        "pretrain": {"type": "object", "additionalProperties": False,
                     "properties": {"epochs": _epochs, "batch": _batch, "lr": _lr}},
        "models": {
            "type": "object",
            "propertyNames": {"enum": list(NLG_MODELS)},
            "additionalProperties": {
                "type": "object", "additionalProperties": False,
                "properties": {"hub": {"type": "string", "maxLength": MAX_TEXT},
                               "revision": {"type": "string", "minLength": 1, "maxLength": MAX_TEXT},
                               "n_embd": _int(1, 65536), "n_layer": _int(1, 256), "n_head": _int(1, 256),
                               "n_positions": _int(16, 65536)},
            },
        },
        "finetune": {"type": "object", "additionalProperties": False, "properties": _finetune_props},
        "decoding": {"type": "object", "additionalProperties": False, "properties": _decoding_props},
        # fine-tuning, scoring and decoding precision (darel.step): fp16 = autocast + GradScaler (the
        # paper's), bf16, auto = bf16 where the GPU supports it; absent: the profile's precision
        "precision": {"enum": ["fp32", "fp16", "bf16", "auto"]},
    },
}

_budget_pair = {"type": "array", "prefixItems": [_budget_fraction, _budget_fraction], "minItems": 2, "maxItems": 2}
# The one pre-declared analysis of a study (docs/studies.md, "The primary analysis"): its
# comparisons (DAREL minus each listed method, at each listed budget or alpha, in one
# metric) form the only family the headline rests on (Holm over it alone).
_ACCOUNTINGS = ["time_s", "time_total_s"]
_primary_common = {
    "accounting": {"enum": _ACCOUNTINGS},  # the time figure reported beside the primary comparisons
    "margin": _num(0, 100, exclusive_low=True),                    # the smallest difference that matters: equivalence and power
}
_primary_table1 = {
    "type": "object",
    "additionalProperties": False,
    "required": ["schedule", "metric", "accounting", "budgets", "methods", "margin"],
    "properties": {
        **_primary_common,
        "schedule": {"enum": ["matched", "paper"]},  # the rule it was declared under; another run is exploratory
        "metric": {"enum": ["top1"] + _ACCOUNTINGS},
        "budgets": {"oneOf": [{"const": "all"}, {"type": "array", "items": _budget_pair, "minItems": 1,
                                                      "maxItems": MAX_LIST}]},
        "methods": _names_from(m for m in methods.names(study=True) if m != "darel"),
    },
}
_primary_nlg = {
    "type": "object",
    "additionalProperties": False,
    "required": ["metric", "accounting", "alphas", "methods", "margin"],
    "properties": {
        **_primary_common,
        "metric": {"enum": ["BLEU"] + _ACCOUNTINGS},
        "alphas": {"oneOf": [{"const": "all"}, {"type": "array", "items": _fraction, "minItems": 1}]},
        "methods": _names_from(["random", "easy"]),
    },
}


def _study(primary: dict, models, grid: tuple[str, dict], study_methods, **more: dict) -> dict:
    """A study's section: its primary analysis, its models, its ``grid`` (the name and
    schema of what it varies: Table 1's budgets or the language tables' alphas), its
    methods, then what else its kind declares (``more``). The models, the grid and the
    methods are required; the primary analysis and ``more`` are optional."""
    name, schema = grid
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["models", name, "methods"],
        "properties": {"primary": primary, "models": _names_from(models), name: schema,
                       "methods": _names_from(study_methods), **more},
    }


_study_table1 = _study(
    _primary_table1, KNOWN_MODELS,
    # Per profile: a list of [t, m] budgets, or "table1" for every budget of Table 1.
    ("budgets", {"type": "object", "maxProperties": MAX_LIST, "additionalProperties": {
        "oneOf": [{"const": "table1"}, {"type": "array", "items": _budget_pair, "minItems": 1,
                                        "maxItems": MAX_LIST}]}}),
    methods.names(study=True),
    # The study's own controls (darel.study.validation_checks): DAREL against a method that must
    # not differ from it, and [oracle, partner]: a pair whose difference is known to be there.
    # Optional each: a null --config override removes one (merge), naming the control in the way.
    validation={"type": "object", "additionalProperties": False, "properties": {
        "negative": {"enum": list(methods.names(study=True))},
        "positive": {"type": "array", "items": {"enum": list(methods.names(study=True))}, "minItems": 2,
                     "maxItems": 2, "uniqueItems": True},
        # the budgets whose positive-control test judges the study (one Holm family over them); the
        # oracle still trains at every study budget, reported beside them, not judged
        "positive_budgets": {"oneOf": [{"const": "all"}, {"type": "array", "items": _budget_pair, "minItems": 1,
                                                               "maxItems": MAX_LIST}]}}},
    # Per profile: the fitting regime a study declares (docs/studies/fit_regime_declaration.md): the
    # baselines' training top-1 on the whole training set and their test curve's last quarter are
    # measured and checked against it in the verdict file.
    fit_check={"type": "object", "maxProperties": MAX_LIST, "additionalProperties": {
        "type": "object", "additionalProperties": False, "required": ["train_top1_min", "rise_max_pp"],
        "properties": {"train_top1_min": _num(0, 100), "rise_max_pp": _num(0, 100)}}},
)

NLG_STUDY_METHODS = ("darel", "random", "easy")
_study_nlg = _study(
    _primary_nlg, NLG_MODELS,
    ("alphas", {"type": "array", "items": _fraction, "minItems": 1, "maxItems": MAX_LIST, "uniqueItems": True}),
    NLG_STUDY_METHODS,
)

# Table 1's budgets of one profile: per model, [t, m] pairs.
_table1_budgets = {
    "type": "object",
    "propertyNames": {"enum": list(KNOWN_MODELS)},
    "additionalProperties": {"type": "array", "items": _budget_pair, "maxItems": MAX_LIST},
}

SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["profile", "seed", "tracking", "carbon", "darel", "budget", "protocols", "datasets", "profiles"],
    "additionalProperties": False,
    "properties": {
        "profile": {"type": "string", "maxLength": grammar.NAME_MAX},
        "seed": _int(0, MAX_SEED),
        "tracking": {
            "type": "object",
            "required": ["uri"],
            "additionalProperties": False,
            "properties": {"uri": {"type": "string", "maxLength": MAX_URI}},  # grammar: check_tracking_uri
        },
        "carbon": {
            "type": "object",
            "required": ["country_iso_code", "pue", "measure_power_secs"],
            "additionalProperties": False,
            "properties": {
                "country_iso_code": {"type": "string", "maxLength": 3},  # three capital letters, checked in validate
                "pue": _num(1, 10),
                "measure_power_secs": _num(0, 3600, exclusive_low=True),
            },
        },
        "budget": {
            "type": "object",
            "additionalProperties": False,
            "required": ["enforce", "schedule", "lr_rule", "probe_warmup", "probe_repeats", "probe_rounds"],
            "properties": {
                "enforce": {"enum": ["plan", "wallclock"]},
                "schedule": {"enum": ["keep", "rescale"]},
                "lr_rule": {"enum": list(LR_RULES)},  # darel.plans.batch_lr
                "probe_warmup": _int(0, MAX_PROBES),
                "probe_repeats": _int(1, MAX_PROBES),
                "probe_rounds": _int(1, 100),
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
            "properties": {"synth": _synth},
            "additionalProperties": {
                "type": "object",
                "additionalProperties": False,
                "required": ["augment"],
                "properties": {
                    "augment": _augment,
                    "image_size": _int(8, MAX_IMAGE_SIDE),
                    "test_fraction": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
                },
            },
        },
        "profiles": {
            "type": "object",
            "minProperties": 1,
            "maxProperties": MAX_LIST,
            "additionalProperties": {
                "type": "object",
                "additionalProperties": False,
                "required": ["dataset", "device", "threads", "precision", "compile", "eval_batch", "eval_every",
                             "checkpoint_every", "seeds", "models", "table1"],
                "properties": {
                    "table1": _table1_budgets,
                    "seeds": _seeds,
                    "dataset": {"enum": list(KNOWN_DATASETS)},
                    "dataset_size": {"type": "string"},  # synth only: a key of datasets.synth.sizes
                    "device": {"enum": ["cpu", "cuda", "auto"]},
                    "threads": _int(1, MAX_THREADS),
                    "precision": {"enum": ["fp32", "fp16", "bf16", "auto"]},
                    # true: torch.compile the training step and the scoring forward; graphs: the same,
                    # with the step's forward and backward replayed as CUDA graphs on a GPU (darel.step)
                    "compile": {"enum": [True, False, "graphs"]},
                    "eval_batch": _batch,
                    "eval_every": _epochs,
                    # the per-epoch test curve on the test split's first this many images (absent:
                    # all); the evaluation stage's top-1 always uses the whole split
                    "curve_test": _int(1, 10_000_000),
                    "checkpoint_every": _epochs,
                    # cuda profiles on one local GPU: the next GPU job starts while one trains and
                    # waits for its turn on the device (darel.devicelock); changes no result
                    "device_turns": {"type": "boolean"},
                    # cuda: cuDNN times candidate convolution algorithms on each new shape
                    # (torch.backends.cudnn.benchmark); absent: on
                    "cudnn_benchmark": {"type": "boolean"},
                    # cpu, on one machine: a training that follows a fixed plan (budget.enforce: plan)
                    # takes the profile's threads instead of every core, so two run at once;
                    # baselines and calibrations still run alone. Changes no trained model.
                    "planned_side_by_side": {"type": "boolean"},
                    # false: no live MLflow run inside the trainings (its start costs about 2 s a
                    # job); each cell's tracking job writes the run, curves included, from its
                    # sealed train.json. Absent: true. Changes no trained model and no record.
                    "live_tracking": {"type": "boolean"},
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
        "nlg": {
            "type": "object",
            "additionalProperties": False,
            "required": ["finetune", "lora", "decoding", "scorer", "datasets"],
            "properties": {
                "finetune": {"type": "object", "additionalProperties": False, "required": list(_finetune_props),
                             "properties": _finetune_props},
                "lora": {"type": "object", "additionalProperties": False, "required": ["r", "alpha", "dropout"],
                         "properties": {"r": _int(1, 4096), "alpha": _num(0, 10_000, exclusive_low=True),
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
                "seeds": _seeds,
                # matched: every method's schedule scaled to its own planned run (ends fully decayed);
                # paper: the protocol's milestones cut at the planned epochs (the paper's Table 1)
                "schedule": {"enum": ["matched", "paper"]},
                # equivalence margins of the verdicts, per metric (DAREL minus a control)
                "margin": {"type": "object", "additionalProperties": False,
                           "properties": {"top1": _num(0, 100, exclusive_low=True),
                                          "BLEU": _num(0, 100, exclusive_low=True)}},
                "level": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},  # family-wise error
                # power at which every comparison states its minimum detectable difference
                "power": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
                "table1": _study_table1,
                "table2": _study_nlg,
                "table3": _study_nlg,
            },
        },
    },
}



def _place_method_settings(schema: dict) -> None:
    """Every method's settings (darel.methods: ``settings_path``, ``settings_schema``) where
    they live in params.yaml, each key required: params.yaml holds every value."""
    for method in methods.all_methods():
        if method.settings_path is None:
            continue
        *parents, key = method.settings_path
        here = schema
        for parent in parents:
            here = here["properties"].setdefault(parent, {"type": "object", "additionalProperties": False,
                                                          "properties": {}})
        here["properties"][key] = {"type": "object", "additionalProperties": False,
                                   "required": list(method.settings_schema), "properties": method.settings_schema}


_place_method_settings(SCHEMA)

def _where(path: Any) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"


def merge(base: dict, override: dict) -> dict:
    """Recursive merge, the same rule Snakemake applies to --config overrides, except that
    a null override removes its key: an optional setting (a study's control, its primary
    analysis) can then be dropped with --config alone, and a required one is named as missing."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _short(value: Any, limit: int = 80) -> str:
    return grammar.shown(value, limit)


def _explain(err: jsonschema.ValidationError) -> str:
    """One line naming the key, the value and the rule broken (never the whole config)."""
    where = _where(err.absolute_path)
    if err.validator == "required":
        missing = [key for key in err.validator_value if key not in err.instance]
        return f"params: {where}: missing key {missing[0]!r} (required: {', '.join(err.validator_value)})"
    if err.validator == "additionalProperties" and isinstance(err.instance, dict):
        allowed = sorted(err.schema.get("properties", {}))
        unknown = [key for key in err.instance if key not in allowed]
        return (f"params: {where}: unknown key {_short(unknown[0])}"
                + (f" (allowed: {', '.join(allowed)})" if allowed else ""))
    if err.validator == "propertyNames":
        return f"params: {where}: key {_short(err.instance)} is not allowed here (must be one of {err.validator_value.get('enum')})"
    rule = err.message if len(err.message) <= 160 else err.message[:155] + " ..."
    if "propertyNames" in err.schema_path:  # a key of a mapping, not a value
        return f"params: {where}: unknown name {_short(err.instance)} (known: {', '.join(map(str, err.validator_value))})"
    if err.validator in ("enum", "const"):
        rule = f"must be one of {err.validator_value}" if err.validator == "enum" else f"must be {err.validator_value!r}"
    elif err.validator in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        words = {"minimum": ">=", "maximum": "<=", "exclusiveMinimum": ">", "exclusiveMaximum": "<"}
        rule = f"must be {words[err.validator]} {err.validator_value}"
    elif err.validator == "type":
        rule = f"must be of type {err.validator_value}"
    elif err.validator in ("maxItems", "maxProperties", "maxLength"):
        rule = f"at most {err.validator_value} {'characters' if err.validator == 'maxLength' else 'entries'}"
    return f"params: {where} = {_short(err.instance)}: {rule}"


def check_grammar(cfg: dict, root: str | Path = ".") -> None:
    """Every value that reaches a path or a shell command against its pattern
    (darel.grammar): profile names, the tracking URI, hub names and revisions; a SQLite
    store's file must not lead out of the project folder ``root`` (the working folder,
    where Snakemake and DVC run the jobs) through a link."""
    try:
        grammar.check_name(cfg["profile"], "params: profile")
        for name, prof in cfg["profiles"].items():
            grammar.check_name(name, f"params: profiles.{grammar.shown(name)[1:-1]} (a profile name)")
            for model, spec in prof.get("nlg", {}).get("models", {}).items():
                if "hub" in spec:
                    grammar.check_pattern(spec["hub"], grammar.HUB_NAME, f"params: profiles.{name}.nlg.models.{model}.hub",
                                          "hub model name (name or org/name)")
                if "revision" in spec:
                    grammar.check_pattern(spec["revision"], grammar.REVISION,
                                          f"params: profiles.{name}.nlg.models.{model}.revision", "hub revision")
        for name in cfg.get("study", {}).get("table1", {}).get("budgets", {}):
            grammar.check_name(name, f"params: study.table1.budgets.{grammar.shown(name)[1:-1]} (a profile name)")
        grammar.check_tracking_uri(cfg["tracking"]["uri"], "params: tracking.uri")
        grammar.check_store_inside(cfg["tracking"]["uri"], root, "params: tracking.uri")
    except grammar.GrammarError as err:
        raise ConfigError(str(err)) from None
    code = cfg["carbon"]["country_iso_code"]
    if not grammar.matches(r"[A-Z]{3}", code):
        raise ConfigError(f"params: carbon.country_iso_code = {grammar.shown(code)}: must be three capital letters (ISO 3166 "
                          "alpha-3, e.g. USA)")


REFUSAL_MAX = 240  # characters of a refusal line, however long the value it names


def one_line(text: str, limit: int = REFUSAL_MAX) -> str:
    """A refusal as one line of at most ``limit`` characters."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 5] + " ..."


def _check_dataset_size(cfg: dict, name: str, prof: dict) -> None:
    """A generated data set names its size; the others have none."""
    size = prof.get("dataset_size")
    if prof["dataset"] != "synth":
        if size is not None:
            raise ConfigError(f"params: profiles.{name}.dataset_size = {size!r}: only the generated data set (synth) "
                              f"has sizes; {prof['dataset']} has one")
        return
    sizes = cfg["datasets"]["synth"]["sizes"]
    if size not in sizes:
        raise ConfigError(f"params: profiles.{name}.dataset_size = {size!r}: must name one of datasets.synth.sizes "
                          f"({', '.join(sizes)})")
    synth = cfg["datasets"]["synth"]
    shares = synth["label_noise"] + synth["near_duplicate"] + synth["hard"]
    if shares >= 1:
        raise ConfigError(f"params: datasets.synth: label_noise + near_duplicate + hard = {shares:g} leaves no clean "
                          "sample (their sum must be below 1)")
    spec = sizes[size]
    if spec["n_test"] < spec["num_classes"] or spec["n_train"] < 4 * spec["num_classes"]:
        raise ConfigError(f"params: datasets.synth.sizes.{size}: {spec['n_train']} train / {spec['n_test']} test "
                          f"samples are too few for {spec['num_classes']} classes (at least 4 train and 1 test per "
                          "class)")


def _check_validation(cfg: dict) -> None:
    """The study's own controls are methods it trains (one that draws its training set from
    the data's recorded categories is left out on data that records none: cells.study_methods)."""
    section = cfg.get("study", {}).get("table1") or {}
    validation, where = section.get("validation") or {}, "params: study.table1.validation"
    named = [("negative", m) for m in [validation.get("negative")] if m] + [
        ("positive", m) for m in validation.get("positive") or []]
    missing = [(control, m) for control, m in named if m not in section.get("methods", [])]
    if missing:
        control, method = missing[0]
        drop = f"{control}: null" + (", positive_budgets: null" if control == "positive" and "positive_budgets"
                                     in validation else "")
        raise ConfigError(f"{where}.{control} names {method!r}, which is not among study.table1.methods: train it or "
                          f"drop the control (--config 'study={{table1: {{validation: {{{drop}}}}}}}'); "
                          f"methods: {section.get('methods')}")
    if validation.get("positive_budgets", "all") != "all" and not validation.get("positive"):
        raise ConfigError(f"{where}.positive_budgets: no positive control is declared to judge at them (to drop "
                          "the positive control with --config, drop them too: positive: null, positive_budgets: null)")
    if validation.get("negative") == "darel":
        raise ConfigError(f"{where}.negative: darel compared with itself is no control; name a method such as "
                          "darel-restream")


def _check_primary(cfg: dict) -> None:
    """A study's primary analysis names only methods it trains, and budgets (alphas) it runs
    under the active profile."""
    from darel.config.cells import study_budgets

    for table, section in cfg.get("study", {}).items():
        if not isinstance(section, dict) or "primary" not in section:
            continue
        primary, where = section["primary"], f"params: study.{table}.primary"
        missing = [m for m in primary["methods"] if m not in section["methods"]]
        if missing:
            raise ConfigError(f"{where}.methods: {missing} not among study.{table}.methods {section['methods']}")
        if "darel" not in section["methods"]:
            raise ConfigError(f"{where}: study.{table}.methods lacks darel, the method every comparison is about")
        if table == "table1" and primary["budgets"] != "all":
            for model in section["models"]:
                run = {cell_id(t, m) for t, m in study_budgets(cfg, model)}
                absent = [[t, m] for t, m in primary["budgets"] if cell_id(t, m) not in run]
                if absent:
                    raise ConfigError(f"{where}.budgets: {absent} are not budgets the study runs for {model} under "
                                      f"the {cfg['profile']} profile (study.table1.budgets.{cfg['profile']})")
        if table != "table1" and primary["alphas"] != "all":
            absent = [a for a in primary["alphas"] if a not in section["alphas"]]
            if absent:
                raise ConfigError(f"{where}.alphas: {absent} not among study.{table}.alphas {section['alphas']}")


def validate(cfg: dict) -> dict:
    """Raise ConfigError naming the first bad value, in one line of at most about 240
    characters; return cfg unchanged when valid. Checked in order: the shape (depth,
    size, aliases, finite numbers, control characters: check_shape), the schema, the
    grammar of names and of the tracking URI, the rules between values (budgets against
    the epochs they can train), the memory the products of values ask for (darel.config.memory)."""
    try:
        check_shape(cfg)
        return _validate(cfg)
    except ConfigError as err:
        raise ConfigError(one_line(str(err))) from None


def _validate(cfg: dict) -> dict:
    if isinstance(cfg, dict) and "table1" in cfg:
        raise ConfigError("params: table1: Table 1's budgets now belong to each profile: move them to "
                          "profiles.<profile>.table1 (one list per profile, so that changing one profile's budgets "
                          "never changes another's plan)")
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
        _check_dataset_size(cfg, name, prof)
        if prof.get("device_turns") and prof["device"] != "cuda":
            raise ConfigError(f"params: profiles.{name}.device_turns = true needs device: cuda (it is "
                              f"{prof['device']!r}): turns share one GPU between jobs")
        if prof.get("planned_side_by_side"):
            if prof["device"] != "cpu":
                raise ConfigError(f"params: profiles.{name}.planned_side_by_side = true needs device: cpu (it is "
                                  f"{prof['device']!r}): GPU jobs already take turns on the device")
            if cfg["budget"]["enforce"] != "plan":
                raise ConfigError(f"params: profiles.{name}.planned_side_by_side = true needs budget.enforce: plan "
                                  f"(it is {cfg['budget']['enforce']!r}): a run stopped by the clock would train "
                                  "another model when a neighbour slows it")
        for model, budgets in prof["table1"].items():
            if model not in cfg["protocols"]:
                raise ConfigError(f"params: profiles.{name}.table1.{model}: no protocol for model {model!r} under "
                                  "protocols")
            ids = [cell_id(t, m) for t, m in budgets]
            if len(set(ids)) != len(ids):
                raise ConfigError(f"params: profiles.{name}.table1.{model} lists a budget twice: {ids}")
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
    for name in cfg.get("study", {}).get("table1", {}).get("methods", []):
        method = methods.get(name)
        if method.settings_path and not method.settings(cfg) and method.settings_schema:
            raise ConfigError(f"params: study.table1.methods lists {name}, whose settings are missing: set "
                              f"{'.'.join(method.settings_path)} ({', '.join(method.settings_schema)})")
    ids_cfg = cfg.get("comparisons", {}).get(IDS_ADONIS)
    active = cfg["profiles"][cfg["profile"]]["table1"]
    if ids_cfg and ids_cfg["model"] not in active:
        raise ConfigError(f"params: comparisons.{IDS_ADONIS}.model = {ids_cfg['model']!r} has no entry under "
                          f"profiles.{cfg['profile']}.table1 (its baseline is the scorer)")
    for name, prof in cfg["profiles"].items() if "nlg" in cfg else ():
        finetune = {**cfg["nlg"]["finetune"], **prof.get("nlg", {}).get("finetune", {})}
        nodes = finetune.get("nodes", 1)
        if finetune["batch"] % (finetune["processes"] * nodes):
            over = f"processes = {finetune['processes']}" + (f" x nodes = {nodes}" if nodes > 1 else "")
            raise ConfigError(f"params: profiles.{name} nlg finetune: batch = {finetune['batch']} does not split "
                              f"over {over} (it is the global batch)")
    _check_primary(cfg)
    _check_validation(cfg)
    check_budgets_train_an_epoch(cfg)
    check_memory(cfg)
    return cfg


def smallest_t(epochs: int) -> float:
    """The smallest time budget t (two decimals, as cell ids carry it) that holds one epoch
    of the baseline's training: t * T >= T / epochs."""
    return math.ceil(100 / epochs - 1e-9) / 100


def check_budgets_train_an_epoch(cfg: dict) -> None:
    """A budget B(t, m) of the active profile whose time t * T is less than one epoch of
    the baseline (T / epochs, the protocol's epochs under the profile) cannot train one
    epoch worth of the baseline's steps; refused before any job, naming the smallest t
    that could. (The calibration may still plan fewer samples per epoch; this rule is what
    is known before any measurement.)"""
    profile = cfg["profile"]
    study = cfg.get("study", {}).get("table1", {})
    chosen = study.get("budgets", {}).get(profile, [])
    lists = [(f"profiles.{profile}.table1.{model}", model, budgets)
             for model, budgets in cfg["profiles"][profile]["table1"].items()]
    if chosen != "table1" and chosen:
        lists += [(f"study.table1.budgets.{profile}", model, chosen) for model in study.get("models", [])]
    for where, model, budgets in lists:
        if model not in cfg["protocols"]:
            continue
        epochs = int(model_protocol(cfg, model, profile)["epochs"])
        least = smallest_t(epochs)
        for index, (t, m) in enumerate(budgets):
            if float(t) < least - 1e-9:
                raise ConfigError(f"params: {where}[{index}] = [{t}, {m}]: t = {t} is less than one epoch of {model}'s "
                                  f"baseline ({epochs} epochs under profile {profile}: one epoch is 1/{epochs} of T); "
                                  f"the smallest t that trains one epoch is {least:.2f}")


# ---- the shape of a configuration, before the schema sees it -------------------------------------

MAX_DEPTH = 12           # params.yaml nests 6 deep
MAX_NODES = 20_000       # params.yaml holds about 500 values
MAX_STRING = 4096        # longer than any field's own maximum
MAX_INT_BITS = 64        # no parameter exceeds 2**32; far larger ones cannot even be printed
MAX_NUMBER_CHARS = 100   # a number written in params.yaml; Python refuses ints of over 4,300 digits
MAX_PARAMS_BYTES = 1 << 20  # a parameter file (params.yaml is about 30 kB)
# Characters no parameter holds and no terminal should be sent: C0 and C1 controls and DEL.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# What YAML 1.1 lets a stream hold (tab, line ends and the printable planes); anything
# else is refused with its line and column before the parser sees it.
_NOT_YAML = re.compile("[^\t\n\r\x20-\x7e\x85\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def check_shape(obj: Any, source: str = "params") -> None:
    """Refuse, in one line naming the place, a configuration that is too deep, too large
    once its YAML aliases are expanded (a few bytes of aliases nest into billions of
    values), or holds a number that is not finite (.nan, .inf) or a string longer than
    any field allows. Iterative and bounded: a shared value is counted wherever it
    appears, and the walk stops after MAX_NODES values, so a hostile file costs at most
    that many steps (a value that contains itself stops at MAX_DEPTH)."""
    stack: list[tuple[Any, str, int]] = [(obj, "", 1)]
    nodes = 0
    while stack:
        value, path, depth = stack.pop()
        where = f"{source}: {_cut(path) or '(top level)'}"
        nodes += 1
        if nodes > MAX_NODES:
            raise ConfigError(f"{source}: more than {MAX_NODES:,} values once its aliases (*name) are expanded (a "
                              "parameter file holds about 500)")
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{where} = {value}: must be a finite number")
        if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
            raise ConfigError(f"{where} = {grammar.shown(value)}: larger than any value may be (no parameter "
                              f"exceeds 2**{MAX_INT_BITS})")
        if isinstance(value, str) and len(value) > MAX_STRING:
            raise ConfigError(f"{where} = {grammar.shown(value)}: longer than any value may be ({MAX_STRING} "
                              "characters)")
        if isinstance(value, str) and _CONTROL.search(value):
            raise ConfigError(f"{where} = {grammar.shown(value)}: holds a control character "
                              f"(U+{ord(_CONTROL.search(value).group()):04X})")
        if isinstance(value, (dict, list)):
            if depth > MAX_DEPTH:
                raise ConfigError(f"{where}: nested more than {MAX_DEPTH} levels deep")
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                if isinstance(key, str) and len(key) > MAX_STRING:
                    raise ConfigError(f"{where}: a key of {len(key):,} characters")
                if isinstance(key, str) and _CONTROL.search(key):
                    raise ConfigError(f"{where}: the key {grammar.shown(key)} holds a control character")
                if isinstance(key, int) and key.bit_length() > MAX_INT_BITS:
                    raise ConfigError(f"{where}: the key {grammar.shown(key)} is larger than any key may be")
                child = f"{path}[{key}]" if isinstance(key, int) else (f"{path}.{key}" if path else str(key))
                stack.append((item, child, depth + 1))


def _cut(path: str, limit: int = 120) -> str:
    return path if len(path) <= limit else path[:limit] + "..."


def coerce_cli_scalars(obj: Any) -> Any:
    """Snakemake hands nested --config values over as strings ('3', 'true', 'null'); turn
    numeric, true/false and null strings back into numbers, booleans and None so the schema
    (and ``merge``, for which null removes a key) sees real types. (Only these forms: YAML's
    yes/no/on/off would turn a country code like NO into False.)"""
    if isinstance(obj, dict):
        return {key: coerce_cli_scalars(value) for key, value in obj.items()}
    if isinstance(obj, list):
        return [coerce_cli_scalars(value) for value in obj]
    if isinstance(obj, str) and len(obj) <= MAX_NUMBER_CHARS:  # a longer one stays text for the schema to name
        if obj.lower() in ("true", "false"):
            return obj.lower() == "true"
        if obj.lower() == "null":
            return None
        for kind in (int, float):
            try:
                return kind(obj)
            except ValueError:
                pass
    return obj


class BoundedLoader(yaml.SafeLoader):
    """YAML's safe loader with bounded work: a bounded nesting depth (a deep file would
    exhaust the recursion), numbers of at most MAX_NUMBER_CHARS characters (Python
    refuses ints of over 4,300 digits, and YAML 1.1's base-60 numbers cost quadratic
    time), merge keys (``<<: *name``) that copy at most MAX_NODES entries, and any error
    a value's constructor raises (a date like 2020-13-45) turned into a YAML error at the
    value's line and column. Aliases (``*name``) load as shared values, never copied:
    check_shape bounds what they would expand to before anything walks them."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth = getattr(self, "_depth", 0) + 1
        try:
            if self._depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(None, None, f"nested more than {MAX_DEPTH} levels deep",
                                                  self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_object(self, node: Any, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except yaml.YAMLError:
            raise
        except Exception as err:  # noqa: BLE001 - a constructor's own failure (!!timestamp x): the value is bad
            raise yaml.constructor.ConstructorError(None, None, f"cannot read this value ({type(err).__name__}: "
                                                    f"{grammar.shown(str(err), 80)[1:-1]})", node.start_mark) from None

    def flatten_mapping(self, node: Any) -> None:
        merges = any(key.tag == "tag:yaml.org,2002:merge" for key, _ in node.value)
        super().flatten_mapping(node)  # flattens the merged mappings first, through this method
        self._merged = getattr(self, "_merged", 0) + (len(node.value) if merges else 0)
        if self._merged > MAX_NODES:
            raise yaml.constructor.ConstructorError(None, None, f"merge keys (<<) copy more than {MAX_NODES:,} "
                                                    "entries", node.start_mark)

    def _bounded_number(self, node: Any) -> Any:
        if len(node.value) > MAX_NUMBER_CHARS:
            raise yaml.constructor.ConstructorError(None, None, f"a number of {len(node.value):,} characters (no "
                                                    f"parameter needs more than {MAX_NUMBER_CHARS})", node.start_mark)
        constructor = (yaml.SafeLoader.construct_yaml_int if node.tag.endswith(":int")
                       else yaml.SafeLoader.construct_yaml_float)
        return constructor(self, node)


BoundedLoader.add_constructor("tag:yaml.org,2002:int", BoundedLoader._bounded_number)
BoundedLoader.add_constructor("tag:yaml.org,2002:float", BoundedLoader._bounded_number)


def _at(data: bytes | str, offset: int) -> str:
    """Line and column (1-based) of ``offset`` in ``data``."""
    newline = b"\n" if isinstance(data, bytes) else "\n"
    line = data.count(newline, 0, offset) + 1
    return f"line {line}, column {offset - (data.rfind(newline, 0, offset) + 1) + 1}"


def read_params_text(path: str | Path, limit: int = MAX_PARAMS_BYTES) -> str:
    """The text of a parameter file, read without blocking and bounded: a regular file
    (not a link, a FIFO, a device or a folder; opened O_NONBLOCK, so a FIFO cannot hang
    the open, then judged by fstat), at most ``limit`` bytes (judged before reading, and
    while reading, should it grow), UTF-8 holding only characters YAML accepts.
    ConfigError, one line naming the file, for anything else."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise ConfigError(f"{path}: is a link; a parameter file must be a regular file of the project") from None
        raise ConfigError(f"{path}: cannot read it ({err.strerror})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = ("a folder" if stat.S_ISDIR(info.st_mode) else "a FIFO" if stat.S_ISFIFO(info.st_mode)
                    else "a socket" if stat.S_ISSOCK(info.st_mode) else "a device")
            raise ConfigError(f"{path}: is {kind}, not a regular file; a parameter file must be a regular file")
        if info.st_size > limit:
            raise ConfigError(f"{path}: {info.st_size:,} bytes, more than a parameter file may hold ({limit:,})")
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, limit + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as err:
        raise ConfigError(f"{path}: cannot read it ({err.strerror})") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > limit:
        raise ConfigError(f"{path}: grew past {limit:,} bytes while being read")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: byte 0x{data[err.start]:02x} at {_at(data, err.start)} is not UTF-8 text "
                          "(a parameter file is UTF-8)") from None
    bad = _NOT_YAML.search(text)
    if bad:
        raise ConfigError(f"{path}: character U+{ord(bad.group()):04X} at {_at(text, bad.start())} is not allowed "
                          "in a parameter file (a control character)")
    return text


def read_yaml(path: str | Path) -> dict:
    """params.yaml as a dict. The file is read by read_params_text (a regular file, at
    most MAX_PARAMS_BYTES, UTF-8 without control characters) and parsed by BoundedLoader;
    every refusal is one line naming the file (and, for YAML, the line and column)."""
    text = read_params_text(path)
    try:
        cfg = yaml.load(text, Loader=BoundedLoader)  # noqa: S506 - a SafeLoader
    except yaml.MarkedYAMLError as err:
        def at(mark) -> str:
            return f"line {mark.line + 1}, column {mark.column + 1}"

        text = f"{err.problem} at {at(err.problem_mark)}" if err.problem_mark is not None else str(err.problem)
        if err.context and err.context_mark is not None:
            text = f"{err.context} started at {at(err.context_mark)}: {text}"
        kind = "YAML syntax error" if isinstance(err, (yaml.scanner.ScannerError, yaml.parser.ParserError)) \
            else "YAML error"
        raise ConfigError(one_line(f"{path}: {kind}: {text}")) from None
    except yaml.YAMLError as err:  # the reader's and emitter's errors carry no mark
        raise ConfigError(one_line(f"{path}: YAML error: {err}")) from None
    except (ValueError, TypeError, AttributeError, LookupError, ArithmeticError, RecursionError) as err:  # a last net
        raise ConfigError(one_line(f"{path}: cannot be read as YAML ({type(err).__name__}: "
                                   f"{grammar.shown(str(err), 80)[1:-1]})")) from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{path}: expected a mapping of keys at the top level")
    return cfg


def load_params(path: str | Path = "params.yaml", overrides: dict | None = None) -> dict:
    try:
        check_shape(overrides or {})
    except ConfigError as err:
        raise ConfigError(one_line(str(err))) from None
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
    on top (their scalars coerced back from strings), validated. The overrides' shape is
    checked first (Snakemake parsed them as YAML, aliases and all)."""
    try:
        check_shape(cli_overrides)
    except ConfigError as err:
        raise ConfigError(one_line(str(err))) from None
    return validate(merge(read_yaml(path), coerce_cli_scalars(cli_overrides)))
