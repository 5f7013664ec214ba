"""Image data and models on the device: the data set loaded once, the transforms, models
built from their spec and saved or loaded (the weights checked against their record)."""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from darel import devicelock
from darel.augment import DeviceAugment, column_tensors, to_tensors
from darel.data import read_dataset
from darel.io import torch_save
from darel.models import build_model
from darel.runtime import take_device_turn

log = logging.getLogger(__name__)


def device_and_split(params: dict, data_dir: str | Path) -> tuple[torch.device, dict[str, Any]]:
    """The stage's device (threads configured) and the data set loaded onto it."""
    from darel.plans import Runtime
    from darel.runtime import configure_runtime, resolve_device

    device = resolve_device(params["device"])
    configure_runtime(device, params["threads"], take_turn=False,  # load_split takes it after reading
                      algorithm_search=params.get("cudnn_benchmark", Runtime.cudnn_benchmark))
    return device, load_split(data_dir, device)


def model_on_split(params: dict, data_dir: str | Path, model_path: str | Path
                   ) -> tuple[torch.device, dict[str, Any], torch.nn.Module, dict, Any]:
    """(device, split, model, its spec, normalise): the stage's device, the data set on it,
    the checked trained model on it and the normalisation of its protocol (an image stage
    that only runs a trained model: evaluation, scoring)."""
    device, split = device_and_split(params, data_dir)
    model, spec = load_model(model_path, device)
    _, normalise = transforms(split["meta"], params["augment"], params["protocol"].get("input_size"))
    return device, split, model, spec, normalise


def write_test_evaluation(out: str | Path, model: torch.nn.Module, split: dict[str, Any], normalise: Any,
                          spec: dict, params: dict, train_record: str | Path, log: logging.Logger) -> dict:
    """The evaluation record of a trained model (eval.json at ``out``): its top-1 on the whole
    test split, the rare and common classes apart where the data names its rare classes (the
    generated benchmark), sealed against the training's ``train_record``, whose sha256 of
    the weights it repeats. One writer for the evaluation stage (a model read from its file)
    and a training that evaluates its model in memory once its timed interval is over."""
    from darel import evaluation, provenance

    pred = evaluation.predictions(model, split["test_x"], normalise, params["eval_batch"], params["precision"])
    top1 = evaluation.accuracy_percent(pred, split["test_y"])
    rare = split["meta"].get("rare_classes")
    by_group = evaluation.rare_and_common_top1(pred, split["test_y"], rare) if rare else {}
    model_sha256 = provenance.read_record(train_record)["model_sha256"]
    record = {"top1": top1, **by_group, "n_test": len(split["test_y"]), "model_spec": spec,
              "model_sha256": model_sha256}
    provenance.write_record(out, record, inputs={"train": train_record})
    log.info("top-1 %.2f %% on %d test images%s", top1, len(split["test_y"]),
             "".join(f"; {key} {value:.2f} %" for key, value in by_group.items()))
    return record


def device_after_checks(params: dict, folders: tuple[tuple[str | Path, str], ...]) -> torch.device:
    """The stage's device with its threads and torch's deterministic mode configured, then
    every (folder, record) of ``folders`` checked against its record (a language stage's
    inputs: provenance.check_folder)."""
    from darel import provenance
    from darel.runtime import configure_runtime, resolve_device

    device = resolve_device(params["device"])
    configure_runtime(device, params["threads"], deterministic=True)
    for folder, record in folders:
        provenance.check_folder(folder, record)
    return device


def load_split(folder: str | Path, device: torch.device) -> dict[str, Any]:
    """The data set on ``device``: uint8 NCHW images and labels of both splits, its meta, and
    ``train_columns``: the training split's per-sample columns where the data set has them
    (the generated benchmark's categories; darel.data.column_tensors), else {}."""
    return place_split(read_split(folder), device)


def read_split(folder: str | Path) -> dict[str, Any]:
    """The data set in host memory, every file checked against its record: the part of
    loading that needs no device, so a job does it before waiting for its GPU turn."""
    began = time.perf_counter()
    train, test, meta = read_dataset(folder)
    return {"train": train, "test": test, "meta": meta, "read_s": time.perf_counter() - began}


def place_split(host: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """``read_split``'s data set on ``device`` (load_split's result), after the job's GPU
    turn (darel.devicelock): nothing goes onto a GPU before it."""
    waited = take_device_turn(device.type)
    if waited is not None:
        log.info(devicelock.WAIT_MESSAGE, waited)
    began = time.perf_counter()
    train, test = host["train"], host["test"]
    train_x, train_y = to_tensors(train, device)
    test_x, test_y = to_tensors(test, device)
    # A job's start-up in its log (the GPU profile's wall is mostly start-ups, bench/README.md).
    log.info("data set on %s: %d + %d images in %.2f s", device, len(train_y), len(test_y),
             host["read_s"] + time.perf_counter() - began)
    return {"train_x": train_x, "train_y": train_y, "test_x": test_x, "test_y": test_y, "meta": host["meta"],
            "train_columns": column_tensors(train, device)}


def transforms(meta: dict, augment: dict, input_size: int | None = None) -> tuple[Any, Any]:
    """(augment, normalise) callables on uint8 NCHW batches; with `input_size` their float
    output is resized (bilinear) to that side, e.g. 32 -> 224 for the ResNet18-HC protocol.
    Augmenting at the stored size and resizing after is the same crop/flip/rotation at
    a finer grid, and keeps the data on the device small."""
    aug = DeviceAugment(pad=augment["pad"], hflip=augment["hflip"], max_rotation_deg=augment["rotation_deg"],
                        mean=meta["mean"], std=meta["std"])
    if not input_size or input_size == meta["image_size"]:
        return aug, aug.normalise

    def resize(x: torch.Tensor) -> torch.Tensor:
        return F.interpolate(x, size=(input_size, input_size), mode="bilinear", align_corners=False)

    return (lambda images, gen: resize(aug(images, gen))), (lambda images: resize(aug.normalise(images)))


def model_spec(model_name: str, meta: dict, protocol: Any) -> dict:
    """What builds the model: its name, the data's classes and channels, the protocol's
    width (and algebra and stem where the protocol sets them); ``protocol`` is a
    darel.plans.Protocol or its dict."""
    values = protocol if isinstance(protocol, dict) else dataclasses.asdict(protocol)
    spec = {"name": model_name, "num_classes": meta["num_classes"], "in_channels": meta["channels"],
            "width": values["width"]}
    for optional in ("algebra", "stem"):
        if values.get(optional) is not None:
            spec[optional] = values[optional]
    return spec


def new_model(spec: dict, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    extra = {key: spec[key] for key in ("algebra", "stem") if key in spec}
    return build_model(spec["name"], num_classes=spec["num_classes"], in_channels=spec["in_channels"],
                       width=spec["width"], **extra)


def save_model(path: str | Path, model: torch.nn.Module, spec: dict) -> None:
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    torch_save(path, {"spec": spec, "state_dict": state})


def load_model(path: str | Path, device: torch.device) -> tuple[torch.nn.Module, dict]:
    """A trained model.pt, after its sha256 is checked against the sealed train.json its
    training wrote beside it; tensors and plain values only (``weights_only``)."""
    from darel import provenance

    path = Path(path)
    record = path.with_name("train.json")
    provenance.check_file(path, provenance.read_record(record).get("model_sha256"), record)
    saved = torch.load(path, map_location="cpu", weights_only=True)
    spec = saved["spec"]
    model = new_model(spec, seed=0)
    model.load_state_dict(saved["state_dict"])
    return model.to(device), spec
