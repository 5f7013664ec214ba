"""One image training run as the training stages perform it: build the model, train it
on the epoch skeleton with time and energy over the same intervals, write model.pt and
the sealed train.json. Shared by "pretrain scorer" (the baseline), "online training"
(DAREL, IDS + ADONIS) and the study's controls, so all of them time and measure alike."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import numpy as np

from darel import image_training, io, plans, provenance, runtime
from darel.measure import EnergyTracker
from darel.models import count_parameters
from darel.models.hypercomplex import count_macs_per_image
from darel.stagekit.cli import fail
from darel.stagekit.models import load_split, model_spec, new_model, save_model, transforms

CHECKPOINT = "ckpt.pt"


def run_training(params: dict, *, data_dir: str, out_dir: str, log: logging.Logger, progress: bool = True,
                 calibration: dict | None = None, subset_indices: np.ndarray | None = None,
                 method: dict | None = None, inputs: dict[str, str] | None = None,
                 tracking: dict | None = None, input_files: dict[str, str | None] | None = None) -> dict:
    """Train one cell and write model.pt and train.json into ``out_dir``: the baseline
    (no calibration), a DAREL or IDS + ADONIS cell (its calibration), or a study control
    (the cell's calibration and the ``method`` plan, darel.plans.method_plan). Its
    checkpoint (``ckpt.pt``) is resumed only when everything the result depends on is
    unchanged: the parameter slice, the data set's and every input file's content hash
    (``inputs``: name -> sha256), and the package's code version. The checkpoint stays
    after the outputs are written (the report stage removes it once the workflow has
    accepted them). ``input_files`` (name -> file) go into train.json's identity, for
    the readers that check a training against the inputs they are given.

    With ``tracking`` ({uri, experiment, cell_key}) the cell's MLflow run starts now, with
    the full training settings as parameters, and every epoch's figures stream into it."""
    settings = plans.ImageSettings.from_slice(params)
    out = Path(out_dir)
    device = runtime.resolve_device(settings.runtime.device)
    runtime.configure_runtime(device, settings.runtime.threads)
    split = load_split(data_dir, device)
    proto = settings.protocol
    augment, normalise = transforms(split["meta"], settings.augment, proto.input_size)
    spec = model_spec(settings.model, split["meta"], proto)
    model = new_model(spec, settings.seed)

    plan = plans.run_plan(settings, calibration, method)
    method_plan = method if method is not None else (plans.darel_plan(calibration) if calibration else None)
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

        recorded = {"params": params, "plan": {k: v for k, v in dataclasses.asdict(plan).items()
                                               if k not in ("extra", "epoch_cost_s")}}
        tags = {"profile": tracking["cell_key"].split("/")[0], "model": settings.model, "seed": settings.seed,
                "dataset_label": split["meta"]["label"], "stage": "training"}
        try:
            run_id = mlflow_tracking.start_cell_run(tracking["uri"], tracking["experiment"], tracking["cell_key"],
                                                    recorded, tags)
        except mlflow_tracking.TrackingError as err:
            fail(log, f"MLflow: {err}")
        live = mlflow_tracking.LiveRun(tracking["uri"], run_id, log.warning)
        log.info("MLflow run %s (experiment %s, %s): per-epoch metrics stream in", run_id, tracking["experiment"],
                 tracking["cell_key"])
    carbon = settings.carbon
    tracker = EnergyTracker(country_iso_code=carbon["country_iso_code"], pue=carbon["pue"],
                            measure_power_secs=carbon["measure_power_secs"])
    tracker.start()
    fingerprint = {"params": params, "data": split["meta"], "inputs": inputs or {},  # meta holds the sha256
                   "code": provenance.code_version()}
    summary = image_training.train(model, split["train_x"], split["train_y"], augment, normalise, plan, device,
                           subset=subset, energy=tracker, checkpoint_path=out / CHECKPOINT,
                           eval_data=(split["test_x"], split["test_y"]), progress=progress,
                           fingerprint_extra=fingerprint, on_epoch_end=live.log_epoch if live else None)
    summary["energy_covers"] = summary["energy"].get("energy_covers")
    side = proto.input_size or split["meta"]["image_size"]
    input_shape = (split["meta"]["channels"], side, side)
    summary.update({
        "n_params": count_parameters(model), "macs_per_image": count_macs_per_image(model.cpu(), input_shape),
        "input_shape": list(input_shape),
        "model_spec": spec, "n_train": int(n_full if subset is None else len(subset)), "n_train_full": int(n_full),
        "batch": plan.batch, "score_batch": plan.score_batch or plan.eval_batch, "eval_batch": plan.eval_batch,
        "schedule": plan.schedule, "schedule_epochs": plan.schedule_epochs, "schedule_steps": plan.schedule_steps,
        "enforce": "plan" if plan.train_epochs else "wallclock" if plan.time_budget_s else "none",
        "dataset_label": split["meta"]["label"], "device": str(device), "params": params,
        "method_plan": method_plan,
    })
    summary["inputs"] = inputs or {}
    summary["code_version"] = provenance.code_version()
    save_model(out / "model.pt", model, spec)
    # The weights' sha256 in the sealed record: every reader of model.pt checks it.
    summary["model_sha256"] = io.file_sha256(out / "model.pt")
    provenance.write_record(out / "train.json", summary, inputs=input_files)
    log.info("trained %d/%d epochs in %.1f s, peak memory %.2f MiB (%s), energy %.3g kWh",
             summary["epochs_completed"], plan.epochs_to_run, summary["time_s"], summary["peak_mem_bytes"] / 2**20,
             summary["memory_source"], summary["energy"].get("energy_kwh", float("nan")))
    return summary
