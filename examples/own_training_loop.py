"""DAREL and two controls in a training loop of your own (darel.api), planned at one budget
from one measured baseline: a small MLP on a generated classification problem
(scikit-learn's make_classification: neither the paper's models nor its data), on the
CPU, with a plain PyTorch DataLoader, without Snakemake or MLflow.

1. Train the baseline with the plain loop (``train_plain``); its time T, its steps'
   measured costs and its per-sample losses are the Baseline every method is planned from.
2. Plan each method at B(t, m) (``api.plan``): the same calibrated batch and budget, the
   epochs and samples its own costs fit into t T.
3. Train a fresh model with each plan: ``train_planned`` is the plain loop with the lines
   marked "# planned" changed.

    python examples/own_training_loop.py                      # darel, random and infobatch, on one core
    python examples/own_training_loop.py --method rs2 --tiny  # one method, seconds
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import make_classification
from sklearn.model_selection import train_test_split
from torch.utils.data import DataLoader, TensorDataset

from darel import api


def mlp(features: int, classes: int, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(features, 64), torch.nn.ReLU(), torch.nn.Linear(64, classes))


def losses_of(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Every sample's loss, no gradient (the scorer's pass, DAREL's refresh)."""
    with torch.no_grad():
        return F.cross_entropy(model(x), y, reduction="none")


def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return 100.0 * (model(x).argmax(1) == y).float().mean().item()


def train_plain(model, optimizer, data: TensorDataset, *, epochs: int, batch: int) -> float:
    """The plain loop. Returns its CPU time (the clock the probes use)."""
    start = time.process_time()
    loader = DataLoader(data, batch_size=batch, shuffle=True, generator=torch.Generator().manual_seed(0))
    for _ in range(epochs):
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    return time.process_time() - start


def train_planned(model, optimizer, data: TensorDataset, run: api.Run) -> float:
    """The same loop, trained as ``run`` (darel.api.plan) chose: the lines marked "# planned"."""
    start = time.process_time()
    score = lambda index: losses_of(model, *data[index])  # planned: no-grad losses where the method scores
    loader = DataLoader(run.dataset(data), batch_sampler=run.batch_sampler(score))  # planned
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, run.lr_factor)  # planned: the method's own, if any
    for _ in range(run.epochs):  # planned
        for x, y, index in loader:  # planned
            loss = run.update(index, F.cross_entropy(model(x), y, reduction="none"))  # planned
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()  # planned
    return time.process_time() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--method", action="append", help="a method of darel.methods (repeatable; default: darel, "
                    "random, infobatch)")
    ap.add_argument("--tiny", action="store_true", help="a few hundred samples and epochs: seconds")
    ap.add_argument("--t", type=float, default=0.6, help="time budget: a share of the baseline's time")
    ap.add_argument("--m", type=float, default=0.9, help="memory budget: a share of the baseline's peak step memory")
    args = ap.parse_args()
    chosen = args.method or ["darel", "random", "infobatch"]
    torch.set_num_threads(1)
    n, epochs, batch = (600, 4, 64) if args.tiny else (6000, 20, 64)
    x, y = make_classification(n_samples=n, n_features=20, n_informative=10, n_classes=4, random_state=0)
    x_train, x_test, y_train, y_test = (torch.as_tensor(a) for a in train_test_split(
        x.astype(np.float32), y.astype(np.int64), test_size=0.25, random_state=0, stratify=y))
    data = TensorDataset(x_train, y_train)

    # 1. The baseline: all data, the protocol's epochs; its time, steps and losses.
    model = mlp(20, 4, seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    rows = torch.Generator().manual_seed(1)

    def train_step(b: int) -> None:  # one optimiser step of the loop on b samples
        index = torch.randint(0, len(y_train), (b,), generator=rows)
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(x_train[index]), y_train[index]).backward()
        optimizer.step()

    steps = api.measure_steps(train_step, lambda b: losses_of(model, x_train[:b], y_train[:b]), batch=batch,
                              n_samples=len(y_train), model=model, optimizer=optimizer)
    T = train_plain(model, optimizer, data, epochs=epochs, batch=batch)
    baseline = api.Baseline(labels=y_train.numpy(), losses=losses_of(model, x_train, y_train).numpy(),
                            epochs=epochs, batch=batch, warmup_epochs=1, time_s=T, steps=steps)
    print(f"baseline: top-1 {accuracy(model, x_test, y_test):.2f} % in {T:.2f} s CPU, "
          f"{epochs * len(y_train)} samples, step memory {baseline.peak_bytes} bytes")

    # 2.-3. Every method planned at the same budget from that baseline, then trained.
    for method in chosen:
        run = api.plan(method, budget=(args.t, args.m), baseline=baseline, seed=0)
        cal = run.calibration
        print(f"budget B({args.t}, {args.m}): batch {run.batch}, alpha {cal['alpha']:.3f}, A {cal['A']:.3f}, "
              f"eta {cal['eta']}; {method}: {len(run.indices)} of {len(y_train)} samples, {run.epochs} of {epochs} "
              f"epochs, {run.plan.planned_samples:.0f} samples planned ({run.plan.predicted_time_s:.2f} s of "
              f"t_max {cal['t_max_s']:.2f} s)")
        model = mlp(20, 4, seed=1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        spent = train_planned(model, optimizer, data, run)
        print(f"{method}: top-1 {accuracy(model, x_test, y_test):.2f} % in {spent:.2f} s CPU "
              f"({spent / cal['t_max_s']:.2f} of t_max), {run.trained_samples} samples trained")


if __name__ == "__main__":
    main()
