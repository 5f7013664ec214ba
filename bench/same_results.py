"""Proof that a change moved nothing: build Table 1 at two commits and compare the cells.

    python bench/same_results.py --before c4caa8e --after HEAD
    python bench/same_results.py --before c4caa8e --after HEAD --params .test/params.yaml   # minutes, not tens
    python bench/same_results.py --before c4caa8e --after HEAD --params .test/params.yaml --study
    python bench/same_results.py --before 16e93ea --after HEAD --params-after after_params.yaml

Each commit is checked out into its own folder (``git worktree``) and built with this
virtual environment, the commit's own package first on ``PYTHONPATH``. A calibration is
a measurement (its batch, alpha, A, eta and planned epochs come from step timings), so
the *after* build trains with the *before* build's calibration.json files: it builds its
baselines (their weights compared, then replaced by the before build's baseline records,
which the calibrations name by content), takes the before build's calibrations, then
builds the table. Then, for every
cell: the trained weights must have the same sha256, and every field of the cell record
and of train.json must be equal, except times, energies and hashes of records that
contain them (``EXCLUDED``). Fields only one side has are listed, not failed (a change
may add a field); so is a field named with ``--filled`` that was empty (None) before and
holds a figure after (a change may fill in a figure a record lacked). With ``--study``
both builds then build the Table 1 study too (on the same calibrations) and its cells
are compared the same way. Exit status 0 when nothing moved; the figures go to stdout
and, with ``--out``, to a JSON file.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
# Fields that hold or derive from a wall-clock or energy reading, or a hash over such records.
EXCLUDED = {"time_s", "wall_time_s", "time_total_s", "time_charged_s", "T_full_s", "T_new_s", "t_max_s",
            "predicted_time_s", "epoch_time_s", "energy_duration_s",
            "budget_adherence", "predicted_adherence", "energy_kwh", "co2e_kg", "eq6_co2e_kg", "energy", "segments",
            "energy_covers", "record_seal", "record_sha256", "sources_sha256", "code_version", "fingerprint", "inputs",
            "time_budget_s", "tokens_per_s", "process_peak_rss_bytes", "slowest_epoch_s", "energy_source",
            "feature_time_s",  # the IDS row's feature pass, timed (its plan.json)
            # what else ran on the machine beside the timed work, and hashes over records that hold times
            "cores_beside", "cpu_beside_s", "identity",
            # the IDS row's stopwatch over its scorer's feature pass (stages/ids_subset.py)
            "feature_time_s"}


def _run(cmd: list[str], cwd: Path, env: dict) -> None:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed in {cwd}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


def _checkout(commit: str, folder: Path, params: Path | None) -> dict:
    subprocess.run(["git", "worktree", "add", "--detach", "-q", str(folder), commit], cwd=ROOT, check=True)
    if params is not None:
        shutil.copy2(params, folder / "params.yaml")
    return {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "PYTHONPATH": str(folder),
            "MLFLOW_DISABLE_TELEMETRY": "true", "PYTHONUNBUFFERED": "1"}


def _profile(folder: Path) -> str:
    import yaml

    return yaml.safe_load((folder / "params.yaml").read_text())["profile"]


def _record(path: Path) -> dict:
    data = json.loads(path.read_text())
    return data if isinstance(data, dict) else {}


def _differences(a: object, b: object, where: str, out: dict, filled: frozenset = frozenset()) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if key in EXCLUDED:
                continue
            if key not in a or key not in b:
                out.setdefault("only_one_side", []).append(f"{where}.{key} ({'after' if key in b else 'before'})")
                continue
            if key in filled and a[key] is None and b[key] is not None:
                out.setdefault("filled_in", []).append(f"{where}.{key}: None -> {str(b[key])[:40]}")
                continue
            _differences(a[key], b[key], f"{where}.{key}", out, filled)
    elif a != b:
        out.setdefault("differ", []).append(f"{where}: {str(a)[:80]} != {str(b)[:80]}")


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True)
    ap.add_argument("--after", default="HEAD")
    ap.add_argument("--params", type=Path, help="a parameter file to build both commits with (default: each "
                                                 "commit's own params.yaml)")
    ap.add_argument("--params-after", type=Path, help="a parameter file for the after commit only (default: "
                                                       "--params, else its own params.yaml): for a change that "
                                                       "added keys the before commit's schema refuses")
    ap.add_argument("--cores", default="2")
    ap.add_argument("--out", type=Path, help="write the comparison as JSON here")
    ap.add_argument("--keep", action="store_true", help="keep the two build folders")
    ap.add_argument("--study", action="store_true", help="build and compare the Table 1 study too")
    ap.add_argument("--filled", nargs="*", default=[], help="fields that may go from None to a figure")
    args = ap.parse_args()
    params = args.params.resolve() if args.params else None
    params_after = args.params_after.resolve() if args.params_after else params
    work = Path(tempfile.mkdtemp(prefix="same-results-"))
    before, after = work / "before", work / "after"
    started = time.monotonic()
    try:
        env_before = _checkout(args.before, before, params)
        env_after = _checkout(args.after, after, params_after)
        profile = _profile(before)
        targets = ["results/table1.csv", *(["results/study_table1.csv"] if args.study else [])]
        print(f"building {' '.join(targets)} ({profile} profile) at {args.before} ...", flush=True)
        _run([str(BIN / "snakemake"), "--cores", args.cores, *targets], before, env_before)
        runs = before / "runs" / profile / "table1"
        baselines = sorted(str(p.relative_to(before)) for p in runs.glob("*/s*/baseline/losses.npz"))
        baselines += sorted(str(p.relative_to(before)) for p in runs.glob("*/s*/baseline/train.json"))
        print(f"building the baselines at {args.after} ...", flush=True)
        _run([str(BIN / "snakemake"), "--cores", args.cores, *baselines], after, env_after)
        # The baselines' weights are compared here; then the after build takes the before build's
        # baseline records too (a calibration names its baseline's train.json by content, and that
        # record holds times), so that every later job of both builds reads the same inputs.
        # A training that writes its own eval.json (issue 52) seals it against its own train.json:
        # its fields are compared here too, then it follows the records it was made from.
        baseline_weights, baseline_evaluations = {}, {}
        for folder in sorted({Path(path).parent for path in baselines}):
            baseline_weights[str(folder)] = _sha(before / folder / "model.pt") == _sha(after / folder / "model.pt")
            # losses.npz only where the before build scored that baseline (a model without a DAREL
            # cell that needs scores, resnet18_hc in the quick Table 1, has none)
            names = ["model.pt", "train.json"] + (["losses.npz"] if (before / folder / "losses.npz").is_file() else [])
            if (before / folder / "eval.json").is_file() and (after / folder / "eval.json").is_file():
                moved: dict = {}
                _differences(_record(before / folder / "eval.json"), _record(after / folder / "eval.json"),
                             str(folder / "eval.json"), moved)
                baseline_evaluations[str(folder)] = moved.get("differ", [])
                names.append("eval.json")
            for name in names:
                shutil.copy(before / folder / name, after / folder / name)
        # Every calibration (a study's seeds beyond Table 1's have their own): the measured inputs,
        # the same for both builds.
        calibrations = sorted(runs.glob("*/s*/t*/calibration.json"))
        for path in calibrations:
            target = after / path.relative_to(before)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, target)
        print(f"building {' '.join(targets)} at {args.after} with the {len(calibrations)} calibrations of "
              f"{args.before} ...", flush=True)
        _run([str(BIN / "snakemake"), "--cores", args.cores, *targets], after, env_after)
        trained = sorted(runs.glob("*/s*/*/model.pt"))
        trained += sorted((before / "runs" / profile / "study_table1").glob("*/s*/*/*/model.pt"))

        report: dict = {"before": args.before, "after": args.after, "profile": profile, "cells": 0,
                        "weights_identical": 0, "weights_differ": [], "differ": [], "only_one_side": [],
                        "filled_in": [], "baseline_weights_identical": baseline_weights,
                        "baseline_evaluation_differences": baseline_evaluations}
        filled = frozenset(args.filled)
        for model in trained:
            rel = model.relative_to(before)
            cell = rel.parent
            report["cells"] += 1
            if _sha(model) == _sha(after / rel):
                report["weights_identical"] += 1
            else:
                report["weights_differ"].append(str(cell))
            found: dict = {}
            records = ["train.json", *[name for name in ("plan.json", "eval.json") if (before / cell / name).exists()]]
            for name in records:
                _differences(_record(before / cell / name), _record(after / cell / name), f"{cell}/{name}", found,
                             filled)
            # runs/<profile>/<table1|study_table1>/<model>/s<seed>/<cell>[/<method>]
            cell_json = Path("results/cells", profile, *cell.parts[2:-1], f"{cell.parts[-1]}.json")
            _differences(_record(before / cell_json), _record(after / cell_json), str(cell_json), found, filled)
            for key in ("differ", "only_one_side", "filled_in"):
                report[key] += found.get(key, [])
        report["minutes"] = round((time.monotonic() - started) / 60, 1)
        ok = (report["cells"] > 0 and not report["weights_differ"] and not report["differ"]
              and all(baseline_weights.values()) and not any(baseline_evaluations.values()))
        report["nothing_moved"] = ok
        print(json.dumps(report, indent=2))
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(report, indent=2) + "\n")
        sys.exit(0 if ok else 1)
    finally:
        if not args.keep:
            for folder in (before, after):
                subprocess.run(["git", "worktree", "remove", "--force", str(folder)], cwd=ROOT, capture_output=True)
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
