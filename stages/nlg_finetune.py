"""Stage "fine-tuning" for Tables 2/3: LoRA on the pretrained GPT-2, on all training
pairs (the LoRA baseline) or on the DAREL offline subset (Algorithm 2 without classes:
the ceil(alpha*n) pairs ranked by the scorer's loss), under the energy tracker.

Several processes (``finetune.processes`` > 1, the paper's two GPUs) are started by
torchrun, which the workflow puts in front of this script; each process joins the group
here, takes its share of every global batch, and process 0 alone measures energy,
writes the adapter and train.json."""

from __future__ import annotations

import os
from pathlib import Path

from darel import distributed, io, plans, provenance, runtime, stagekit
from darel.measure import EnergyTracker
from darel.nlg import schemas
from darel.nlg import lm, tokenizer as ntok
from darel.step import resolve_precision


def main() -> None:
    ap = stagekit.parser(__doc__)
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--tokenizer-dir", required=True)
    ap.add_argument("--model-dir", required=True, help="the pretrained model to adapt")
    ap.add_argument("--losses", help="the scorer's per-sample losses (absent for the LoRA baseline)")
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--checkpoint", help="per-epoch checkpoint (outside --out-dir, which Snakemake removes when a "
                                         "job fails): an interrupted job resumes from it; the report stage "
                                         "removes it once the workflow has accepted the adapter")
    stagekit.add_tracking_args(ap)
    args = ap.parse_args()
    main_process = int(os.environ.get("RANK", "0")) == 0
    params, log = stagekit.start(args, "nlg_finetune", writes=Path(args.out_dir).parent if main_process else None)
    world = distributed.join(runtime.resolve_device(params["device"]))
    device = world.device
    runtime.configure_runtime(device, params["threads"], deterministic=True)
    log.info("process %d of %d on %s", world.rank, world.size, device)
    for folder, record in ((args.data_dir, "meta.json"), (args.tokenizer_dir, "lengths.json"),
                           (args.model_dir, "pretrain.json")):
        provenance.check_folder(folder, record)
    tok = ntok.load_tokenizer(args.tokenizer_dir)
    pairs = schemas.training_pairs(schemas.read_split(Path(args.data_dir) / "train.jsonl"))
    n_full = len(pairs)
    settings = plans.FinetuneSettings.from_slice(params)
    losses = provenance.read_sealed_npz(args.losses)["loss"] if args.losses else None
    if losses is not None and len(losses) != n_full:
        stagekit.fail(log, f"{args.losses} holds {len(losses)} losses for {n_full} training pairs (another data "
                           f"set?); {provenance.how_to_recreate(args.losses)}")
    pairs = [pairs[i] for i in plans.finetune_indices(settings, n_full, losses)]
    model = lm.add_lora(lm.build_lm(args.model_dir), **params["lora"], seed=params["seed"]).to(device)
    ft = params["finetune"]
    carbon = params["carbon"]
    tracker = EnergyTracker(country_iso_code=carbon["country_iso_code"], pue=carbon["pue"],
                            measure_power_secs=carbon["measure_power_secs"]) if world.is_main else None
    distributed.barrier(world)
    live = None
    target = stagekit.tracking_target(args)
    if target is not None and world.is_main:
        from darel import tracking

        try:
            run_id = tracking.start_cell_run(target["uri"], target["experiment"], target["cell_key"],
                                             {"params": params}, {"profile": target["cell_key"].split("/")[0],
                                                                  "model": params["model"], "seed": params["seed"],
                                                                  "stage": "training"})
        except tracking.TrackingError as err:
            stagekit.fail(log, f"MLflow: {err}")
        live = tracking.LiveRun(target["uri"], run_id, log.warning)
    if tracker:
        tracker.start()
    try:  # the tracker is read around every epoch's steps and stopped by finetune
        summary = lm.finetune(model, tok, pairs, epochs=ft["epochs"], batch_size=ft["batch"], lr=ft["lr"],
                              betas=tuple(ft["betas"]), weight_decay=ft["weight_decay"],
                              warmup_steps=ft["warmup_steps"], label_smoothing=ft["label_smoothing"],
                              max_length=lm.max_length_of(ft, args.tokenizer_dir), device=device,
                              seed=params["seed"], precision=params["precision"],
                              progress=not args.no_progress, checkpoint_path=args.checkpoint, energy=tracker,
                              on_epoch_end=live.log_epoch if live else None,
                              fingerprint_extra={"params": params, "code": provenance.code_version(),
                                                 "losses": io.file_sha256(args.losses) if args.losses else None})
    except BaseException:
        if tracker:
            tracker.stop()
        raise
    # The memory budget is per device: the largest peak of any process.
    summary["peak_mem_bytes"] = int(distributed.all_reduce([summary["peak_mem_bytes"]], world, op="max")[0])
    if world.is_main:
        model.save_pretrained(args.out_dir)
        summary.update({"n_train": len(pairs), "precision": resolve_precision(params["precision"], device),
                        "n_train_full": n_full, "alpha": params["alpha"], "device": str(device),
                        "processes": world.size, "params": params})
        provenance.write_folder_record(args.out_dir, "train.json", summary)
        log.info("fine-tuned on %d of %d pairs in %.1f s on %d process(es)", len(pairs), n_full,
                 summary["time_s"], world.size)
    distributed.barrier(world)
    distributed.leave(world)


if __name__ == "__main__":
    main()
