"""Plumbing shared by the stage CLIs in ``stages/``, split along its seams: ``errors`` (the
one-line stop), ``cli`` (arguments, logging, MLflow arguments), ``watchdog`` (one writer per
folder, no orphaned stage), ``models`` (data and models on the device) and ``training``
(the run level of every training stage, ``TrainingRun``, and the image training and LoRA
fine-tuning runs on it). Everything is importable from ``darel.stagekit`` directly;
``models`` and ``training`` (torch) load on first use, so the workflow layer, which
reads ``watchdog``, starts without torch."""

from __future__ import annotations

import importlib

from darel.stagekit.cli import (add_tracking_args, follow_table, image_training_parser, parser, read_cells, sealed_run_ids,
                                start, table_parser, tracking_target)
from darel.stagekit.errors import fail
from darel.stagekit.watchdog import claim_folder, stop_with_parent

_LAZY = {name: "darel.stagekit.models" for name in ("device_after_checks", "device_and_split", "load_model",
                                                     "load_split", "model_on_split", "model_spec", "new_model",
                                                     "save_model", "transforms", "write_test_evaluation")}
_LAZY.update({name: "darel.stagekit.training" for name in ("CHECKPOINT", "TrainingRun", "run_finetuning",
                                                           "run_training")})


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'darel.stagekit' has no attribute {name!r}")


__all__ = ["CHECKPOINT", "add_tracking_args", "claim_folder", "device_and_split", "fail", "follow_table", "image_training_parser",
           "load_model",
           "load_split", "model_spec", "new_model", "parser", "read_cells", "run_finetuning", "run_training", "save_model",
           "sealed_run_ids", "start", "stop_with_parent", "table_parser", "TrainingRun", "tracking_target", "transforms",
           "write_test_evaluation"]
