"""The learning-rate rule moved no rate: every case of tests/lr_cases.py (every profile,
model, budget.schedule, budget.lr_rule, enforcement, study rule, short-schedule setting and
method of params.yaml) sets, at every optimiser step, exactly the rate the code before the
one rule set (the frozen table tests/data/lr_golden.json, written by that code)."""

from __future__ import annotations

import json

from darel import image_training
from tests import lr_cases
from tests.conftest import ROOT


def _rate_at_before(run, step) -> float:
    epoch, before, trained, last, kind, n = step
    body = object.__new__(image_training._ImageEpochs)
    body.plan, body.n, body._offsets, body.kind = run, n, None, kind
    return image_training.learning_rate(run).rate(body._step_at(epoch, before, trained, last))


def test_every_case_sets_the_frozen_tables_rate_at_every_step():
    golden = json.loads((ROOT / "tests" / "data" / "lr_golden.json").read_text())
    golden.pop("_about")
    moved, seen = [], set()
    for name, run, planned in lr_cases.cases():
        values = lr_cases.rates_of(run, planned, _rate_at_before)
        seen.add(name)
        if f"{len(values)}:{lr_cases.digest(values)}" != golden.get(name):
            moved.append(name)
    assert not moved, f"{len(moved)} cases moved, e.g. {moved[:5]}"
    assert seen == set(golden)
