"""Candidate regimes where the ResNet18 baseline fits its training set (issue 50, item 2).

    python bench/fit_regime_pilot.py --candidates c20n1000w8e40 --seeds 300 --jobs 2
    python bench/fit_regime_pilot.py --list
    python bench/fit_regime_pilot.py --study-pilot-params bench/out/fit_pilot.yaml --seeds 300,301 --budget 0.5,0.8

The last writes a params file for a pilot study on the fit profile (DAREL and random at one
budget, no controls), to run with ``snakemake ... --config params_file=<it>``
(bench/results/fit_regime_pilot.md).

Each candidate is a size of the generated benchmark (a datasets.synth.sizes entry: classes,
training and test samples, image side) and the ResNet18's width, batch, epochs and
milestones (a profile's models.resnet18 entry); everything else is params.yaml's (the
benchmark's label noise, duplicates, hard mixtures, rare classes, nuisance and augmentation
stay). For each candidate and training seed it builds the data once, trains the baseline
exactly as the pretrain stage does (darel.stagekit.training.run_training, one process per
run, the profile's one torch thread), then measures on the saved model:

* training top-1 on the whole training set against its observed labels (eval mode, no
  augmentation), and apart on the clean samples and on the label-noise samples (a model
  that fits its training set has memorised the wrong labels too);
* test top-1 on the whole test set, and the per-epoch test curve's last quarter (its range,
  its change from the quarter's first epoch to the last, and the least-squares line's rise);
* chance (100 / classes), and the CPU and wall seconds of the run's process around the
  training (its set-up, the training and the per-epoch curve; not the measurements after).

Figures come from whatever machine runs it; say the load beside them.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from darel import config  # noqa: E402
from darel.study import last_quarter  # noqa: E402  (the study's verdict measures a build's baselines the same way)

# name -> (synth size, resnet18 protocol overrides). Milestones at 30/60/80 % of the
# epochs and a 5 % warm-up, as the quick profile's.
def _candidate(classes: int, n_train: int, width: int, epochs: int) -> tuple[str, tuple[dict, dict]]:
    size = {"num_classes": classes, "n_train": n_train, "n_test": 500 * classes, "image_size": 16,
            "classes_per_group": 4 if classes == 20 else 2}
    protocol = {"width": width, "batch": 32, "epochs": epochs,
                "milestones": [round(epochs * share) for share in (0.3, 0.6, 0.8)], "warmup_epochs": epochs // 20}
    return f"c{classes}n{n_train}w{width}e{epochs}", (size, protocol)


CANDIDATES: dict[str, tuple[dict, dict]] = dict(_candidate(*spec) for spec in (
    (20, 1000, 8, 40), (20, 1000, 4, 60), (10, 500, 8, 60), (20, 1000, 16, 40), (20, 500, 8, 120),
    (20, 1000, 12, 60), (10, 500, 8, 100), (20, 1000, 8, 120)))
CHOSEN = "c20n500w8e120"   # params.yaml's fit profile and datasets.synth.sizes.fit (tests/test_fit_regime.py)
PROFILE = "quick"   # the candidate's profile: quick's runtime (cpu, one thread, curve on 500 test images)
SIZE = "fit_candidate"


def candidate_config(name: str, history_size: int) -> dict:
    size, model = CANDIDATES[name]
    overrides = {"profile": PROFILE, "darel": {"history_size": history_size},
                 "datasets": {"synth": {"sizes": {SIZE: size}}},
                 "profiles": {PROFILE: {"dataset": "synth", "dataset_size": SIZE, "models": {"resnet18": model}}}}
    return config.load_params(ROOT / "params.yaml", overrides)


def measure_fit(model_path: Path, data_dir: Path, augment: dict, batch: int) -> dict:
    """Top-1 of a saved model on the whole training set (all, clean, label-noise) and the test set."""
    import torch

    from darel.evaluation import predictions, training_set_fit
    from darel.stagekit.models import load_model, load_split, transforms

    device = torch.device("cpu")
    split = load_split(data_dir, device)
    _, normalise = transforms(split["meta"], augment)
    model, _ = load_model(model_path, device)
    model.eval()
    with torch.no_grad():
        train_pred = predictions(model, split["train_x"], normalise, batch)
        test_pred = predictions(model, split["test_x"], normalise, batch)
    fit = training_set_fit(train_pred, split["train_y"], split["train_columns"]["category"])
    return {**fit, "test_top1": 100.0 * (test_pred == split["test_y"]).float().mean().item()}


def run_one(name: str, seed: int, history_size: int, data_dir: Path, out: Path) -> dict:
    """One candidate baseline in this process: train it as the pretrain stage does, then measure it."""
    from darel.stagekit.training import run_training

    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    cfg = candidate_config(name, history_size)
    params = config.training_params(cfg, "resnet18", seed)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    summary = run_training(params, data_dir=str(data_dir), out_dir=str(out),
                           log=logging.getLogger("fit_regime_pilot"), progress=False)
    train_cpu, train_wall = time.process_time() - cpu0, time.perf_counter() - wall0
    fit = measure_fit(out / "model.pt", data_dir, params["augment"], int(cfg["profiles"][PROFILE]["eval_batch"]))
    curve = summary["curves"]["test_top1"]
    return {"candidate": name, "seed": seed, "train_cpu_s": train_cpu, "train_wall_s": train_wall,
            "timed_training_s": summary["time_s"], "curve": curve, "last_quarter": last_quarter(curve),
            "loop_train_top1": summary["curves"]["train_top1"][-1], **fit}


def build_data(name: str, history_size: int, folder: Path) -> dict:
    from darel import data

    cfg = candidate_config(name, history_size)
    train, test, meta = data.build_dataset(config.dataset_params(cfg), ROOT / "data/raw", progress=False)
    data.write_dataset(folder, train, test, meta)
    return meta


def line(row: dict, chance: float) -> str:
    q = row["last_quarter"]
    return (f"| {row['candidate']} | {row['seed']} | {row['train_top1']:.2f} | {row['train_clean_top1']:.2f} | "
            f"{row['train_noisy_top1']:.2f} | {row['test_top1']:.2f} | {chance:.1f} | epochs {q['from_epoch']}-"
            f"{len(row['curve'])}: range {q['range_pp']:.2f}, line's rise {q['rise_pp']:+.2f} | "
            f"{row['train_cpu_s']:.0f} | {row['train_wall_s']:.0f} |")


def study_pilot_params(seeds: list[int], budget: list[float], history_size: int) -> dict:
    """params.yaml with the fit profile active and a pilot study of the primary comparison
    only: DAREL and random at one budget over ``seeds``, no controls (a --config override
    cannot drop them: a params_file copy can)."""
    from darel.config import read_yaml

    cfg = read_yaml(ROOT / "params.yaml")
    cfg["profile"] = "fit"
    cfg["darel"]["history_size"] = history_size
    cfg["study"]["seeds"] = seeds
    table1 = cfg["study"]["table1"]
    table1["budgets"]["fit"] = [budget]
    table1["methods"] = ["darel", "random"]
    table1.pop("validation", None)
    config.validate(cfg)
    return cfg


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--candidates", default=",".join(CANDIDATES), help="comma-separated names (--list shows them)")
    ap.add_argument("--seeds", default="300", help="comma-separated training seeds")
    ap.add_argument("--jobs", type=int, default=1, help="runs at once, one process each (one torch thread)")
    ap.add_argument("--history-size", type=int, default=120, help="darel.history_size (no effect on a baseline)")
    ap.add_argument("--out", default=str(ROOT / "bench/out/fit_regime_pilot"))
    ap.add_argument("--json", default=None, help="also write every row (with its curve) here")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--study-pilot-params", default=None, metavar="PATH",
                    help="write a params file for a pilot study (DAREL and random at --budget over --seeds, "
                         "the fit profile) and exit; run it with snakemake --config params_file=PATH")
    ap.add_argument("--budget", default="0.5,0.8", help="t,m of --study-pilot-params")
    args = ap.parse_args()
    if args.study_pilot_params:
        import yaml

        budget = [float(v) for v in args.budget.split(",")]
        cfg = study_pilot_params([int(s) for s in args.seeds.split(",")], budget, args.history_size)
        Path(args.study_pilot_params).write_text(yaml.safe_dump(cfg, sort_keys=False))
        print(f"wrote {args.study_pilot_params}")
        return
    if args.list:
        for name, (size, model) in CANDIDATES.items():
            print(f"{name}: size {size}; resnet18 {model}")
        return
    names = args.candidates.split(",")
    unknown = [n for n in names if n not in CANDIDATES]
    if unknown:
        raise SystemExit(f"fit_regime_pilot: unknown candidate {unknown[0]!r}; known: {', '.join(CANDIDATES)}")
    seeds = [int(s) for s in args.seeds.split(",")]
    out = Path(args.out)
    metas = {name: build_data(name, args.history_size, out / name / "data") for name in names}
    import multiprocessing

    print("| candidate | seed | train top-1 (all) | clean | label-noise (observed label) | test top-1 | chance | "
          "test curve, last quarter (pp) | CPU s | wall s |")
    print("|---|---|---|---|---|---|---|---|---|---|", flush=True)
    rows = []
    # A fresh process per run: its CPU clock counts that run alone.
    with multiprocessing.get_context("spawn").Pool(args.jobs, maxtasksperchild=1) as pool:
        pending = [pool.apply_async(run_one, (n, s, args.history_size, out / n / "data", out / n / f"s{s}"))
                   for n in names for s in seeds]
        for job in pending:
            rows.append(job.get())
            print(line(rows[-1], 100.0 / metas[rows[-1]["candidate"]]["num_classes"]), flush=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"candidates": {n: CANDIDATES[n] for n in names},
                                               "labels": {n: metas[n]["label"] for n in names}, "rows": rows},
                                              indent=1) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
