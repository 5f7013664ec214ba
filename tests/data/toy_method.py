"""toy: a study control that exists only in the workflow test (tests/test_workflow.py
copies this module into darel/methods/toy/__init__.py of a project copy and lists it in the study with
its settings as --config overrides; no other file changes).

Its training set is its own (``firsts``: the first ceil(alpha * n_c) samples of every
class by index, no loss involved), its selection too (every epoch the whole set in index
order, rotated by ``offset`` positions per epoch), and its plan the epochs of that set
that fit t_max at the cell's batch and step cost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from darel.methods import register
from darel.methods.base import Method, MethodPlan, Selection, step_seconds


@dataclass(frozen=True)
class Rotation(Selection):
    offset: int

    def policy(self, run, n_samples: int, device: Any):
        import torch

        offset = self.offset

        class RotatingOrder:
            name = "toy"

            def epoch_kind(self, epoch: int) -> str:
                return "firsts"

            def batches(self, epoch: int, score):
                order = torch.roll(torch.arange(n_samples, device=device), shifts=offset * epoch)
                for positions in order.split(run.batch):
                    yield positions, None

            def observe(self, positions, losses) -> None:
                pass

            def stats(self) -> dict:
                return {"offset": offset}

            def state_dict(self) -> dict:
                return {}

            def load_state_dict(self, state: dict) -> None:
                pass

        return RotatingOrder()


@dataclass(frozen=True)
class ToyPlan(MethodPlan):
    offset: int


@register
class Toy(Method):
    name = "toy"
    subset = "firsts"
    plan_type = ToyPlan
    settings_path = ("controls", "toy")
    settings_schema = {"offset": {"type": "integer", "minimum": 0}}

    def build_subset(self, labels, alpha: float, seed: int):
        import numpy as np

        from darel.selection import kept_count

        labels = np.asarray(labels)
        firsts = [np.flatnonzero(labels == c)[: kept_count(alpha, int((labels == c).sum()))] for c in np.unique(labels)]
        return np.sort(np.concatenate(firsts)).astype(np.int64)

    def plan(self, cal: dict, *, n_full: int, warmup_epochs: int, epochs: int, settings: dict) -> ToyPlan:
        n = int(cal["n_kept"])  # the same class counts as Algorithm 2's subset
        return self.fixed_epochs(cal, kind="firsts", epoch_s=math.ceil(n / int(cal["batch"])) * step_seconds(cal),
                                 samples=n, epochs=epochs, offset=int(settings["offset"]))

    def run_fields(self, plan: ToyPlan, settings) -> dict:
        return {"selection": Rotation(offset=plan.offset)}
