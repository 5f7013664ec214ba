"""Pilot for budget.lr_rule (issue 28): which learning rate a budgeted run should use at a
calibrated batch below the protocol's. On the quick profile's generated benchmark (built
by bench/synth_baseline.build_data), the quick ResNet18 trains all the data at ``--batch``
(default 8, the batch the quick B(0.5, 0.55) budget calibrates) for ``--epochs`` (default
5) of the protocol's 20, once per rule and training seed:

* keep: the protocol's rate (0.1) at the reduced batch (the paper);
* linear: the rate scaled by batch / protocol batch (0.1 * 8 / 32 = 0.025).

The plan is darel.plans' own (``_protocol_plan`` at the batch), its rate ``batch_lr``'s
under the rule and its schedule ``darel.schedules.epochwise``, the pieces
``darel.plans.lr_schedule`` builds every run's rate from. ``--schedule cut`` (default) trains the first
epochs of the protocol's schedule, as Table 1 does under ``budget.schedule: keep`` (with
milestones at 6/12/16 of 20, five epochs never reach the first decay); ``rescale``
compresses the schedule to the trained epochs (``budget.schedule: rescale``). No online
selection: the question is the rate at the batch, not DAREL's subset.

Prints per rule the final test top-1 (mean and std over seeds) and how much the test curve
rose from the first epoch to the last; ``--baseline-seeds N`` adds the protocol's baseline
at its own batch (20 epochs, as the pretrain stage trains it) for the first N seeds.

    .venv/bin/python bench/lr_rule_pilot.py --seeds 6 --out bench/results/lr_rule_pilot.json

Figures are CPU seconds of each run's own process (a fresh one per run, one torch thread).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from darel import config  # noqa: E402
from synth_baseline import build_data, rise_after, train_seed  # noqa: E402

RULES = ("keep", "linear")


def train_reduced(cfg: dict, seed: int, rule: str, batch: int, epochs: int, schedule: str, data_dir: Path) -> dict:
    """One run of the quick ResNet18 at ``batch`` for ``epochs`` under ``rule``; CPU seconds
    of this process around the training (with its per-epoch test evaluation)."""
    from darel import image_training, plans, runtime, schedules
    from darel.stagekit.models import load_split, model_spec, new_model, transforms

    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    params = {**config.training_params(cfg, "resnet18", seed), "budget": {**cfg["budget"], "lr_rule": rule}}
    settings = plans.ImageSettings.from_slice(params)
    device = runtime.resolve_device(settings.runtime.device)
    runtime.configure_runtime(device, settings.runtime.threads)
    split = load_split(data_dir, device)
    proto = settings.protocol
    augment, normalise = transforms(split["meta"], settings.augment, proto.input_size)
    model = new_model(model_spec(settings.model, split["meta"], proto), settings.seed)
    rate = schedules.epochwise(proto.schedule, plans.batch_lr(proto, batch, settings.lr_rule), milestones=proto.milestones,
                               gamma=proto.lr_gamma, epochs=proto.epochs, span=epochs if schedule == "rescale" else None)
    plan = plans._protocol_plan(settings, batch, rate, train_epochs=epochs)
    started = time.process_time()
    summary = image_training.train(model, split["train_x"], split["train_y"], augment, normalise, plan, device,
                                   eval_data=(split["test_x"], split["test_y"]), progress=False)
    curve = summary["curves"]["test_top1"]
    return {"rule": rule, "seed": seed, "batch": plan.batch, "lr": plan.lr_schedule.base, "epochs": epochs,
            "cpu_s": time.process_time() - started, "time_s": summary["time_s"], "curve": curve,
            "lr_curve": summary["curves"].get("lr"), "top1": curve[-1]}


def describe(runs: list[dict]) -> dict:
    finals = [r["top1"] for r in runs]
    rises = [r["curve"][-1] - r["curve"][0] for r in runs]
    return {"n": len(runs), "top1_mean": statistics.mean(finals),
            "top1_std": statistics.stdev(finals) if len(finals) > 1 else float("nan"),
            "rise_mean": statistics.mean(rises), "cpu_s_mean": statistics.mean(r["cpu_s"] for r in runs),
            "cpu_s_total": sum(r["cpu_s"] for r in runs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=6, help="training seeds 0 .. seeds - 1")
    ap.add_argument("--batch", type=int, default=8, help="the reduced batch (the quick B(0.5, 0.55) calibrates 8)")
    ap.add_argument("--epochs", type=int, default=5, help="epochs trained of the protocol's")
    ap.add_argument("--schedule", choices=("cut", "rescale"), default="cut",
                    help="cut: the protocol's schedule stopped early (budget.schedule: keep); rescale: compressed")
    ap.add_argument("--rules", default=",".join(RULES))
    ap.add_argument("--baseline-seeds", type=int, default=0, help="also the baseline at the protocol's batch")
    ap.add_argument("--jobs", type=int, default=1, help="runs at once, one process each (one torch thread)")
    ap.add_argument("--work", default=str(ROOT / "bench/out/lr_rule_pilot"), help="the generated data set's folder")
    ap.add_argument("--out", default=None, help="write the results here (JSON)")
    args = ap.parse_args()
    rules = args.rules.split(",")
    cfg = config.load_params(ROOT / "params.yaml", {"profile": "quick"})
    proto = config.model_protocol(cfg, "resnet18")
    work = Path(args.work)
    meta, gen_s = build_data(cfg, work / "data")
    print(f"data: {meta['label']} (generated in {gen_s:.1f} s CPU)")
    print(f"protocol: batch {proto['batch']}, lr {proto['lr']}, {proto['epochs']} epochs, milestones "
          f"{proto['milestones']}; pilot: batch {args.batch}, {args.epochs} epochs ({args.schedule}), "
          f"seeds 0-{args.seeds - 1}, rules {rules}", flush=True)
    import multiprocessing

    wall = time.monotonic()
    tasks = [(rule, seed) for seed in range(args.seeds) for rule in rules]  # rules interleaved: load hits both
    with multiprocessing.get_context("spawn").Pool(args.jobs, maxtasksperchild=1) as pool:
        pending = [pool.apply_async(train_reduced, (cfg, seed, rule, args.batch, args.epochs, args.schedule,
                                                    work / "data")) for rule, seed in tasks]
        runs = []
        for job in pending:
            run = job.get()
            runs.append(run)
            print(f"{run['rule']:>6} seed {run['seed']}: lr {run['lr']:g}, top-1 {run['top1']:.2f} % "
                  f"(epoch 1 {run['curve'][0]:.2f} %), CPU {run['cpu_s']:.1f} s", flush=True)
        base_pending = [pool.apply_async(train_seed, (cfg, seed, work / "data", work / f"baseline_s{seed}"))
                        for seed in range(args.baseline_seeds)]
        baseline = [job.get() for job in base_pending]
    summary = {rule: describe([r for r in runs if r["rule"] == rule]) for rule in rules}
    for rule in rules:
        s = summary[rule]
        lr = next(r["lr"] for r in runs if r["rule"] == rule)
        print(f"{rule:>6} (lr {lr:g}): final top-1 {s['top1_mean']:.2f} +- {s['top1_std']:.2f} % over {s['n']} seeds, "
              f"rise epoch 1 -> {args.epochs} +{s['rise_mean']:.2f} pp, CPU {s['cpu_s_mean']:.1f} s per run")
    if baseline:
        finals = [b["top1"] for b in baseline]
        base = {"n": len(baseline), "top1_mean": statistics.mean(finals),
                "top1_std": statistics.stdev(finals) if len(finals) > 1 else float("nan"),
                "top1_at_epoch": {str(args.epochs): statistics.mean(b["curve"][args.epochs - 1] for b in baseline)},
                "rise_after_20pc_mean": statistics.mean(rise_after(b["curve"])[1] for b in baseline),
                "cpu_s_mean": statistics.mean(b["cpu_s"] for b in baseline)}
        summary["baseline"] = base
        print(f"baseline (batch {proto['batch']}, lr {proto['lr']}, {proto['epochs']} epochs): final top-1 "
              f"{base['top1_mean']:.2f} +- {base['top1_std']:.2f} % over {base['n']} seeds; at epoch {args.epochs} "
              f"{base['top1_at_epoch'][str(args.epochs)]:.2f} %; CPU {base['cpu_s_mean']:.1f} s per run")
    print(f"wall time {time.monotonic() - wall:.0f} s")
    if args.out:
        out = {"settings": {**vars(args), "protocol": {k: proto[k] for k in ("batch", "lr", "epochs", "milestones")},
                            "data": meta["label"]},
               "summary": summary, "runs": runs,
               "baseline_runs": [{k: b[k] for k in ("seed", "top1", "cpu_s", "curve")} for b in baseline]}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
