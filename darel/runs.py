"""One training run as the training stages perform it: build the model, train it
(plain or DAREL online) with time and energy over the same intervals, write model.pt and
train.json.

This is the I/O side of the training stages, shared by "pretrain scorer" (the
baseline) and "online training", so both time and measure exactly the same way.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import numpy as np

from darel import engine, io, provenance, stagekit

CHECKPOINT = "ckpt.pt"
from darel.measure import EnergyTracker
from darel.models import count_parameters
from darel.models.hypercomplex import count_flops_per_image


def plan_from_params(params: dict, *, batch: int | None = None, **overrides) -> engine.RunPlan:
    """The run plan of a training stage from its parameter slice (the protocol, the
    profile's runtime settings); ``overrides`` set the budget fields."""
    proto = params["protocol"]
    if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int) or batch < 1):
        raise ValueError(f"batch must be a positive integer, got {batch!r}")
    settings = dict(
        epochs=proto["epochs"], batch=batch or proto["batch"], lr=proto["lr"], momentum=proto["momentum"],
        weight_decay=proto["weight_decay"], schedule=proto["schedule"], milestones=tuple(proto["milestones"]),
        lr_gamma=proto["lr_gamma"], seed=params["seed"], precision=params["precision"],
        eval_batch=params["eval_batch"], eval_every=params["eval_every"],
        checkpoint_every=params["checkpoint_every"], compile=params["compile"],
    )
    return engine.RunPlan(**{**settings, **overrides})


def budget_plan(params: dict, calibration: dict) -> engine.RunPlan:
    """The run plan of a calibrated cell: its batch, scoring batch and online settings,
    and either the planned epochs (plan enforcement) or the wall-clock budget."""
    proto = params["protocol"]
    online = engine.OnlineSettings(keep_fraction=calibration["A"], eta=int(calibration["eta"]),
                                   warmup_epochs=proto["warmup_epochs"], history_size=params["history_size"],
                                   bins=params["bins"])
    overrides: dict = {"online": online}
    if calibration.get("t_max_s") is not None:  # a budgeted cell (IDS + ADONIS has none)
        enforce = params["budget"]["enforce"]
        if calibration.get("enforce") not in (None, enforce):
            raise ValueError(f"calibration was made for budget.enforce = {calibration['enforce']!r}, "
                             f"this run asks for {enforce!r}")
        overrides["score_batch"] = int(calibration["score_batch"])
        overrides["epoch_cost_s"] = calibration["epoch_cost_s"]
        if enforce == "plan":
            overrides["train_epochs"] = int(calibration["planned_epochs"])
        else:
            overrides["time_budget_s"] = float(calibration["t_max_s"])
        if params["budget"]["schedule"] == "rescale":
            overrides["schedule_epochs"] = int(calibration["planned_epochs"])
    return plan_from_params(params, batch=int(calibration["batch"]), **overrides)


def control_plan(params: dict, calibration: dict, method_plan: dict) -> engine.RunPlan:
    """The run plan of one method of a study cell (``darel.controls.plans.method_plan``):
    the cell's batch and scoring batch, the method's planned epochs (or the wall-clock
    budget) and its selection settings."""
    proto = params["protocol"]
    method = method_plan["method"]
    budget = params["budget"]
    overrides: dict = {"score_batch": int(calibration["score_batch"]), "epoch_cost_s": method_plan["epoch_cost_s"]}
    planned = int(method_plan["planned_epochs"])
    if budget["enforce"] == "plan":
        overrides["train_epochs"] = planned
    else:
        overrides["time_budget_s"] = float(calibration["t_max_s"])
    if method_plan.get("rule"):
        overrides["online"] = engine.OnlineSettings(
            keep_fraction=method_plan["A"], eta=int(method_plan["eta"]), warmup_epochs=proto["warmup_epochs"],
            history_size=params["history_size"], bins=params["bins"], rule=method_plan["rule"])
        if budget["schedule"] == "rescale":
            overrides["schedule_epochs"] = planned
    elif method == "short-schedule":
        if method_plan["schedule"] == "linear":
            overrides.update(schedule="linear", schedule_steps=int(method_plan["schedule_steps"]))
        else:
            overrides["schedule_epochs"] = planned
    elif method == "selective-backprop":
        overrides["selective_backprop"] = engine.SelectiveBackpropSettings(
            keep_fraction=method_plan["A"], warmup_epochs=proto["warmup_epochs"], history_size=params["history_size"])
    elif method == "infobatch":
        overrides["infobatch"] = engine.InfoBatchSettings(prune_fraction=method_plan["prune_fraction"],
                                                          anneal_start_epoch=int(method_plan["anneal_start_epoch"]))
    else:
        raise ValueError(f"no run plan for method {method!r}")
    return plan_from_params(params, batch=int(calibration["batch"]), **overrides)


