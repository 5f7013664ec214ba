"""Fault-injection trials: kill -9 a training stage at chosen points (a random moment
inside a random epoch, during start-up, right after its first output file appears),
start it again, and compare its result with an uninterrupted run of the same stage.
Reports, per stage, how many trials were killed, resumed, ended identical to the
uninterrupted run, or lost work (differ, or did not resume from the newest checkpoint
the kill left). Then tries
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

from darel import checkpoint, config, faultlab, io, provenance

ROOT = Path(__file__).resolve().parents[1]


def _stage(name: str) -> str:
    return str(ROOT / "stages" / f"{name}.py")


def _run(argv: list[str], cwd: Path) -> None:
    subprocess.run([sys.executable, *argv], cwd=cwd, check=True, capture_output=True, text=True)


KILL_POINTS = ("mid-run", "start-up", "mid-run", "after outputs")


def _epoch_times(record: dict) -> list[float]:
    return record.get("curves", {}).get("epoch_time_s") or record.get("epoch_time_s") or [1.0]


def _newest_epoch(ckpt: Path) -> int | None:
    """The epoch of the newest verified checkpoint file (``ckpt`` or its ``.prev``)."""
    epochs = [faultlab.checkpoint_epoch(path) for path in (ckpt, checkpoint.path_with(ckpt, ".prev"))]
    epochs = [e for e in epochs if e is not None]
    return max(epochs) if epochs else None


def trials(label: str, argv_for, out_of, weights_equal, ckpt_of, first_output_of, n: int, rng: random.Random,
           cwd: Path) -> dict:
    """``n`` kill -9 trials of one stage against its uninterrupted run (``argv_for("whole")``).

    Kill points, in turn: "mid-run" (once the checkpoint of a random epoch k in [1, E-1]
    exists, after a further random part of an epoch: inside an epoch, an evaluation or a
    checkpoint write), "start-up" (1-3 s after the start, before or around the first
    checkpoint) and "after outputs" (as soon as the first output file exists: the gap
    before the workflow would accept them). Lost: the re-run differs from the
    uninterrupted run, or did not resume from the newest checkpoint the kill left."""
    whole = "whole_" + label
    assert faultlab.run_to_end(argv_for(whole), cwd, cwd / f"{whole}.out") == 0
    record = json.loads(out_of(whole).read_text())
    epochs = int(record["epochs_completed"])
    times = _epoch_times(record)
    span = 1.3 * sum(times) / len(times)  # an epoch with its evaluation and checkpoint write
    counts = {"trials": 0, "killed": 0, "resumed": 0, "identical": 0, "lost": 0, "points": {}}
    for index in range(n):
        out = f"{label}_{index}"
        point = KILL_POINTS[index % len(KILL_POINTS)]
        ckpt = ckpt_of(out)
        proc = faultlab.start_stage(argv_for(out), cwd, cwd / f"{out}.out")
        started = time.monotonic()
        if point == "start-up":
            delay = rng.uniform(1.0, 3.0)
            ready = lambda: time.monotonic() - started > delay  # noqa: E731
        elif point == "after outputs":
            ready = lambda: first_output_of(out).exists()  # noqa: E731
        else:
            k, extra, armed = rng.randint(1, max(1, epochs - 1)), rng.uniform(0.0, span), []

            def ready() -> bool:
                if not armed and (faultlab.checkpoint_epoch(ckpt) or 0) >= k:
                    armed.append(time.monotonic())
                return bool(armed) and time.monotonic() - armed[0] > extra
        killed = faultlab.kill_when(proc, ready, poll_s=0.005 if point == "after outputs" else 0.05)
        left = _newest_epoch(ckpt) if killed else None
        assert faultlab.run_to_end(argv_for(out), cwd, cwd / f"{out}.out") == 0
        resumed_from = json.loads(out_of(out).read_text()).get("resumed_from_epoch")
        same = weights_equal(whole, out)
        lost = not same or (left is not None and (resumed_from or 0) < left)
        counts["trials"] += 1
        counts["killed"] += int(killed)
        counts["resumed"] += int(resumed_from is not None)
        counts["identical"] += int(same)
        counts["lost"] += int(lost)
        counts["points"].setdefault(point, []).append(
            f"{'killed' if killed else 'ended first'}, checkpoint left {left}, resumed from {resumed_from}"
            f"{', identical' if same else ', DIFFERENT'}")
    counts["epochs"] = epochs
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
            "width": 8, "epochs": 8, "milestones": [5], "warmup_epochs": 2}}, "table1": {"resnet18": [[0.8, 0.8]]}}}})
        train = json.dumps(config.training_params(cfg, "resnet18", 0))
        _run([_stage("download"), "--params", json.dumps(config.dataset_params(cfg)), "--out", "data",
              "--no-progress"], cwd)

        def pretrain(out: str) -> list[str]:
            return [_stage("pretrain"), "--params", train, "--data", "data", "--out-dir", out, "--no-progress"]

        results["ResNet baseline (pretrain)"] = trials(
            "base", pretrain, lambda out: cwd / out / "train.json",
            lambda a, b: faultlab.same_weights(cwd / a / "model.pt", cwd / b / "model.pt"),
            lambda out: cwd / out / "ckpt.pt", lambda out: cwd / out / "model.pt", args.trials, rng, cwd)

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
            lambda out: cwd / out / "ckpt.pt", lambda out: cwd / out / "model.pt", args.trials, rng, cwd)

        if not args.skip_lora:
            results["LoRA fine-tuning (nlg_finetune)"] = lora_trials(cfg, cwd, args.trials, rng)

        results["damaged files"] = damage_cases(cwd, train, online)

    print("kill -9 trials (kill points: mid-run, start-up, after the outputs; then the same command again):")
    print(f"{'stage':<36}{'epochs':>7}{'trials':>7}{'killed':>8}{'resumed':>9}{'identical':>11}{'lost':>6}")
    for name, c in results.items():
        if name != "damaged files":
            print(f"{name:<36}{c['epochs']:>7}{c['trials']:>7}{c['killed']:>8}{c['resumed']:>9}{c['identical']:>11}"
                  f"{c['lost']:>6}")
    for name, c in results.items():
        if name != "damaged files":
            print(f"\n{name}:")
            for point, outcomes in c["points"].items():
                for outcome in outcomes:
                    print(f"  {point:<14}{outcome}")
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
                  lambda out: cwd / out / "adapter/adapter_model.safetensors", n, rng, cwd)


def damage_cases(cwd: Path, train: str, online: str) -> dict:
    outcomes = {}
    ckpt = cwd / "base" / "ckpt.pt"  # the final checkpoint of a finished run (and .prev, the epoch before)
    prev = checkpoint.path_with(ckpt, ".prev")
    good, good_prev = ckpt.read_bytes(), prev.read_bytes()
    outputs = {name: (cwd / "base" / name).read_bytes() for name in ("model.pt", "train.json")}

    def pretrain_again(params: str, case: str) -> None:
        proc = subprocess.run([sys.executable, _stage("pretrain"), "--params", params, "--data", "data", "--out-dir",
                               "base", "--no-progress", "--log", "base.log"], cwd=cwd, capture_output=True, text=True)
        log = (cwd / "base.log").read_text()
        line = faultlab.checkpoint_line(log) or "(no checkpoint line)"
        same = faultlab.same_weights(cwd / "whole_base/model.pt", cwd / "base/model.pt")
        outcomes[case] = (f"exit {proc.returncode}; " + line.split("INFO ", 1)[-1]
                          + f"; result {'identical to' if same else 'differs from'} the uninterrupted run")

    middle = len(good) // 2
    for case, damaged in (("garbled (4 KiB of zeros inside)", good[:middle] + bytes(4096) + good[middle + 4096:]),
                          ("truncated (a third)", good[: len(good) // 3]), ("empty", b"")):
        for with_prev in (True, False):
            checkpoint.discard(ckpt)
            ckpt.write_bytes(damaged)
            if with_prev:
                prev.write_bytes(good_prev)
            pretrain_again(train, f"{case} checkpoint, {'previous one intact' if with_prev else 'no previous one'}")
    # A checkpoint of another configuration (rotation 10 -> 0): never resumed.
    checkpoint.discard(ckpt)
    ckpt.write_bytes(good)
    prev.write_bytes(good_prev)
    params = json.loads(train)
    params["augment"]["rotation_deg"] = 0
    proc = subprocess.run([sys.executable, _stage("pretrain"), "--params", json.dumps(params), "--data", "data",
                           "--out-dir", "base", "--no-progress", "--log", "base.log"], cwd=cwd, capture_output=True,
                          text=True)
    line = faultlab.checkpoint_line((cwd / "base.log").read_text()) or ""
    aside = sorted(p.name for p in (cwd / "base").iterdir() if p.name.startswith("ckpt.pt."))
    outcomes["checkpoint of another configuration (rotation 10 -> 0)"] = (
        f"exit {proc.returncode}; {line.split('INFO ', 1)[-1]}; resumed_from_epoch "
        f"{faultlab.resumed_from(cwd / 'base/train.json')}; files beside: {aside}")
    checkpoint.discard(ckpt)
    for name, data in outputs.items():  # the scorer the losses were made with, for the cases below
        io.write_bytes(cwd / "base" / name, data)
    scored = io.read_npz(cwd / "base/losses.npz")
    order = np.random.default_rng(0).permutation(len(scored["loss"]))
    rows = dict(scored, label=scored["label"][order], loss=scored["loss"][order])
    rows["content_sha256"] = np.str_(provenance.array_sha256(rows["index"], rows["label"], rows["loss"]))
    for case, arrays in (("permuted loss column in losses.npz", dict(scored, loss=scored["loss"][order])),
                         ("losses.npz rows permuted (labels with them), its hash recomputed", rows)):
        io.write_npz(cwd / "permuted.npz", **arrays)
        proc = subprocess.run([sys.executable, _stage("subset"), "--params", json.dumps({"mode": "hard"}), "--losses",
                               "permuted.npz", "--scorer-model", "base/model.pt", "--data", "data", "--calibration",
                               "cell/calibration.json", "--out", "cell/subset2.npz"], cwd=cwd, capture_output=True,
                              text=True)
        outcomes[case] = f"exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1]}"
    io.write_json(cwd / "bad_calibration.json", {"batch": 0, "alpha": 0.8, "A": 0.5, "eta": 2})
    proc = subprocess.run([sys.executable, _stage("train_online"), "--params", online, "--data", "data",
                           "--calibration", "bad_calibration.json", "--subset", "cell/subset.npz", "--out-dir",
                           "bad_cell"], cwd=cwd, capture_output=True, text=True)
    outcomes["calibration.json with batch 0"] = f"exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1]}"
    return outcomes


if __name__ == "__main__":
    main()
