"""Every run's learning rate at every optimiser step, for the frozen table that proves the
learning-rate rule moved nothing (tests/test_lr_schedule.py, tests/data/lr_golden.json).

A case is one run set up the way the stages set it up (darel.plans.run_plan from a stage's
slice and a method's plan at a made-up calibration), under every profile, model, budget
setting, study rule and short-schedule setting of params.yaml. ``steps_of`` walks the
run's optimiser steps as the image loop meets them (each epoch's kind and planned samples,
the samples trained after each step, whether it ends its epoch), and ``rates_of`` hands
each step to a function of the step that the caller gives: the code under test.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import math

import yaml

from darel import config, methods, plans
from darel.methods.darel import online_epoch_plan
from tests.conftest import ROOT

N_FULL = 1000
CAL_BATCH = 64  # below every profile's protocol batch but the quick one's, so lr_rule matters


def _calibration(epochs: int, warmup_epochs: int, t_max_s: float, enforce: str) -> dict:
    cal = dict(batch=CAL_BATCH, A=0.3, eta=3, alpha=0.8, n_kept=800, t_max_s=t_max_s, seconds_per_probe_second=1.2,
               t_b_s=0.05, t_score_s=0.04, score_batch=256, t_plan_s=0.01, enforce=enforce, t=0.5, m=0.55)
    planned = online_epoch_plan(cal, n_kept=cal["n_kept"], warmup_epochs=warmup_epochs, epochs=epochs)
    planned.pop("epoch_samples")
    return {**cal, **planned}


def cases():
    """(name, run plan, method plan or None) for every case."""
    base = yaml.safe_load((ROOT / "params.yaml").read_text())
    out = []
    for profile in base["profiles"]:
        for model, budget_schedule, lr_rule, enforce in itertools.product(
                ("resnet18", "resnet18_hc"), ("keep", "rescale"), ("keep", "linear"), ("plan", "wallclock")):
            cfg = copy.deepcopy(base)
            cfg["profile"] = profile
            cfg["budget"].update(schedule=budget_schedule, lr_rule=lr_rule, enforce=enforce)
            # One budget cell on every profile and model (its t and m leave the rate alone).
            cfg["profiles"][profile].setdefault("table1", {}).setdefault(model, []).append([0.5, 0.55])
            proto = config.model_protocol(cfg, model)
            epochs, warmup = int(proto["epochs"]), int(proto["warmup_epochs"])
            cal = _calibration(epochs, warmup, t_max_s=epochs * 0.6, enforce=enforce)
            tag = f"{profile}/{model}/{budget_schedule}/{lr_rule}/{enforce}"
            if enforce == "plan":  # the baseline ignores the budget settings but lr_rule at its own batch
                settings = plans.ImageSettings.from_slice(config.training_params(cfg, model, 0))
                out.append((f"{tag}/baseline", plans.run_plan(settings), None))
            table1 = plans.method_plan("darel", cal, n_full=N_FULL, warmup_epochs=warmup, epochs=epochs, table1=True)
            settings = plans.ImageSettings.from_slice(config.online_params(cfg, model, "t0.50_m0.55", 0))
            out.append((f"{tag}/table1-darel", plans.run_plan(settings, table1), table1))
            for rule, short in itertools.product(("matched", "paper"), ("linear", "milestones")):
                cfg["study"]["schedule"] = rule
                cfg["controls"]["short_schedule"]["schedule"] = short
                for method in methods.names(study=True):
                    if method != "short-schedule" and short != "linear":
                        continue
                    own = plans.ImageSettings.from_slice(config.control_params(cfg, model, "t0.50_m0.55", 0, method))
                    try:
                        planned = plans.method_plan(method, cal, n_full=N_FULL, warmup_epochs=warmup, epochs=epochs,
                                                    params=cfg)
                    except methods.PlanError:
                        continue
                    out.append((f"{tag}/{rule}/{method}/{short}", plans.run_plan(own, planned), planned))
    return out


def steps_of(run, planned):
    """(epoch, steps before, samples trained in the epoch after it, ends its epoch, the
    epoch's kind, the samples of an epoch over the whole training set) for every optimiser
    step of ``run``: the planned epochs' kinds and samples, and past them (the wall clock's
    protocol epochs) the last planned kind."""
    kinds = list(planned.epoch_kinds) if planned is not None else []
    samples = dict(planned.epoch_samples) if planned is not None else {}
    done = 0
    for epoch in range(run.epochs_to_run):
        kind = kinds[min(epoch, len(kinds) - 1)] if kinds else "warmup"
        size = max(1, int(round(samples.get(kind, N_FULL))))
        count = math.ceil(size / run.batch)
        for k in range(count):
            yield epoch, done + k, min((k + 1) * run.batch, size), k == count - 1, kind, N_FULL
        done += count


def digest(rates) -> str:
    return hashlib.sha256(repr([float(r) for r in rates]).encode()).hexdigest()


def rates_of(run, planned, rate_at) -> list[float]:
    """``rate_at(run, step)`` for every step of ``run`` (``steps_of``)."""
    return [rate_at(run, step) for step in steps_of(run, planned)]
