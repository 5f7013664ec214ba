"""Re-evaluate a finished Table 1 study build's trained models on a larger test set of the
same generated benchmark, and write its rows with top-1 on that set (issue 28).

The benchmark's test split comes from random streams of its own (darel.synth: "test plan",
"test views"), so another `n_test` leaves the training split, the class prototypes and so
every trained model unchanged: only the measurement changes. The script first evaluates
every model on the build's own test split and requires each recorded top-1 back exactly (a
check of the reading), then on `--n-test` images, and writes the study's rows with `top1`
replaced (the recorded value kept as `top1_recorded`). It also prints the baselines'
spread over seeds on both sets and the test sample's own share of it (the mean per-image
Bernoulli variance over the seeds' baselines, over the test size).

Feed its rows to `python -m darel.tools.seeds --pilot` to size a study on the larger set.
It trains nothing and changes no file of the build.

    .venv/bin/python bench/retest.py --build /work/study2 --n-test 10000 \\
        --out docs/studies/pilot_test10000_2026-11-28_rows.csv
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402

from darel import config, data, evaluation  # noqa: E402
from darel.stagekit.models import load_model, transforms  # noqa: E402

MODEL_PATH = re.compile(r"/s(?P<seed>\d+)/(?:t(?P<t>[\d.]+)_m(?P<m>[\d.]+)/)?(?P<method>[\w-]+)/model\.pt$")


def row_of(path: str, rows: pd.DataFrame) -> int:
    """The index of the one study row a model.pt belongs to (seed, method and budget from
    its path: runs/<profile>/table1/<model>/s<seed>/baseline/model.pt or
    runs/<profile>/study_table1/<model>/s<seed>/t<t>_m<m>/<method>/model.pt)."""
    found = MODEL_PATH.search(path)
    if found is None:
        raise ValueError(f"not a study model path: {path}")
    match = (rows["seed"] == int(found["seed"])) & (rows["method"] == found["method"])
    if found["t"] is not None:
        match &= np.isclose(rows["t"], float(found["t"])) & np.isclose(rows["m"], float(found["m"]))
    index = rows.index[match]
    if len(index) != 1:
        raise ValueError(f"{path}: {len(index)} study rows match, expected one")
    return int(index[0])


def correct_per_image(build: Path, profile: str, cfg: dict, n_test: int, threads: int) -> dict[str, np.ndarray]:
    """model.pt path (relative to the build) -> a bool per test image of an `n_test` split."""
    torch.set_num_threads(threads)
    settings = config.dataset_params(cfg)
    settings["n_test"] = n_test
    _, test, meta = data.make_synth_dataset(settings, workers=threads)
    images = torch.from_numpy(test["images"]).permute(0, 3, 1, 2).contiguous()
    labels = torch.from_numpy(test["labels"])
    _, normalise = transforms(meta, settings["augment"])
    models = sorted(build.glob(f"runs/{profile}/**/model.pt"))
    if not models:
        raise SystemExit(f"no model.pt under {build}/runs/{profile}")
    out = {}
    for i, path in enumerate(models, 1):
        model, _ = load_model(path, torch.device("cpu"))
        out[str(path.relative_to(build))] = (evaluation.predictions(model, images, normalise, 1000) == labels).numpy()
        if i % 25 == 0 or i == len(models):
            print(f"  n_test {n_test}: {i}/{len(models)} models", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", required=True, type=Path, help="a finished study build folder (its params.yaml)")
    ap.add_argument("--rows", type=Path, help="its study rows (default: <build>/results/study_table1.csv)")
    ap.add_argument("--profile", default="quick")
    ap.add_argument("--n-test", required=True, type=int)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args()
    cfg = config.load_params(args.build / "params.yaml", {"profile": args.profile})
    own = config.dataset_params(cfg)
    if own["dataset"] != "synth":
        raise SystemExit(f"profile {args.profile} trains on {own['dataset']}, not the generated benchmark")
    if args.n_test < own["num_classes"]:
        raise SystemExit(f"--n-test {args.n_test}: at least one test image a class ({own['num_classes']})")
    rows = pd.read_csv(args.rows or args.build / "results/study_table1.csv")

    recorded = correct_per_image(args.build, args.profile, cfg, own["n_test"], args.threads)
    for path, correct in recorded.items():
        index = row_of(path, rows)
        if abs(100 * correct.mean() - rows.at[index, "top1"]) > 0.005:
            raise SystemExit(f"{path}: top-1 {100 * correct.mean():.2f} on the build's own test split, "
                             f"recorded {rows.at[index, 'top1']}: not the build these rows came from")
    print(f"all {len(recorded)} recorded top-1 values reproduced on the build's {own['n_test']} test images")

    larger = correct_per_image(args.build, args.profile, cfg, args.n_test, args.threads)
    rows["top1_recorded"] = rows["top1"]
    for path, correct in larger.items():
        rows.at[row_of(path, rows), "top1"] = round(100 * float(correct.mean()), 2)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    rows.to_csv(tmp, index=False)
    tmp.replace(args.out)

    for n, table in ((own["n_test"], recorded), (args.n_test, larger)):
        base = np.array([v for k, v in table.items() if "/baseline/" in k], dtype=float)
        p = base.mean(axis=0)
        flip = 100 * np.sqrt((p * (1 - p)).mean() * len(base) / (len(base) - 1) / n)
        print(f"n_test {n}: {len(base)} baselines, top-1 {100 * base.mean():.2f} % +- "
              f"{100 * base.mean(axis=1).std(ddof=1):.2f} pp over seeds; the test sample's own noise about "
              f"{flip:.2f} pp")
    print(f"rows with top-1 on {args.n_test} test images: {args.out}")


if __name__ == "__main__":
    main()
