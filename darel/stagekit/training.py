"""The training runs of the stages, on one run level.

``TrainingRun`` is what every training stage does around its loop, in one place: the
device and its threads (under torchrun, the process group first), the cell's live MLflow
run the epochs stream into, the energy tracker over the loop (its readings bracket the
timed intervals, darel.epochs) and the sealed train.json. ``run_training`` is one image
training run on it (the baseline and scorer, DAREL, IDS + ADONIS, the study's methods),
``run_finetuning`` one LoRA fine-tuning (Tables 2/3), so all of them time, measure and
record alike."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from darel import composition, devicelock, io, plans, provenance, runtime
from darel.stagekit.errors import fail

CHECKPOINT = "ckpt.pt"


class TrainingRun:
    """The run level of one training stage (see the module). ``processes``: the stage may
    run under torchrun (process 0 alone tracks, measures energy and writes records)."""

    def __init__(self, log: logging.Logger, *, device: str, threads: int, carbon: dict,
                 tracking: dict | None = None, processes: bool = False, deterministic: bool = False,
                 defer_turn: bool = False, algorithm_search: bool = True) -> None:
        from darel import distributed

        self.log, self.carbon, self.tracking = log, carbon, tracking
        resolved = runtime.resolve_device(device)
        # The device turn (darel.devicelock) before the process group touches a GPU; with
        # ``defer_turn`` the stage takes it itself, once its start-up is done.
        if not defer_turn:
            self.log_turn(runtime.take_device_turn(resolved.type))
        self.world = distributed.join(resolved) if processes else None
        self.device = self.world.device if self.world is not None else resolved
        runtime.configure_runtime(self.device, threads, deterministic=deterministic, take_turn=False,
                                  algorithm_search=algorithm_search)
        self.is_main = self.world is None or self.world.is_main
        self.live = None

    def log_turn(self, waited: float | None) -> None:
        if waited is not None:
            self.log.info(devicelock.WAIT_MESSAGE, waited)

    def __enter__(self) -> TrainingRun:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.world is not None:
            from darel import distributed

            if exc[0] is None:
                distributed.barrier(self.world)
            distributed.leave(self.world)

    def follow(self, recorded: dict, tags: dict) -> None:
        """Start the cell's live MLflow run (process 0, with ``tracking``): ``recorded`` are
        its parameters, and every epoch's figures stream in through ``on_epoch_end``."""
        if self.tracking is None or not self.is_main:
            return
        from darel import tracking as mlflow_tracking

        target = self.tracking
        tags = {"profile": target["cell_key"].split("/")[0], **tags, "stage": "training"}
        try:
            run_id = mlflow_tracking.start_cell_run(target["uri"], target["experiment"], target["cell_key"],
                                                    recorded, tags)
        except mlflow_tracking.TrackingError as err:
            fail(self.log, f"MLflow: {err}")
        self.live = mlflow_tracking.LiveRun(target["uri"], run_id, self.log.warning)
        self.log.info("MLflow run %s (experiment %s, %s): per-epoch metrics stream in", run_id, target["experiment"],
                      target["cell_key"])

    @property
    def on_epoch_end(self) -> Callable[[int, dict], None] | None:
        return self.live.log_epoch if self.live is not None else None

    @contextlib.contextmanager
    def energy(self) -> Iterator[Any]:
        """The energy tracker (process 0; None on the others), started now; the loop stops
        it after its last epoch (darel.epochs), this when the loop fails."""
        tracker = None
        if self.is_main:
            from darel.measure import EnergyTracker

            began = time.perf_counter()
            tracker = EnergyTracker(country_iso_code=self.carbon["country_iso_code"], pue=self.carbon["pue"],
                                    measure_power_secs=self.carbon["measure_power_secs"])
            tracker.start()
            self.log.info("energy tracker started in %.2f s", time.perf_counter() - began)
        try:
            yield tracker
        except BaseException:
            if tracker is not None:
                tracker.stop()
            raise

    def seal(self, path: str | Path, summary: dict, *, folder: bool = False,
             inputs: dict[str, str | None] | None = None) -> dict:
        """The run's record, sealed (process 0): ``path`` a file, or with ``folder`` the
        folder whose train.json also names the sha256 of every file beside it."""
        if not self.is_main:
            return summary
        if folder:
            return provenance.write_folder_record(path, "train.json", summary, inputs=inputs)
        return provenance.write_record(path, summary, inputs=inputs)


