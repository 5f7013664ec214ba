"""What every method declares, and the typed records it makes.

A method (``Method``) is one object with:

* a ``name`` (the study's method list and the folder of its runs use it);
* ``subset``: where its training set comes from: ``"darel"`` (Algorithm 2's subset, ranked
  by the offline scorer's losses: the scorer's costs are charged to it), ``"full"`` (all
  data), or a name of its own whose indices ``build_subset`` draws (``"random"``);
* its settings: ``settings_path`` (where they live in params.yaml, e.g. ``controls.rs2``)
  and ``settings_schema`` (the JSON-schema properties the config schema validates there;
  every one required: params.yaml is the one source of their values);
* ``plan``: its time plan at a cell's calibration (a ``MethodPlan``: the epochs its own
  epoch costs fit into t_max);
* ``run_fields``: what that plan sets in the training loop's ``RunPlan`` (its typed
  ``Selection``);
* ``own_schedule``: a learning-rate schedule of its own, which darel.plans.lr_schedule,
  the one place a run's rate is decided, applies where the study's matched rule does not
  (short-schedule's).
* ``runs``: its trainings per seed and budget in a study, by name (its own name; the
  negative control one per sampler stream, each with its own settings slice).

A ``Selection`` is the typed settings of an online rule; it builds its
``SelectionPolicy`` (darel.methods.policy) for a run, importing torch only then. Nothing
in this module or in a method's declaration imports torch: the workflow reads the
declarations at every Snakemake start. Nothing here imports darel.plans either (plans
imports the methods): a run's settings arrive as darel.plans.ImageSettings, typed
``Any`` here.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar

# Where a method's training set comes from (besides names of its own, built by build_subset).
SCORER_SUBSET = "darel"
FULL_DATA = "full"


class PlanError(ValueError):
    """No plan of a method fits its budget; the message says which and by how much."""


@dataclass(frozen=True)
class Loop:
    """What a selection policy needs of the loop it runs in (a RunPlan has the same fields;
    darel.api builds this one for a loop of your own)."""

    batch: int
    seed: int
    epochs: int = 1
    score_batch: int | None = None  # the scoring pass's batch (default: eval_batch)
    eval_batch: int = 512


class Selection:
    """The typed settings of a run's online selection (a frozen dataclass in each method's
    folder); ``policy`` builds the training loop's ``SelectionPolicy`` from them."""

    def policy(self, run: Loop, n_samples: int, device: Any):
        """``run``: a Loop or a darel.plans.RunPlan (it has the same fields)."""
        raise NotImplementedError


@dataclass(frozen=True)
class MethodPlan:
    """A method's time plan for one run (a Table 1 cell's or a study cell's, plan.json):
    every method of a cell shares its budget (``t_max_s``), its calibrated batch and the
    cost model's measured terms, and gets the epochs its own epoch costs fit into t_max. Each method's plan adds its own figures
    (a subclass); a record of it is ``dataclasses.asdict`` of the whole object."""

    method: str
    subset: str
    uses_scorer: bool
    batch: int
    score_batch: int | None  # None: no budget, nothing calibrated (the IDS + ADONIS row)
    t_max_s: float | None
    rule: str | None  # the online rule of Algorithm 3 ("histogram", "uniform"), None for others
    planned_epochs: int
    predicted_time_s: float | None
    predicted_adherence: float | None
    plan_exceeds_budget: bool
    epoch_kinds: list  # the kind of every planned epoch, in order
    epoch_cost_s: dict  # the cost model's seconds per kind of epoch
    epoch_samples: dict  # the samples an epoch of each kind trains
    planned_samples: float  # the samples of all planned epochs

    def record(self) -> dict:
        return asdict(self)


