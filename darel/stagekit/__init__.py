"""Plumbing shared by the stage CLIs in ``stages/``, split along its seams: ``cli``
(arguments, logging, one-line errors, MLflow arguments), ``watchdog`` (one writer per
folder, no orphaned stage), ``models`` (data and models on the device) and ``training``
(the run level of every training stage, ``TrainingRun``, and the image training and LoRA
fine-tuning runs on it). Everything is importable from
``darel.stagekit`` directly."""

from darel.stagekit.cli import add_tracking_args, fail, follow_table, parser, start, tracking_target
from darel.stagekit.models import (device_and_split, load_model, load_split, model_spec, new_model, save_model,
                                   transforms)
from darel.stagekit.training import CHECKPOINT, TrainingRun, run_finetuning, run_training
from darel.stagekit.watchdog import claim_folder, stop_with_parent

__all__ = ["CHECKPOINT", "add_tracking_args", "claim_folder", "device_and_split", "fail", "follow_table", "load_model",
           "load_split", "model_spec", "new_model", "parser", "run_finetuning", "run_training", "save_model",
           "start", "stop_with_parent", "TrainingRun", "tracking_target", "transforms"]