def curve_data(split: dict, curve_test: int | None) -> tuple[Any, Any]:
    """The (images, labels) of the per-epoch test curve: the test split's first ``curve_test``
    (all with None or more). The split is in a random order of its classes, so a prefix is a
    random sample of it; the curve only reports, it never steers a training, so its size
    changes no model, and the evaluation stage's top-1 uses the whole split."""
    x, y = split["test_x"], split["test_y"]
    return (x, y) if curve_test is None else (x[:curve_test], y[:curve_test])


def _checked_subset(subset_indices: np.ndarray | None, n_full: int) -> np.ndarray | None:
    """The training subset as int64 rows of the full training set (None: all of it); one line
    naming the shape and range when it is empty or leaves the set."""
    if subset_indices is None:
        return None
    subset = np.asarray(subset_indices, dtype=np.int64)
    if subset.ndim != 1 or len(subset) == 0 or subset.min() < 0 or subset.max() >= n_full:
        raise ValueError(f"subset indices must be a non-empty 1-D array within [0, {n_full}), got shape "
                         f"{subset.shape} range [{subset.min() if subset.size else None}, "
                         f"{subset.max() if subset.size else None}]")
    return subset


def _run_facts(model, split: dict, proto, spec: dict, plan, n_full: int, subset: np.ndarray | None, device,
               params: dict, method_plan) -> dict:
    """What train.json records about the run beside its figures: the model's size and cost,
    the data, the plan, the device and the parameters (counting MACs moves the model to
    the CPU)."""
    from darel.models import count_parameters
    from darel.models.hypercomplex import count_macs_per_image

    side = proto.input_size or split["meta"]["image_size"]
    input_shape = (split["meta"]["channels"], side, side)
    return {
        "n_params": count_parameters(model), "macs_per_image": count_macs_per_image(model.cpu(), input_shape),
        "input_shape": list(input_shape),
        "model_spec": spec, "n_train": int(n_full if subset is None else len(subset)), "n_train_full": int(n_full),
        "batch": plan.batch, "score_batch": plan.score_batch or plan.eval_batch, "eval_batch": plan.eval_batch,
        "lr_schedule": dataclasses.asdict(plan.lr_schedule),  # the run's resolved learning-rate rule
        "enforce": "plan" if plan.train_epochs else "wallclock" if plan.time_budget_s else "none",
        "dataset_label": split["meta"]["label"], "device": str(device), "params": params,
        "method_plan": method_plan.record() if method_plan is not None else None,
    }


