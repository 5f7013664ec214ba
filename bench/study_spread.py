"""Where does a study cell's seed-to-seed spread come from? Two exploratory diagnostics on
the trained models and curves of a finished Table 1 study build folder (issue 28).

1. BatchNorm statistics. A cell trained at a small batch (B(0.5, 0.55) on the quick
   profile: batch 8) ends with BatchNorm running means and variances averaged, at momentum
   0.1, over its last few dozen batches of 8 augmented samples, and the test pass uses
   them. Every model is evaluated as trained, then with each BatchNorm layer's statistics
   re-estimated as an equal-weight average over one pass of the training images (no
   labels, no augmentation, batches of 256, weights untouched: "precise BN"). If the
   statistics were the noise, the spread would shrink.
2. When the spread is set. From each run's per-epoch test curve (train.json): the spread
   over seeds after the first epoch, at 30 % of the epochs (the first learning-rate cut of
   the matched schedule) and at the end, and the correlation over seeds of each with the
   final top-1. A high correlation at 30 % means the seeds' order was fixed in the
   high-rate phase and the decay kept it.

Per cell and method it prints mean and standard deviation over seeds both ways, the
standard deviation of DAREL's paired differences with each control both ways, and the
curve figures. It changes no study result and no verdict: models and records are only
read (each model's sha256 is checked against its training record, and its stored top-1 is
recomputed first as a check of the reading). Whatever it shows is exploratory; a study that
adopted a remedy would declare it before its runs.

    .venv/bin/python bench/study_spread.py --build /work/pilot --cells t0.80_m0.80 t0.70_m0.70 t0.50_m0.55 \\
        --baseline --out bench/results/study_spread_2026-11-27.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402


def curve_figures(study: Path, cells: list[str], seeds: list[int]) -> list[dict]:
    """Per cell and method: the test top-1's spread over seeds after the first epoch, at
    30 % of the epochs and at the end, and the correlation of the first two with the end."""
    out = []
    for cell in cells:
        methods = sorted({d.name for seed in seeds for d in (study / f"s{seed}" / cell).glob("*")
                          if (d / "train.json").exists()})
        for method in methods:
            first, at_30pc, final = [], [], []
            for seed in seeds:
                path = study / f"s{seed}" / cell / method / "train.json"
                if not path.exists():
                    continue
                curve = json.loads(path.read_text())["curves"]["test_top1"]
                first.append(curve[0])
                at_30pc.append(curve[max(1, round(0.3 * len(curve))) - 1])
                final.append(curve[-1])
            if len(final) > 2:
                out.append({"cell": cell, "method": method, "n": len(final), "sd_first": sd(first),
                            "sd_at_30pc": sd(at_30pc), "sd_final": sd(final),
                            "r_first_final": statistics.correlation(first, final),
                            "r_30pc_final": statistics.correlation(at_30pc, final)})
    return out


def sd(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", required=True, help="a study's build folder (runs/, data/ of the quick profile)")
    ap.add_argument("--profile", default="quick")
    ap.add_argument("--cells", nargs="+", default=["t0.50_m0.55"], help="study cells to diagnose")
    ap.add_argument("--seeds", type=int, nargs="*", help="default: every seed found")
    ap.add_argument("--baseline", action="store_true", help="also the Table 1 baselines of the same seeds")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", help="JSON of every model's two top-1 figures and the summary")
    args = ap.parse_args()

    from darel import evaluation
    from darel.stagekit.models import load_model, load_split, transforms

    torch.set_num_threads(args.threads)
    build = Path(args.build)
    split = load_split(build / "data" / args.profile, torch.device("cpu"))
    _, normalise = transforms(split["meta"], {"pad": 0, "hflip": False, "rotation_deg": 0})
    study = build / "runs" / args.profile / "study_table1" / "resnet18"
    seeds = args.seeds if args.seeds else sorted(int(p.name[1:]) for p in study.glob("s*"))
    jobs = [(cell, seed, d.name, d / "model.pt") for cell in args.cells for seed in seeds
            for d in sorted((study / f"s{seed}" / cell).glob("*")) if (d / "model.pt").exists()]
    if args.baseline:
        jobs += [("baseline", seed, "baseline", build / "runs" / args.profile / "table1" / "resnet18" / f"s{seed}"
                  / "baseline" / "model.pt") for seed in seeds]
    if not jobs:
        raise SystemExit(f"no trained models under {study} for cells {args.cells}")

    results = []
    started = time.time()
    for i, (cell, seed, method, path) in enumerate(jobs, 1):
        model, _ = load_model(path, torch.device("cpu"))
        stored = json.loads(path.with_name("eval.json").read_text())["top1"]
        as_trained = evaluation.top1_percent(model, split["test_x"], split["test_y"], normalise, 256)
        if abs(as_trained - stored) > 0.051:  # one test image is 0.05 pp
            raise SystemExit(f"{path}: recomputed top-1 {as_trained:.2f} differs from its eval.json {stored:.2f}")
        evaluation.reestimate_batchnorm(model, split["train_x"], normalise, 256)
        precise = evaluation.top1_percent(model, split["test_x"], split["test_y"], normalise, 256)
        results.append({"cell": cell, "seed": seed, "method": method, "top1": stored, "top1_precise_bn": precise})
        print(f"[{i}/{len(jobs)}, {time.time() - started:.0f} s] {cell} s{seed} {method}: {stored:.2f} -> {precise:.2f}",
              file=sys.stderr)

    summary = []
    for cell in dict.fromkeys(r["cell"] for r in results):
        rows = [r for r in results if r["cell"] == cell]
        by = {}
        for r in rows:
            by.setdefault(r["method"], {})[r["seed"]] = r
        for method, per_seed in by.items():
            a = [r["top1"] for r in per_seed.values()]
            b = [r["top1_precise_bn"] for r in per_seed.values()]
            summary.append({"cell": cell, "what": method, "n": len(a), "mean": statistics.mean(a), "sd": sd(a),
                            "mean_precise_bn": statistics.mean(b), "sd_precise_bn": sd(b)})
        for control in [m for m in by if m != "darel" and "darel" in by]:
            common = sorted(set(by["darel"]) & set(by[control]))
            d = [by["darel"][s]["top1"] - by[control][s]["top1"] for s in common]
            e = [by["darel"][s]["top1_precise_bn"] - by[control][s]["top1_precise_bn"] for s in common]
            summary.append({"cell": cell, "what": f"darel - {control}", "n": len(d), "mean": statistics.mean(d),
                            "sd": sd(d), "mean_precise_bn": statistics.mean(e), "sd_precise_bn": sd(e)})

    curves = curve_figures(study, args.cells, seeds)

    print(f"{'cell':<12} {'what':<28} {'n':>3} {'mean':>7} {'sd':>6}   {'mean pBN':>8} {'sd pBN':>6}")
    for s in summary:
        print(f"{s['cell']:<12} {s['what']:<28} {s['n']:>3} {s['mean']:>7.2f} {s['sd']:>6.2f}   "
              f"{s['mean_precise_bn']:>8.2f} {s['sd_precise_bn']:>6.2f}")
    print(f"\n{'cell':<12} {'method':<16} {'sd ep1':>6} {'sd 30%':>6} {'sd end':>6} {'r(ep1,end)':>10} {'r(30%,end)':>10}")
    for c in curves:
        print(f"{c['cell']:<12} {c['method']:<16} {c['sd_first']:>6.2f} {c['sd_at_30pc']:>6.2f} {c['sd_final']:>6.2f} "
              f"{c['r_first_final']:>10.2f} {c['r_30pc_final']:>10.2f}")
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps({"command": " ".join(sys.argv), "models": results, "summary": summary, "curves": curves}, indent=1))
        tmp.replace(out)


if __name__ == "__main__":
    main()
