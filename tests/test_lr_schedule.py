"""The one learning-rate rule (darel.plans.lr_schedule, read by darel.schedules.lr_at)
moved no rate: every case of tests/lr_cases.py (every profile, model, budget.schedule,
budget.lr_rule, enforcement, study rule, short-schedule setting and method of
params.yaml) sets, at every optimiser step, exactly the rate the code before it set (the
frozen table tests/data/lr_golden.json, written by that code at commit 8eaf3a4, where this
test read the old image_training.learning_rate and _ImageEpochs._step_at)."""

from __future__ import annotations

import json

from darel import schedules
from tests import lr_cases
from tests.conftest import ROOT


def _rate_at(run, step) -> float:
    epoch, before, trained, last, kind, n = step
    return schedules.lr_at(run.lr_schedule, schedules.StepAt(epoch, before, trained=trained, last=last, kind=kind,
                                                             full=n))


def test_every_case_sets_the_frozen_tables_rate_at_every_step():
    golden = json.loads((ROOT / "tests" / "data" / "lr_golden.json").read_text())
    golden.pop("_about")
    moved, seen = [], set()
    for name, run, planned in lr_cases.cases():
        values = lr_cases.rates_of(run, planned, _rate_at)
        seen.add(name)
        if f"{len(values)}:{lr_cases.digest(values)}" != golden.get(name):
            moved.append(name)
    assert not moved, f"{len(moved)} cases moved, e.g. {moved[:5]}"
    assert seen == set(golden)