def run_training(params: dict, *, data_dir: str, out_dir: str, log: logging.Logger, progress: bool = True,
                 method: plans.MethodPlan | None = None, subset_indices: np.ndarray | None = None,
                 inputs: dict[str, str] | None = None, eval_out: str | Path | None = None,
                 tracking: dict | None = None, input_files: dict[str, str | None] | None = None) -> dict:
    """Train one cell and write model.pt and train.json into ``out_dir``: the baseline
    (no ``method`` plan), or a method's run from its typed plan (darel.plans.method_plan:
    a DAREL or IDS + ADONIS cell of Table 1, a study method's). Its
    checkpoint (``ckpt.pt``) is resumed only when everything the result depends on is
    unchanged: the parameter slice, the data set's and every input file's content hash
    (``inputs``: name -> sha256), and the package's code version. The checkpoint stays
    after the outputs are written (the cell-record stage removes it once the workflow has
    accepted them). ``input_files`` (name -> file) go into train.json's identity, for
    the readers that check a training against the inputs they are given.

    With ``tracking`` ({uri, experiment, cell_key}) the cell's MLflow run starts now, with
    the full training settings as parameters, and every epoch's figures stream into it.

    ``eval_out``: the evaluation stage's eval.json, from the model in memory after the timed interval."""
    from darel import image_training
    from darel.stagekit import models as stage_models
    from darel.stagekit.models import model_spec, new_model, place_split, read_split, transforms

    settings = plans.ImageSettings.from_slice(params)
    out = Path(out_dir)
    # Everything that needs no GPU comes before the job's device turn (darel.devicelock):
    # on a profile with turns the previous job is still training meanwhile.
    run = TrainingRun(log, device=settings.runtime.device, threads=settings.runtime.threads, carbon=settings.carbon,
                      tracking=tracking, defer_turn=True, algorithm_search=settings.runtime.cudnn_benchmark)
    device = run.device
    host = read_split(data_dir)
    meta = host["meta"]
    proto = settings.protocol
    augment, normalise = transforms(meta, settings.augment, proto.input_size)
    spec = model_spec(settings.model, meta, proto)
    model = new_model(spec, settings.seed)

    plan = plans.run_plan(settings, method)
    log.info("run plan: %s", plan)
    n_full = len(host["train"]["labels"])
    subset = _checked_subset(subset_indices, n_full)

    run_plan = {k: v for k, v in plan.record().items() if k not in ("extra", "epoch_cost_s")}  # also in train.json
    run.follow({"params": params, "plan": run_plan},
               {"model": settings.model, "seed": settings.seed, "dataset_label": meta["label"]})
    # With device turns the energy tracker's start (about 1.5 s) comes before the wait too: it
    # meters the timed intervals alone (darel.measure.timing), so the wait adds no energy.
    # Elsewhere it starts next to the first epoch, as before: a CPU run's clock is its
    # process's CPU time, which counts the tracker's sampling thread as well.
    split = None if devicelock.turns_on(device.type) else place_split(host, device)
    with run.energy() as tracker:
        if split is None:
            split = place_split(host, device)
        fingerprint = {"params": params, "data": meta, "inputs": inputs or {},  # meta holds the sha256
                       "code": provenance.code_version()}
        # The data set's per-sample groups (the generated benchmark's categories, rare classes).
        groups = {name: (split["train_columns"][name].long(), len(names))
                  for name, names in composition.GROUPS.items() if name in split["train_columns"]}
        summary = image_training.train(model, split["train_x"], split["train_y"], augment, normalise, plan, device,
                                       subset=subset, energy=tracker, checkpoint_path=out / CHECKPOINT,
                                       eval_data=curve_data(split, settings.runtime.curve_test), progress=progress,
                                       fingerprint_extra=fingerprint, on_epoch_end=run.on_epoch_end, groups=groups)
    trained_by_group = summary.pop("trained_by_group")
    summary["composition"] = composition.summary(
        trained_by_group, {name: codes.bincount(minlength=size).tolist() for name, (codes, size) in groups.items()}
    ) if groups else None
    summary["energy_covers"] = summary["energy"].get("energy_covers")
    summary.update(_run_facts(model, split, proto, spec, plan, n_full, subset, device, params, method))
    summary["inputs"], summary["run_plan"] = inputs or {}, run_plan
    summary["code_version"] = provenance.code_version()
    stage_models.save_model(out / "model.pt", model, spec)
    # The weights' sha256 in the sealed record: every reader of model.pt checks it.
    summary["model_sha256"] = io.file_sha256(out / "model.pt")
    run.seal(out / "train.json", summary, inputs=input_files)
    log.info("trained %d/%d epochs in %.1f s, peak memory %.2f MiB (%s), energy %.3g kWh",
             summary["epochs_completed"], plan.epochs_to_run, summary["time_s"], summary["peak_mem_bytes"] / 2**20,
             summary["memory_source"], summary["energy"].get("energy_kwh", float("nan")))
    if eval_out is not None:  # model.to: counting MACs moved it to the CPU
        stage_models.write_test_evaluation(eval_out, model.to(device), split, normalise, spec, params,
                                           out / "train.json", log)
    return summary


