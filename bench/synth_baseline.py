"""The generated benchmark's baseline over ten training seeds (issue 28): the quick
profile's ResNet18 baseline, exactly as the pretrain stage trains it, on one data set
(the seed of the data fixed) with training seeds 0-9. Prints each run's CPU time, its
final test top-1, the mean and standard deviation over seeds, and how much the test
curve still rises after 20 % of the epochs; plots the curves.

    .venv/bin/python bench/synth_baseline.py --jobs 2 --figure docs/figures/synth_baselines.png   # ten seeds
    .venv/bin/python bench/synth_baseline.py --seeds 3 --set '{"profiles": {"quick": {"models": {"resnet18": {"epochs": 20}}}}}'
    .venv/bin/python bench/synth_baseline.py --from-build /work/study4 --figure docs/figures/synth_baselines_study4.png

``--from-build`` trains nothing: it reads the baselines a study build already trained
(runs/<profile>/table1/resnet18/s<seed>/baseline: the per-epoch curve from train.json, the
final top-1 on the whole test set from eval.json) and reports and plots them the same way.

Figures come from whatever machine runs it: CPU seconds of the process per run (torch on
the profile's one thread), so another job beside it changes them little; say the load.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import statistics
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from darel import config, data  # noqa: E402


def build_data(cfg: dict, folder: Path) -> tuple[dict, float]:
    params = config.dataset_params(cfg)
    started = time.process_time()
    train, test, meta = data.build_dataset(params, ROOT / "data/raw", progress=False)
    seconds = time.process_time() - started
    data.write_dataset(folder, train, test, meta)
    return meta, seconds


def train_seed(cfg: dict, seed: int, data_dir: Path, out: Path) -> dict:
    """One baseline, as the pretrain stage trains it; CPU seconds of this process around it."""
    from darel.stagekit.training import run_training

    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    log = logging.getLogger("synth_baseline")
    params = config.training_params(cfg, "resnet18", seed)
    started = time.process_time()
    summary = run_training(params, data_dir=str(data_dir), out_dir=str(out), log=log, progress=False)
    return {"seed": seed, "cpu_s": time.process_time() - started, "time_s": summary["time_s"],
            "curve": summary["curves"]["test_top1"], "train_curve": summary["curves"]["train_top1"],
            "top1": summary["curves"]["test_top1"][-1]}


def rise_after(curve: list[float], share: float = 0.2) -> tuple[int, float]:
    """The epoch (1-based) at ``share`` of the run and how much the test top-1 rose from it to the end."""
    epoch = max(1, math.ceil(share * len(curve)))
    return epoch, curve[-1] - curve[epoch - 1]


def plot(runs: list[dict], meta: dict, path: Path, epochs: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    x = range(1, epochs + 1)
    for run in runs:
        ax.plot(x, run["curve"], color="tab:blue", alpha=0.35, lw=1)
        ax.plot(x, run["train_curve"], color="tab:orange", alpha=0.25, lw=1)
    mean = [statistics.mean(r["curve"][i] for r in runs) for i in range(epochs)]
    ax.plot(x, mean, color="tab:blue", lw=2.2, label=f"test top-1, mean of {len(runs)} seeds")
    ax.plot([], [], color="tab:orange", label="train top-1 (augmented, noisy labels)")
    edge = max(1, math.ceil(0.2 * epochs))
    ax.axvline(edge, color="grey", ls=":", lw=1)
    ax.text(edge, 2, " 20 % of the epochs", color="grey", fontsize=8)
    ax.axhline(300 / meta["num_classes"], color="grey", ls="--", lw=0.8)
    ax.text(epochs, 300 / meta["num_classes"], "3x chance ", ha="right", va="bottom", color="grey", fontsize=8)
    ax.set(xlabel="epoch", ylabel="top-1 (%)", ylim=(0, 100), xlim=(1, epochs))
    fig.suptitle(f"ResNet18 baseline, quick profile, training seeds {runs[0]['seed']}-{runs[-1]['seed']}", fontsize=10)
    ax.set_title(textwrap.fill(meta["label"], 120), fontsize=6.5)
    finals = [r["top1"] for r in runs]
    ax.errorbar([epochs], [statistics.mean(finals)], yerr=[statistics.stdev(finals) if len(finals) > 1 else 0],
                fmt="o", color="black", ms=4, capsize=3, label="final top-1 on the whole test set (mean ± sd)")
    ax.set_xlim(1, epochs + 0.8)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def runs_of_build(build: Path, profile: str) -> tuple[list[dict], dict]:
    """The baselines of an existing build, each as ``train_seed`` returns it (``cpu_s`` is the
    timed training, the only clock a build records per run), and the data's meta."""
    runs = []
    for folder in sorted((build / "runs" / profile / "table1" / "resnet18").glob("s*/baseline"),
                         key=lambda f: int(f.parent.name[1:])):
        if not (folder / "eval.json").exists():
            continue
        train = json.loads((folder / "train.json").read_text())
        top1 = json.loads((folder / "eval.json").read_text())["top1"]
        runs.append({"seed": int(folder.parent.name[1:]), "cpu_s": train["time_s"], "time_s": train["time_s"],
                     "curve": train["curves"]["test_top1"], "train_curve": train["curves"]["train_top1"],
                     "top1": top1})
    if not runs:
        raise SystemExit(f"synth_baseline: no evaluated baseline under {build}/runs/{profile}/table1/resnet18")
    meta = json.loads((build / "data" / profile / "meta.json").read_text())
    return runs, meta