def run_training(params: dict, *, data_dir: str, out_dir: str, log: logging.Logger, progress: bool = True,
                 calibration: dict | None = None, subset_indices: np.ndarray | None = None,
                 plan: engine.RunPlan | None = None, inputs: dict[str, str] | None = None,
                 tracking: dict | None = None) -> dict:
    """Train one cell and write model.pt and train.json into ``out_dir``. Its checkpoint
    (``ckpt.pt``) is resumed only when everything the result depends on is unchanged: the
    parameter slice, the data set's and every input file's content hash (``inputs``:
    name -> sha256), and the package's code version. The checkpoint stays after the
    outputs are written (the report stage removes it once the workflow has accepted them).

    With ``tracking`` ({uri, experiment, cell_key}) the cell's MLflow run starts now, with
    the full training settings as parameters, and every epoch's figures stream into it."""
    out = Path(out_dir)
    device = engine.resolve_device(params["device"])
    engine.configure_runtime(device, params["threads"])
    split = stagekit.load_split(data_dir, device)
    proto = params["protocol"]
    augment, normalise = stagekit.transforms(split["meta"], params["augment"], proto.get("input_size"))
    spec = stagekit.model_spec(params["model"], split["meta"], proto)
    model = stagekit.new_model(spec, params["seed"])

    if plan is None:
        plan = plan_from_params(params) if calibration is None else budget_plan(params, calibration)
    log.info("run plan: %s", plan)
    n_full = len(split["train_y"])
    subset = None
    if subset_indices is not None:
        subset = np.asarray(subset_indices, dtype=np.int64)
        if subset.ndim != 1 or len(subset) == 0 or subset.min() < 0 or subset.max() >= n_full:
            raise ValueError(f"subset indices must be a non-empty 1-D array within [0, {n_full}), got shape "
                             f"{subset.shape} range [{subset.min() if subset.size else None}, "
                             f"{subset.max() if subset.size else None}]")

    live = None
    if tracking is not None:
        from darel import tracking as mlflow_tracking

        settings = {"params": params, "plan": {k: v for k, v in dataclasses.asdict(plan).items()
                                               if k not in ("extra", "epoch_cost_s")}}
        tags = {"profile": tracking["cell_key"].split("/")[0], "model": params["model"], "seed": params["seed"],
                "dataset_label": split["meta"]["label"], "stage": "training"}
        try:
            run_id = mlflow_tracking.start_cell_run(tracking["uri"], tracking["experiment"], tracking["cell_key"],
                                                    settings, tags)
        except mlflow_tracking.TrackingError as err:
            stagekit.fail(log, f"MLflow: {err}")
        live = mlflow_tracking.LiveRun(tracking["uri"], run_id, log.warning)
        log.info("MLflow run %s (experiment %s, %s): per-epoch metrics stream in", run_id, tracking["experiment"],
                 tracking["cell_key"])
    carbon = params["carbon"]
    tracker = EnergyTracker(country_iso_code=carbon["country_iso_code"], pue=carbon["pue"],
                            measure_power_secs=carbon["measure_power_secs"])
    tracker.start()
    fingerprint = {"params": params, "data": split["meta"], "inputs": inputs or {},  # meta holds the sha256
                   "code": provenance.code_version()}
    summary = engine.train(model, split["train_x"], split["train_y"], augment, normalise, plan, device,
                           subset=subset, energy=tracker, checkpoint_path=out / CHECKPOINT,
                           eval_data=(split["test_x"], split["test_y"]), progress=progress,
                           fingerprint_extra=fingerprint, on_epoch_end=live.log_epoch if live else None)
    summary["energy_covers"] = summary["energy"].get("energy_covers")
    side = proto.get("input_size") or split["meta"]["image_size"]
    input_shape = (split["meta"]["channels"], side, side)
    summary.update({
        "n_params": count_parameters(model), "macs_per_image": count_flops_per_image(model.cpu(), input_shape),
        "input_shape": list(input_shape),
        "model_spec": spec, "n_train": int(n_full if subset is None else len(subset)), "n_train_full": int(n_full),
        "batch": plan.batch, "score_batch": plan.score_batch or plan.eval_batch, "eval_batch": plan.eval_batch,
        "schedule": plan.schedule, "schedule_epochs": plan.schedule_epochs, "schedule_steps": plan.schedule_steps,
        "enforce": "plan" if plan.train_epochs else "wallclock" if plan.time_budget_s else "none",
        "dataset_label": split["meta"]["label"], "device": str(device), "params": params,
    })
    summary["inputs"] = inputs or {}
    summary["code_version"] = provenance.code_version()
    stagekit.save_model(out / "model.pt", model, spec)
    # The weights' sha256 in the sealed record: every reader of model.pt checks it.
    summary["model_sha256"] = io.file_sha256(out / "model.pt")
    provenance.write_record(out / "train.json", summary)
    log.info("trained %d/%d epochs in %.1f s, peak memory %.2f MiB (%s), energy %.3g kWh",
             summary["epochs_completed"], plan.epochs_to_run, summary["time_s"], summary["peak_mem_bytes"] / 2**20,
             summary["memory_source"], summary["energy"].get("energy_kwh", float("nan")))
    return summary