def run_finetuning(params: dict, *, data_dir: str, tokenizer_dir: str, model_dir: str, losses: str | None,
                   out_dir: str, checkpoint: str | None, log: logging.Logger, progress: bool = True,
                   tracking: dict | None = None) -> dict:
    """One LoRA fine-tuning of Tables 2/3 on its run level: the pretrained model at
    ``model_dir`` adapted on all training pairs (the LoRA baseline) or on the pairs the
    cell's method picks (darel.plans.finetune_indices: DAREL's highest-loss alpha by the
    scorer's ``losses``, a random or lowest-loss alpha). Under torchrun each process takes
    its share of every global batch; process 0 alone measures energy, writes the adapter
    and train.json into ``out_dir``. ``checkpoint`` (outside ``out_dir``) is resumed when it
    belongs to this run."""

    from darel import distributed
    from darel.nlg import lm, schemas
    from darel.nlg import tokenizer as ntok
    from darel.step import resolve_precision

    with TrainingRun(log, device=params["device"], threads=params["threads"], carbon=params["carbon"],
                     tracking=tracking, processes=True, deterministic=True) as run:
        world, device = run.world, run.device
        log.info("process %d of %d on %s", world.rank, world.size, device)
        for folder, record in ((data_dir, "meta.json"), (tokenizer_dir, "lengths.json"), (model_dir, "pretrain.json")):
            provenance.check_folder(folder, record)
        tok = ntok.load_tokenizer(tokenizer_dir)
        pairs = schemas.training_pairs(schemas.read_split(Path(data_dir) / "train.jsonl"))
        n_full = len(pairs)
        settings = plans.FinetuneSettings.from_slice(params)
        scores = provenance.read_sealed_npz(losses)["loss"] if losses else None
        if scores is not None and len(scores) != n_full:
            fail(log, f"{losses} holds {len(scores)} losses for {n_full} training pairs (another data set?); "
                      f"{provenance.how_to_recreate(losses)}")
        pairs = [pairs[i] for i in plans.finetune_indices(settings, n_full, scores)]
        model = lm.add_lora(lm.build_lm(model_dir), **params["lora"], seed=params["seed"]).to(device)
        ft = params["finetune"]
        distributed.barrier(world)
        run.follow({"params": params}, {"model": params.get("model"), "seed": params["seed"]})
        with run.energy() as tracker:  # read around every epoch's steps and stopped by finetune
            summary = lm.finetune(model, tok, pairs, epochs=ft["epochs"], batch_size=ft["batch"], lr=ft["lr"],
                                  betas=tuple(ft["betas"]), weight_decay=ft["weight_decay"],
                                  warmup_steps=ft["warmup_steps"], label_smoothing=ft["label_smoothing"],
                                  max_length=lm.max_length_of(ft, tokenizer_dir), device=device,
                                  seed=params["seed"], precision=params["precision"], progress=progress,
                                  checkpoint_path=checkpoint, energy=tracker, on_epoch_end=run.on_epoch_end,
                                  fingerprint_extra={"params": params, "code": provenance.code_version(),
                                                     "losses": io.file_sha256(losses) if losses else None})
        # The memory budget is per device: the largest peak of any process.
        summary["peak_mem_bytes"] = int(distributed.all_reduce([summary["peak_mem_bytes"]], world, op="max")[0])
        if run.is_main:
            io.save_folder(out_dir)  # no link out of the project inside it
            model.save_pretrained(out_dir)
            summary.update({"n_train": len(pairs), "precision": resolve_precision(params["precision"], device),
                            "n_train_full": n_full, "alpha": params["alpha"], "device": str(device),
                            "processes": world.size, "params": params})
            run.seal(out_dir, summary, folder=True)
            log.info("fine-tuned on %d of %d pairs in %.1f s on %d process(es)", len(pairs), n_full,
                     summary["time_s"], world.size)
    return summary