class Method:
    """A training method of Table 1 and its study (see the module's docstring)."""

    name: ClassVar[str]
    subset: ClassVar[str] = FULL_DATA
    study: ClassVar[bool] = True  # may be listed in study.table1.methods
    needs_category: ClassVar[bool] = False  # build_subset reads the data's per-sample categories (category=)
    order: ClassVar[int] = 100  # position in listings (the study's table, the schema's enum)
    settings_path: ClassVar[tuple[str, ...] | None] = None
    settings_schema: ClassVar[dict] = {}
    plan_type: ClassVar[type[MethodPlan]] = MethodPlan
    selection_type: ClassVar[type[Selection] | None] = None  # its online selection (None: all data)
    # Which of DAREL's two stages this method runs alone ("offline": the ranked subset with uniform
    # keeping; "online": histogram keeping on a random subset); a study tests each against random.
    stage_alone: ClassVar[str | None] = None

    @property
    def uses_scorer(self) -> bool:
        """Whether the training set came from the offline scorer (whose training and
        scoring pass the total accounting charges to this method)."""
        return self.subset == SCORER_SUBSET

    def settings(self, params: dict) -> dict:
        """This method's settings out of a parameter dict (the whole params or a stage's
        slice); ``{}`` where they are absent (the config schema says which are missing)."""
        found: Any = params
        for key in self.settings_path or ():
            found = (found or {}).get(key)
        return dict(found or {})

    def own_settings(self, params: dict) -> dict:
        """This method's settings, refused where a method that has some finds none at its
        ``settings_path`` (a plan is never made from a silent ``{}``)."""
        found: Any = params
        for key in self.settings_path or ():
            if not isinstance(found, dict) or key not in found:
                raise ValueError(f"method {self.name} reads its settings at {'.'.join(self.settings_path)}, "
                                 "absent from the parameters given")
            found = found[key]
        return dict(found or {})

    def runs(self, params: dict) -> list[str]:
        """The names of its runs in a study cell, one training each per seed and budget (the
        job's folder and the study row's method): its own name; a method that trains several
        runs of itself (the negative control's restreams) names each."""
        return [self.name]

    def run_index(self, run: str) -> int | None:
        """Which of its runs ``run`` names (1 for its own name), None for a name not its own."""
        return 1 if run == self.name else None

    def settings_slice(self, params: dict, run: str | None = None) -> dict:
        """Its own settings nested at their params.yaml path (``{}`` for a method without
        any): what a job of this method depends on, and nothing of another method's
        (``run``: one of ``runs``, for a method whose runs differ in their settings)."""
        if not self.settings_path:
            return {}
        nested: Any = self.own_settings(params)
        for key in reversed(self.settings_path):
            nested = {key: nested}
        return nested

    def plan(self, cal: dict, *, n_full: int, warmup_epochs: int, epochs: int, settings: dict) -> MethodPlan:
        """The plan at a cell's calibration (``cal``: calibration.json; the IDS + ADONIS
        row's plan.json, its fixed settings); ``n_full`` the training set's size, ``epochs``
        and ``warmup_epochs`` the protocol's, ``settings`` this method's own. Raises
        PlanError when no plan fits t_max."""
        raise NotImplementedError(f"method {self.name} has no plan at a budget")

    def run_fields(self, plan: MethodPlan, settings: Any) -> dict:
        """The fields of the training loop's RunPlan this method's plan sets (its selection)."""
        return {}

    def own_schedule(self, plan: MethodPlan) -> dict:
        """The method's own learning-rate schedule, read by darel.plans.lr_schedule only
        (never under the study's matched rule): {} for the protocol's; ``linear_steps``: K,
        a linear decay to zero over K optimiser steps; ``epochs``: E, the protocol's
        schedule compressed to E epochs."""
        return {}

    def make_selection(self, **settings: Any) -> Selection:
        """Its selection from the selection's own fields (darel.api, a loop of your own)."""
        if self.selection_type is None:
            raise ValueError(f"method {self.name} has no online selection")
        return self.selection_type(**settings)

    def build_subset(self, labels, alpha: float, seed: int):
        """The training set's indices, for a method whose ``subset`` is a name of its own
        (a method with ``needs_category`` also takes the data's ``category`` codes)."""
        raise NotImplementedError(f"method {self.name} draws no subset of its own")

    # ---- shared by the plans -------------------------------------------------------------------
    def common(self, cal: dict) -> dict:
        """The fields every plan of a cell shares."""
        return {"method": self.name, "subset": self.subset, "batch": int(cal["batch"]),
                "score_batch": int(cal["score_batch"]), "t_max_s": cal["t_max_s"], "uses_scorer": self.uses_scorer}

    def finish(self, cal: dict, kinds: list[str], *, over_budget: bool = False, **values: Any) -> MethodPlan:
        """The plan with its planned epochs' kinds and samples; PlanError when it is over
        its budget (no plan of a study over its budget is ever used; ``over_budget``: a
        Table 1 cell's, which trains its calibrated plan all the same and records it)."""
        values = {**self.common(cal), **values, "epoch_kinds": kinds}
        values["planned_samples"] = float(sum(values["epoch_samples"][kind] for kind in kinds))
        plan = self.plan_type(**values)
        if over_budget:
            return plan
        if plan.plan_exceeds_budget or plan.predicted_time_s > cal["t_max_s"] * (1 + 1e-9):
            raise PlanError(f"method {self.name}: even {plan.planned_epochs} epoch(s) are predicted to take "
                            f"{plan.predicted_time_s:.4g} s, over t_max = {cal['t_max_s']:.4g} s; a larger budget t "
                            "is needed")
        return plan

    def fixed_epochs(self, cal: dict, *, kind: str, epoch_s: float, samples: float, epochs: int,
                     planned: int | None = None, **own: Any) -> MethodPlan:
        """The plan of a method whose every epoch is alike (``kind``, ``epoch_s`` seconds,
        ``samples`` trained): the most of ``epochs`` that fit t_max (``planned``: a count
        the method chose itself), with the method's ``own`` figures."""
        t_max = cal["t_max_s"]
        if planned is None:
            planned = epochs_that_fit(epoch_s, t_max, epochs)
        return self.finish(cal, [kind] * planned, rule=None, planned_epochs=planned,
                           predicted_time_s=planned * epoch_s, predicted_adherence=planned * epoch_s / t_max,
                           plan_exceeds_budget=epoch_s > t_max, epoch_cost_s={kind: epoch_s},
                           epoch_samples={kind: float(samples)}, **own)

    def plan_from_record(self, record: dict) -> MethodPlan:
        """A plan back from its record (plan.json, train.json's method_plan)."""
        names = {f.name for f in fields(self.plan_type)}
        return self.plan_type(**{key: value for key, value in record.items() if key in names})


def step_seconds(cal: dict) -> float:
    """One training step at the calibrated batch, in the baseline run's seconds."""
    return cal["seconds_per_probe_second"] * cal["t_b_s"]


def full_steps(n_full: int, cal: dict) -> int:
    return math.ceil(n_full / int(cal["batch"]))


def epochs_that_fit(epoch_s: float, t_max_s: float, max_epochs: int) -> int:
    """The most whole epochs of ``epoch_s`` each within ``t_max_s`` (at least 1, at most
    ``max_epochs``)."""
    if not (epoch_s > 0 and t_max_s > 0):
        raise ValueError(f"epoch_s and t_max_s must be positive, got {epoch_s!r}, {t_max_s!r}")
    return int(min(max_epochs, max(1, math.floor(t_max_s / epoch_s * (1 + 1e-9)))))
