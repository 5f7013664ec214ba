"""Fault-injection trials: kill -9 a training stage at random moments (mid-epoch and
mid-checkpoint-write included), start it again, and compare its result with an
uninterrupted run of the same stage. Reports, per stage, how many trials resumed, ended
identical to the uninterrupted run, or lost work (did not resume or differ). Then tries
damaged files (garbled, truncated, empty checkpoint; permuted losses; batch-0
calibration) and prints what happened.

Tiny quick-profile settings in a temporary folder; minutes on 2 cores.
Usage: python bench/faults.py [--trials 5] [--seed 0] [--skip-lora]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from darel import checkpoint, config, faultlab, io

ROOT = Path(__file__).resolve().parents[1]


def _stage(name: str) -> str:
    return str(ROOT / "stages" / f"{name}.py")


def _run(argv: list[str], cwd: Path) -> None:
    subprocess.run([sys.executable, *argv], cwd=cwd, check=True, capture_output=True, text=True)


def trials(label: str, argv_for, out_of, weights_equal, ckpt_of, n: int, rng: random.Random, cwd: Path,
           max_delay_s: float) -> dict:
    """``n`` kill -9 trials of one stage against its uninterrupted run (``argv_for("whole")``)."""
    whole = "whole_" + label
    assert faultlab.run_to_end(argv_for(whole), cwd, cwd / f"{whole}.out") == 0
    counts = {"trials": 0, "killed": 0, "resumed": 0, "identical": 0, "lost": 0}
    for index in range(n):
        out = f"{label}_{index}"
        proc = faultlab.start_stage(argv_for(out), cwd, cwd / f"{out}.out")
        delay = rng.uniform(1.0, max_delay_s)  # after start-up: anywhere in training or a checkpoint write
        killed = faultlab.kill_when(proc, lambda start=time.monotonic(): time.monotonic() - start > delay)
        counts["trials"] += 1
        counts["killed"] += int(killed)
        ckpt = ckpt_of(out)
        had_checkpoint = ckpt.exists()
        assert faultlab.run_to_end(argv_for(out), cwd, cwd / f"{out}.out") == 0
        resumed = json.loads(out_of(out).read_text()).get("resumed_from_epoch") is not None
        counts["resumed"] += int(resumed)
        same = weights_equal(whole, out)
        counts["identical"] += int(same)
        counts["lost"] += int(not same or (had_checkpoint and killed and not resumed))
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-lora", action="store_true")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="darel-bench-faults-") as tmp:
        cwd = Path(tmp)
        cfg = config.load_params(ROOT / "params.yaml", {"profiles": {"quick": {"models": {"resnet18": {
            "width": 8, "epochs": 8, "milestones": [5], "warmup_epochs": 2}}}}, "table1": {"resnet18": [[0.8, 0.8]]}})
        train = json.dumps(config.training_params(cfg, "resnet18", 0))
        _run([_stage("download"), "--params", json.dumps(config.dataset_params(cfg)), "--out", "data",
              "--no-progress"], cwd)

        def pretrain(out: str) -> list[str]:
            return [_stage("pretrain"), "--params", train, "--data", "data", "--out-dir", out, "--no-progress"]

        results["ResNet baseline (pretrain)"] = trials(
            "base", pretrain, lambda out: cwd / out / "train.json",
            lambda a, b: faultlab.same_weights(cwd / a / "model.pt", cwd / b / "model.pt"),
            lambda out: cwd / out / "ckpt.pt", args.trials, rng, cwd, max_delay_s=12.0)

        # An online cell: calibration and subset once, then the online stage.
        _run(pretrain("base"), cwd)
        _run([_stage("score"), "--params", train, "--data", "data", "--model", "base/model.pt", "--out",
              "base/losses.npz"], cwd)
        _run([_stage("calibrate"), "--params", json.dumps(config.calibration_params(cfg, "resnet18", "t0.80_m0.80", 0)),
              "--data", "data", "--baseline", "base/train.json", "--out", "cell/calibration.json"], cwd)
        _run([_stage("subset"), "--params", json.dumps({"mode": "hard"}), "--losses", "base/losses.npz",
              "--scorer-model", "base/model.pt", "--data", "data", "--calibration", "cell/calibration.json",
              "--out", "cell/subset.npz"], cwd)
        online = json.dumps(config.online_params(cfg, "resnet18", "t0.80_m0.80", 0))

        def train_online(out: str) -> list[str]:
            return [_stage("train_online"), "--params", online, "--data", "data", "--calibration",
                    "cell/calibration.json", "--subset", "cell/subset.npz", "--out-dir", out, "--no-progress"]

        results["DAREL online cell (train_online)"] = trials(
            "online", train_online, lambda out: cwd / out / "train.json",
            lambda a, b: faultlab.same_weights(cwd / a / "model.pt", cwd / b / "model.pt"),
            lambda out: cwd / out / "ckpt.pt", args.trials, rng, cwd, max_delay_s=10.0)

        if not args.skip_lora:
            results["LoRA fine-tuning (nlg_finetune)"] = lora_trials(cfg, cwd, args.trials, rng)

        results["damaged files"] = damage_cases(cwd, train, online)

    print("kill -9 trials (a random moment after start-up; then the same command again):")
    print(f"{'stage':<36}{'trials':>7}{'killed':>8}{'resumed':>9}{'identical':>11}{'lost':>6}")
    for name, c in results.items():
        if name != "damaged files":
            print(f"{name:<36}{c['trials']:>7}{c['killed']:>8}{c['resumed']:>9}{c['identical']:>11}{c['lost']:>6}")
    print("\ndamaged files:")
    for case, outcome in results["damaged files"].items():
        print(f"  {case}: {outcome}")


def lora_trials(cfg: dict, cwd: Path, n: int, rng: random.Random) -> dict:
    tiny = config.merge(cfg, {"profiles": {"quick": {"nlg": {"data": {"n_train": 60, "n_dev": 4, "n_test": 6},
                                                             "pretrain": {"epochs": 1},
                                                             "finetune": {"epochs": 4}}}}})
    data = json.dumps(config.nlg_data_params(tiny, "e2e"))
    model = json.dumps(config.nlg_model_params(tiny, "e2e", "gpt2-small"))
    _run([_stage("nlg_data"), "--params", data, "--out-dir", "nlg/data", "--raw", "data/raw", "--no-progress"], cwd)
    _run([_stage("nlg_prepare_model"), "--params", model, "--data-dir", "nlg/data", "--tokenizer-dir", "nlg/tok",
          "--train-tokenizer"], cwd)
    _run([_stage("nlg_prepare_model"), "--params", model, "--data-dir", "nlg/data", "--tokenizer-dir", "nlg/tok",
          "--out-dir", "nlg/pretrained", "--no-progress"], cwd)
    finetune = json.dumps(config.nlg_finetune_params(tiny, "table2", "gpt2-small", "lora", 0))

    def argv(out: str) -> list[str]:
        return [_stage("nlg_finetune"), "--params", finetune, "--data-dir", "nlg/data", "--tokenizer-dir", "nlg/tok",
                "--model-dir", "nlg/pretrained", "--out-dir", f"{out}/adapter", "--checkpoint", f"{out}/ckpt.pt",
                "--no-progress"]

    def equal(a: str, b: str) -> bool:
        from safetensors.torch import load_file

        x, y = load_file(cwd / a / "adapter/adapter_model.safetensors"), load_file(cwd / b / "adapter/adapter_model.safetensors")
        return x.keys() == y.keys() and all(bool((x[k] == y[k]).all()) for k in x)

    return trials("lora", argv, lambda out: cwd / out / "adapter/train.json", equal, lambda out: cwd / out / "ckpt.pt",
                  n, rng, cwd, max_delay_s=14.0)


def damage_cases(cwd: Path, train: str, online: str) -> dict:
    outcomes = {}
    ckpt = cwd / "base" / "ckpt.pt"  # the final checkpoint of a finished run
    data = ckpt.read_bytes()
    for case, damaged in (("garbled checkpoint (4 KiB of zeros inside)", data[:len(data) // 2] + bytes(4096)
                           + data[len(data) // 2 + 4096:]),
                          ("truncated checkpoint (a third)", data[: len(data) // 3]), ("empty checkpoint", b"")):
        ckpt.write_bytes(damaged)
        (cwd / "base" / "ckpt.pt.prev").unlink(missing_ok=True)
        proc = subprocess.run([sys.executable, _stage("pretrain"), "--params", train, "--data", "data", "--out-dir",
                               "base", "--no-progress", "--log", "base.log"], cwd=cwd, capture_output=True, text=True)
        log = (cwd / "base.log").read_text()
        line = next((l for l in log.splitlines() if "checkpoint" in l and ("damaged" in l or "resuming" in l)), "")
        outcomes[case] = (f"exit {proc.returncode}; " + line.split("INFO ", 1)[-1][:160]
                          + ("; the run started clean and finished" if proc.returncode == 0 else ""))
        checkpoint.discard(ckpt)
    scored = io.read_npz(cwd / "base/losses.npz")
    scored["loss"] = np.random.default_rng(0).permutation(scored["loss"])
    io.write_npz(cwd / "permuted.npz", **scored)
    proc = subprocess.run([sys.executable, _stage("subset"), "--params", json.dumps({"mode": "hard"}), "--losses",
                           "permuted.npz", "--scorer-model", "base/model.pt", "--data", "data", "--calibration",
                           "cell/calibration.json", "--out", "cell/subset2.npz"], cwd=cwd, capture_output=True,
                          text=True)
    outcomes["permuted loss column in losses.npz"] = f"exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1]}"
    io.write_json(cwd / "bad_calibration.json", {"batch": 0, "alpha": 0.8, "A": 0.5, "eta": 2})
    proc = subprocess.run([sys.executable, _stage("train_online"), "--params", online, "--data", "data",
                           "--calibration", "bad_calibration.json", "--subset", "cell/subset.npz", "--out-dir",
                           "bad_cell"], cwd=cwd, capture_output=True, text=True)
    outcomes["calibration.json with batch 0"] = f"exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1]}"
    return outcomes


if __name__ == "__main__":
    main()
