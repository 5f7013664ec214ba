"""Budget benchmark (issue: every Table 1 number on one footing), measured side by side:

1. The spread of the calibrated online ratio A over repeated calibrations of one budget,
   on an idle machine and beside a CPU-burning process, for this code and (``--before
   REV``) for an older commit of the project run from a `git archive` of it.
2. budget_adherence (measured training time / t_max) of every budgeted ResNet18 cell of
   the quick Table 1 under `budget.enforce: plan` and `wallclock`, idle and loaded.

Everything runs in temporary copies of the project (Snakemake for part 2); nothing here
is written into the working tree except the printed report (and --json). It takes many
minutes on 2 cores. Usage:
    python bench/budget.py [--budget 0.5 0.55] [--repeats 3] [--before 9781502] [--skip-adherence]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.conftest import copy_worktree  # noqa: E402

BIN = Path(sys.executable).parent


def _env(pythonpath: Path | None = None) -> dict:
    env = dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true", PATH=f"{BIN}:{os.environ['PATH']}")
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return env


def _run(cmd: list[str], cwd: Path, pythonpath: Path | None = None) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=_env(pythonpath), capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:3])} ... failed in {cwd}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc.stdout


class Hog:
    """A CPU-burning process (started and stopped by PID), for the loaded measurements."""

    def __enter__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        return self

    def __exit__(self, *exc):
        self.proc.kill()
        self.proc.wait(timeout=30)
        return False


def export_tree(rev: str | None, dest: Path) -> Path:
    """The project at ``rev`` (None: the working tree as it stands) in ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    if rev is None:
        copy_worktree(dest)
    else:
        archive = subprocess.run(["git", "archive", rev], cwd=ROOT, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


SLICE_SNIPPET = """
import json, sys
from darel import config
cfg = config.load_params("params.yaml")
t, m = float(sys.argv[1]), float(sys.argv[2])
cell = config.cell_id(t, m)
# Table 1's budgets: top-level before they moved into each profile (profiles.<profile>.table1).
(cfg["table1"] if "table1" in cfg else cfg["profiles"][cfg["profile"]]["table1"])["resnet18"] = [[t, m]]
out = {"dataset": config.dataset_params(cfg)}
try:
    out["train"] = config.training_params(cfg, "resnet18", 0)
    out["calibrate"] = config.calibration_params(cfg, "resnet18", cell, 0)
except TypeError:  # before seeds existed
    out["train"] = config.training_params(cfg, "resnet18")
    out["calibrate"] = config.calibration_params(cfg, "resnet18", cell)
print(json.dumps(out))
"""


def calibration_spread(tree: Path, budget: tuple[float, float], repeats: int) -> dict:
    """A over ``repeats`` calibrations idle and as many beside a CPU hog, for the code in ``tree``."""
    slices = json.loads(_run([sys.executable, "-c", SLICE_SNIPPET, str(budget[0]), str(budget[1])], tree, tree))
    _run([sys.executable, "stages/download.py", "--params", json.dumps(slices["dataset"]), "--out", "data/quick",
          "--raw", "data/raw", "--no-progress"], tree, tree)
    _run([sys.executable, "stages/pretrain.py", "--params", json.dumps(slices["train"]), "--data", "data/quick",
          "--out-dir", "base", "--no-progress"], tree, tree)
    result = {}
    for label in ("idle", "loaded"):
        values = []
        for index in range(repeats):
            out = tree / f"cal_{label}_{index}.json"
            cmd = [sys.executable, "stages/calibrate.py", "--params", json.dumps(slices["calibrate"]), "--data",
                   "data/quick", "--baseline", "base/train.json", "--out", str(out)]
            if label == "loaded":
                with Hog():
                    _run(cmd, tree, tree)
            else:
                _run(cmd, tree, tree)
            cal = json.loads(out.read_text())
            values.append({k: cal.get(k) for k in ("batch", "A", "eta", "alpha", "T_new_s", "planned_epochs")})
        a = [v["A"] for v in values]
        result[label] = {"runs": values, "A_mean": statistics.mean(a),
                         "A_spread": (max(a) - min(a)) / statistics.mean(a),
                         "batches": sorted({v["batch"] for v in values}), "etas": sorted({v["eta"] for v in values})}
    return result


def adherence(tree: Path, enforce: str, loaded: bool) -> list[dict]:
    """budget_adherence of every budgeted ResNet18 cell of the quick Table 1."""
    params_file = tree / "params.yaml"
    params = yaml.safe_load(params_file.read_text())
    budgets = params["table1"] if "table1" in params else params["profiles"][params["profile"]]["table1"]
    budgets.pop("resnet18_hc", None)
    params.pop("comparisons", None)
    params["budget"]["enforce"] = enforce
    params_file.write_text(yaml.safe_dump(params, sort_keys=False))
    for leftover in ("runs", "results", "logs", ".snakemake", "mlflow.db"):
        path = tree / leftover
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
    cmd = [str(BIN / "snakemake"), "--cores", "2", "results/table1.csv"]
    if loaded:
        with Hog():
            _run(cmd, tree)
    else:
        _run(cmd, tree)
    import pandas as pd

    table = pd.read_csv(tree / "results/table1.csv")
    rows = table[table["method"] == "darel"]
    return [{"t": r.t, "m": r.m, "epochs": int(r.epochs), "adherence": float(r.budget_adherence),
             "top1": float(r.top1)} for r in rows.itertuples()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budget", nargs=2, type=float, default=[0.5, 0.55], metavar=("T", "M"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--before", default=None, help="older commit to compare the calibration spread with")
    ap.add_argument("--skip-adherence", action="store_true")
    ap.add_argument("--json", help="write every figure here too")
    args = ap.parse_args()
    report: dict = {"budget": args.budget}
    with tempfile.TemporaryDirectory(prefix="darel-bench-budget-") as tmp:
        tmp = Path(tmp)
        trees = {"this code": export_tree(None, tmp / "now")}
        if args.before:
            trees[f"before ({args.before})"] = export_tree(args.before, tmp / "before")
        report["spread"] = {name: calibration_spread(tree, tuple(args.budget), args.repeats)
                            for name, tree in trees.items()}
        if not args.skip_adherence:
            report["adherence"] = {f"{enforce}, {'loaded' if loaded else 'idle'}":
                                   adherence(export_tree(None, tmp / f"adh_{enforce}_{loaded}"), enforce, loaded)
                                   for enforce in ("plan", "wallclock") for loaded in (False, True)}
    print(f"Calibration of B(t={args.budget[0]}, m={args.budget[1]}), {args.repeats} runs each "
          "(A spread = (max - min) / mean):")
    print(f"{'code':<24} {'machine':<8} {'batch':<10} {'eta':<8} {'A mean':>8} {'A spread':>9}")
    for name, spread in report["spread"].items():
        for label, figures in spread.items():
            print(f"{name:<24} {label:<8} {str(figures['batches']):<10} {str(figures['etas']):<8} "
                  f"{figures['A_mean']:>8.3f} {100 * figures['A_spread']:>8.1f}%")
    for setting, rows in report.get("adherence", {}).items():
        values = [r["adherence"] for r in rows]
        print(f"\nbudget_adherence, {setting}: min {min(values):.3f}, median {statistics.median(values):.3f}, "
              f"max {max(values):.3f}; epochs {[r['epochs'] for r in rows]}")
        for r in rows:
            print(f"  B({r['t']:.2f}, {r['m']:.2f}): {r['adherence']:.3f}  ({r['epochs']} epochs, top-1 {r['top1']:.1f})")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
