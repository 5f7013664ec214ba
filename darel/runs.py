"""One training run as the training stages perform it: build the model, train it
(plain or DAREL online) under the energy tracker, write model.pt and train.json.

This is the I/O side of the training stages, shared by "pretrain scorer" (the
baseline) and "online training", so both time and measure exactly the same way.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np
import torch

from darel import engine, io, stagekit
from darel.measure import EnergyTracker
from darel.models import count_parameters
from darel.models.hypercomplex import count_flops_per_image


def plan_from_params(params: dict, *, batch: int | None = None, time_budget_s: float | None = None,
                     schedule_epochs: int | None = None, online: engine.OnlineSettings | None = None) -> engine.RunPlan:
    proto = params["protocol"]
    return engine.RunPlan(
        epochs=proto["epochs"], batch=batch or proto["batch"], lr=proto["lr"], momentum=proto["momentum"],
        weight_decay=proto["weight_decay"], schedule=proto["schedule"], milestones=tuple(proto["milestones"]),
        lr_gamma=proto["lr_gamma"], seed=params["seed"], amp=params["amp"], eval_batch=params["eval_batch"],
        time_budget_s=time_budget_s, schedule_epochs=schedule_epochs, online=online,
    )


def epochs_within_budget(calibration: dict, n_train: int, warmup_epochs: int, epochs: int) -> int:
    """Predicted number of epochs that fit t_max, from the calibrated step time.

    Used only by the `rescale` schedule option: warm-up epochs cost a full pass,
    online epochs cost A of a pass plus a forward-only scoring pass every eta
    epochs (taken as a third of a training step, the usual forward/backward split).
    """
    t_b, b = calibration["t_b_s"], calibration["batch"]
    full = t_b * math.ceil(n_train / b)
    online = t_b * math.ceil(calibration["A"] * n_train / b) + full / 3 / calibration["eta"]
    budget_left = calibration["t_max_s"] - warmup_epochs * full
    fit = warmup_epochs + max(0, math.floor(budget_left / online))
    return int(min(epochs, max(1, fit)))


def run_training(params: dict, *, data_dir: str, out_dir: str, log: logging.Logger, progress: bool = True,
                 calibration: dict | None = None, subset_indices: np.ndarray | None = None) -> dict:
    out = Path(out_dir)
    device = engine.resolve_device(params["device"])
    engine.configure_runtime(device, params["threads"])
    split = stagekit.load_split(data_dir, device)
    proto = params["protocol"]
    augment, normalise = stagekit.transforms(split["meta"], params["augment"], proto.get("input_size"))
    spec = stagekit.model_spec(params["model"], split["meta"], proto)
    model = stagekit.new_model(spec, params["seed"])

    train_x, train_y = split["train_x"], split["train_y"]
    if subset_indices is not None:
        keep = torch.as_tensor(subset_indices, dtype=torch.long, device=device)
        train_x, train_y = train_x[keep], train_y[keep]

    if calibration is None:
        plan = plan_from_params(params)
    else:
        online = engine.OnlineSettings(keep_fraction=calibration["A"], eta=int(calibration["eta"]),
                                       warmup_epochs=proto["warmup_epochs"], history_size=params["history_size"],
                                       bins=params["bins"])
        schedule_epochs = None
        if params["budget_schedule"] == "rescale" and calibration.get("t_max_s") is not None:
            schedule_epochs = epochs_within_budget(calibration, len(train_y), proto["warmup_epochs"], proto["epochs"])
        plan = plan_from_params(params, batch=int(calibration["batch"]), time_budget_s=calibration["t_max_s"],
                                schedule_epochs=schedule_epochs, online=online)
    log.info("run plan: %s", plan)

    carbon = params["carbon"]
    tracker = EnergyTracker(country_iso_code=carbon["country_iso_code"], pue=carbon["pue"],
                            measure_power_secs=carbon["measure_power_secs"])
    tracker.start()
    try:
        summary = engine.train(model, train_x, train_y, augment, normalise, plan, device,
                               checkpoint_path=out / "ckpt.pt", eval_data=(split["test_x"], split["test_y"]),
                               progress=progress)
    finally:
        energy = tracker.stop()
    summary["energy"] = energy
    summary["energy_covers"] = ("whole run" if summary["resumed_from_epoch"] is None
                                else f"only the segment resumed at epoch {summary['resumed_from_epoch']}")
    side = proto.get("input_size") or split["meta"]["image_size"]
    input_shape = (split["meta"]["channels"], side, side)
    summary.update({
        "n_params": count_parameters(model), "macs_per_image": count_flops_per_image(model.cpu(), input_shape),
        "input_shape": list(input_shape),
        "model_spec": spec, "n_train": int(len(train_y)), "n_train_full": int(len(split["train_y"])),
        "batch": plan.batch, "schedule_epochs": plan.schedule_epochs, "dataset_label": split["meta"]["label"],
        "device": str(device), "params": params,
    })
    stagekit.save_model(out / "model.pt", model, spec)
    io.write_json(out / "train.json", summary)
    (out / "ckpt.pt").unlink(missing_ok=True)
    log.info("trained %d/%d epochs in %.1f s, peak memory %.1f MiB (%s), energy %.3g kWh",
             summary["epochs_completed"], plan.epochs, summary["time_s"], summary["peak_mem_bytes"] / 2**20,
             summary["memory_source"], energy.get("energy_kwh", float("nan")))
    return summary
