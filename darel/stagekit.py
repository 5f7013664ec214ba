"""Plumbing shared by the stage CLIs in ``stages/``: arguments, logging, loading the
on-disk dataset onto the device, and saving/loading trained models."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

import torch

from darel.data import DeviceAugment, read_dataset, to_tensors
from darel.io import torch_save
from darel.models import build_model


def parser(description: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--params", default="{}", help="JSON object: this stage's slice of params.yaml")
    ap.add_argument("--log", help="log file (appended); stderr always gets the log too")
    ap.add_argument("--no-progress", action="store_true", help="hide progress bars")
    return ap


def start(args: argparse.Namespace, name: str) -> tuple[dict, logging.Logger]:
    try:
        params = json.loads(args.params)
    except json.JSONDecodeError as err:
        raise SystemExit(f"{name}: --params is not valid JSON: {err}") from None
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if args.log:
        Path(args.log).parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(args.log, mode="w", encoding="utf-8"))
    logging.basicConfig(level=logging.INFO, handlers=handlers, force=True,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("codecarbon").setLevel(logging.ERROR)
    logger = logging.getLogger(f"darel.stage.{name}")

    def log_uncaught(exc_type, exc, tb):
        # Snakemake shows the log file of a failed job: the traceback must be in it.
        logger.error("%s failed", name, exc_info=(exc_type, exc, tb))

    sys.excepthook = log_uncaught
    logger.info("%s: params %s", name, json.dumps(params, sort_keys=True))
    return params, logger


def load_split(folder: str | Path, device: torch.device) -> dict[str, Any]:
    train, test, meta = read_dataset(folder)
    train_x, train_y = to_tensors(train, device)
    test_x, test_y = to_tensors(test, device)
    return {"train_x": train_x, "train_y": train_y, "test_x": test_x, "test_y": test_y, "meta": meta}


def transforms(meta: dict, augment: dict) -> tuple[DeviceAugment, Any]:
    aug = DeviceAugment(pad=augment["pad"], hflip=augment["hflip"], max_rotation_deg=augment["rotation_deg"],
                        mean=meta["mean"], std=meta["std"])
    return aug, aug.normalise


def model_spec(model_name: str, meta: dict, protocol: dict) -> dict:
    return {"name": model_name, "num_classes": meta["num_classes"], "in_channels": meta["channels"],
            "width": protocol["width"]}


def new_model(spec: dict, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model(spec["name"], num_classes=spec["num_classes"], in_channels=spec["in_channels"],
                       width=spec["width"])


def save_model(path: str | Path, model: torch.nn.Module, spec: dict) -> None:
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    torch_save(path, {"spec": spec, "state_dict": state})


def load_model(path: str | Path, device: torch.device) -> tuple[torch.nn.Module, dict]:
    saved = torch.load(path, map_location="cpu", weights_only=True)
    spec = saved["spec"]
    model = new_model(spec, seed=0)
    model.load_state_dict(saved["state_dict"])
    return model.to(device), spec