def report(runs: list[dict], meta: dict) -> None:
    for run in runs:
        epoch, rise = rise_after(run["curve"])
        print(f"seed {run['seed']}: top-1 {run['top1']:.2f} %, CPU {run['cpu_s']:.1f} s (timed training "
              f"{run['time_s']:.1f} s), test top-1 at epoch {epoch} {run['curve'][epoch - 1]:.2f} % -> "
              f"+{rise:.2f} pp to the end of the curve", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=10, help="training seeds first .. first + seeds - 1")
    ap.add_argument("--first", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=1, help="seeds trained at once, one process each (one torch thread)")
    ap.add_argument("--profile", default="quick")
    ap.add_argument("--size", default="cpu", help="the datasets.synth.sizes entry")
    ap.add_argument("--set", default="{}", help="JSON merged over params.yaml (tuning)")
    ap.add_argument("--out", default=str(ROOT / "bench/out/synth_baseline"))
    ap.add_argument("--figure", default=None, help="write the curves here (e.g. docs/figures/synth_baselines.png)")
    ap.add_argument("--from-build", default=None, help="read the baselines of this build instead of training")
    args = ap.parse_args()
    if args.from_build:
        runs, meta = runs_of_build(Path(args.from_build), args.profile)
        print(f"data: {meta['label']}\nbaselines read from {args.from_build} (nothing trained)")
        report(runs, meta)
        summarise(runs, meta, args.figure)
        return
    overrides = json.loads(args.set)
    profile = {"dataset": "synth", "dataset_size": args.size}
    cfg = config.load_params(ROOT / "params.yaml", config.merge({"profile": args.profile,
                                                                 "profiles": {args.profile: profile}}, overrides))
    out = Path(args.out)
    meta, gen_s = build_data(cfg, out / "data")
    proto = config.model_protocol(cfg, "resnet18")
    print(f"data: {meta['label']}")
    print(f"generation: {gen_s:.2f} s CPU; protocol: width {proto['width']}, batch {proto['batch']}, lr {proto['lr']}, "
          f"{proto['epochs']} epochs, milestones {proto['milestones']}, eval every {cfg['profiles'][args.profile]['eval_every']}")
    import multiprocessing

    seeds = list(range(args.first, args.first + args.seeds))
    # A fresh process per seed: its CPU clock counts that run alone.
    with multiprocessing.get_context("spawn").Pool(args.jobs, maxtasksperchild=1) as pool:
        pending = [pool.apply_async(train_seed, (cfg, seed, out / "data", out / f"s{seed}")) for seed in seeds]
        runs = []
        for job in pending:
            runs.append(job.get())
            report(runs[-1:], meta)
    summarise(runs, meta, args.figure)


def summarise(runs: list[dict], meta: dict, figure: str | None) -> None:
    finals = [r["top1"] for r in runs]
    rises = [rise_after(r["curve"])[1] for r in runs]
    cpu = [r["cpu_s"] for r in runs]
    std = statistics.stdev(finals) if len(finals) > 1 else float("nan")
    print(f"final top-1 over {len(runs)} seeds: mean {statistics.mean(finals):.2f} %, std {std:.2f} pp, "
          f"min {min(finals):.2f}, max {max(finals):.2f} (chance {100 / meta['num_classes']:.1f} %)")
    print(f"rise after 20 % of the epochs (epoch {rise_after(runs[0]['curve'])[0]} -> {len(runs[0]['curve'])}): "
          f"mean +{statistics.mean(rises):.2f} pp, min +{min(rises):.2f} pp")
    print("time per run (CPU s of training and per-epoch test evaluation; read from a build: its timed training): "
          f"mean {statistics.mean(cpu):.1f} s, "
          f"max {max(cpu):.1f} s")
    if figure:
        plot(runs, meta, Path(figure), len(runs[0]["curve"]))
        print(f"wrote {figure}")


if __name__ == "__main__":
    main()
