"""DAREL in a training loop of your own (darel.api): a small MLP on a generated
classification problem (scikit-learn's make_classification: neither the paper's models
nor its data), on the CPU, without Snakemake, params.yaml or MLflow.

1. Train the baseline on all data; its time T and peak step memory M define the budget.
2. Plan the budget B(t, m) from probes of this loop's own step (Algorithm 1, Eq. 2-5 and
   DAREL's epoch plan), keep Algorithm 2's subset ranked by the baseline's losses.
3. Train a fresh model on the subset for the planned epochs with Algorithm 3 choosing
   every batch (or a control: --method uniform-online, selective-backprop, infobatch, rs2).

    python examples/own_training_loop.py            # the full example, on one core
    python examples/own_training_loop.py --tiny     # seconds (the test suite runs this)
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import make_classification
from sklearn.model_selection import train_test_split

from darel import api

# Each method's own selection settings (darel.methods), for the loop below.
CONTROL_SETTINGS = {
    "uniform-online": lambda budget, args: dict(keep_fraction=budget.A, eta=budget.eta, warmup_epochs=args.warmup,
                                                history_size=args.history, bins=args.bins),
    "selective-backprop": lambda budget, args: dict(beta=3.0, warmup_epochs=args.warmup, history_size=args.history),
    "infobatch": lambda budget, args: dict(prune_count=budget.n_kept // 4, anneal_start_epoch=budget.planned_epochs - 1),
    "rs2": lambda budget, args: dict(ratio=budget.A),
}


def mlp(features: int, classes: int, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(features, 64), torch.nn.ReLU(), torch.nn.Linear(64, classes))


def losses_of(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Every sample's loss, no gradient (the scorer's pass and Algorithm 3's refresh)."""
    with torch.no_grad():
        return F.cross_entropy(model(x), y, reduction="none")


def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return 100.0 * (model(x).argmax(1) == y).float().mean().item()


def train(model, optimizer, x, y, *, epochs: int, batch: int, policy=None, seed: int = 0) -> float:
    """Your training loop; with ``policy`` (darel.api.selection) it trains the batches the
    policy chooses. Returns its CPU time (the clock the probes use)."""
    start = time.process_time()
    order = torch.Generator().manual_seed(seed)
    for epoch in range(epochs):
        if policy is None:
            batches = ((p, None) for p in torch.randperm(len(y), generator=order).split(batch))
        else:
            batches = policy.batches(epoch, lambda positions: losses_of(model, x[positions], y[positions]))
        for positions, weights in batches:
            losses = F.cross_entropy(model(x[positions]), y[positions], reduction="none")
            loss = losses.mean() if weights is None else (losses * weights).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if policy is not None:
                policy.observe(positions, losses.detach())
    return time.process_time() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--method", default="darel", choices=["darel", *CONTROL_SETTINGS])
    ap.add_argument("--tiny", action="store_true", help="a few hundred samples and epochs: seconds")
    ap.add_argument("--t", type=float, default=0.6, help="time budget: a share of the baseline's time")
    ap.add_argument("--m", type=float, default=0.9, help="memory budget: a share of the baseline's peak step memory")
    args = ap.parse_args()
    torch.set_num_threads(1)
    n, epochs = (600, 4) if args.tiny else (6000, 20)
    args.warmup, args.history, args.bins = 1, 1024, 20
    x, y = make_classification(n_samples=n, n_features=20, n_informative=10, n_classes=4, random_state=0)
    x_train, x_test, y_train, y_test = (torch.as_tensor(a) for a in train_test_split(
        x.astype(np.float32), y.astype(np.int64), test_size=0.25, random_state=0, stratify=y))
    batch = 64

    # 1. The baseline: all data, the protocol's epochs; T and M define the budget.
    baseline = mlp(20, 4, seed=0)
    opt = torch.optim.SGD(baseline.parameters(), lr=0.05, momentum=0.9)
    rows = torch.Generator().manual_seed(1)

    def step_of(model, optimizer):
        def step(b: int) -> None:  # one optimiser step of this loop on a batch of b samples
            idx = torch.randint(0, len(y_train), (b,), generator=rows)
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(x_train[idx]), y_train[idx]).backward()
            optimizer.step()
        return step

    M = api.step_memory(step_of(baseline, opt), batch, model=baseline, optimizer=opt)
    T = train(baseline, opt, x_train, y_train, epochs=epochs, batch=batch)
    print(f"baseline: top-1 {accuracy(baseline, x_test, y_test):.2f} % in {T:.2f} s CPU, step memory {M} bytes")

    # 2. The budget, planned with probes of the run's own step, and Algorithm 2's subset.
    model = mlp(20, 4, seed=1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    budget = api.plan_budget(step_of(model, opt), lambda b: losses_of(model, x_train[:b], y_train[:b]), model=model,
                             optimizer=opt, labels=y_train.numpy(), epochs=epochs, baseline_batch=batch, T_full_s=T,
                             M_full_bytes=M, t=args.t, m=args.m, history_size=args.history, bins=args.bins,
                             warmup_epochs=args.warmup)
    keep = api.offline_subset(losses_of(baseline, x_train, y_train).numpy(), y_train.numpy(), budget.alpha)
    print(f"budget B({args.t}, {args.m}): batch {budget.batch}, alpha {budget.alpha:.3f} ({len(keep)} of "
          f"{len(y_train)} samples), A {budget.A:.3f}, eta {budget.eta}, {budget.planned_epochs} of {epochs} epochs "
          f"planned ({budget.predicted_time_s:.2f} s of t_max {budget.t_max_s:.2f} s)")

    # 3. The run: Algorithm 3 (or a control) choosing the batches of the same loop.
    if args.method == "darel":
        settings = dict(keep_fraction=budget.A, eta=budget.eta, warmup_epochs=args.warmup, history_size=args.history,
                        bins=args.bins)
        x_run, y_run = x_train[torch.as_tensor(keep)], y_train[torch.as_tensor(keep)]
    else:  # the controls train on all data (their own rule picks the samples), at the same batch
        settings = CONTROL_SETTINGS[args.method](budget, args)
        x_run, y_run = x_train, y_train
    policy = api.selection(args.method, n_samples=len(y_run), batch_size=budget.batch, seed=0, epochs=epochs,
                           **settings)
    spent = train(model, opt, x_run, y_run, epochs=budget.planned_epochs, batch=budget.batch, policy=policy)
    print(f"{args.method}: top-1 {accuracy(model, x_test, y_test):.2f} % in {spent:.2f} s CPU "
          f"(boost {T / spent:.2f}x; {spent / budget.t_max_s:.2f} of t_max)")
    assert math.isfinite(spent)


if __name__ == "__main__":
    main()
