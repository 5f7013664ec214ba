"""Every training method of Table 1 and its study, one folder each, found by looking.

==================  ==============================================  =====================
method              training set (``subset``)                       online stage
==================  ==============================================  =====================
baseline            all data                                        none (Table 1's row)
darel               Algorithm 2 (the scorer's loss-ranked alpha)    Algorithm 3 (histogram)
darel-history       Algorithm 2                                     Algorithm 3, its own gamma
darel-bins          Algorithm 2                                     Algorithm 3, its own bins
darel-floor         Algorithm 2                                     Algorithm 3 with a keep
                                                                    floor (mixed with A)
ids+adonis          IDS (the scorer's features)                     ADONIS (Table 1's row)
random-offline      a random alpha per class (seeded)               Algorithm 3
uniform-online      Algorithm 2                                     keep with prob. A
random              a random alpha per class                        keep with prob. A
short-schedule      all data                                        none; epochs that fit
                                                                    t_max, LR to zero
selective-backprop  all data                                        Jiang et al. 2019
infobatch           all data                                        Qin et al. 2024
rs2                 a fresh random share every epoch                Okanovic et al. 2023
darel-restream      Algorithm 2                                     Algorithm 3, another stream
                                                                    (K of them: one run each)
oracle-clean        the data without its recorded noisy labels      keep with prob. A
==================  ==============================================  =====================

Every method is one folder of this package, ``darel/methods/<name>/`` (the name with
``_`` for ``-`` and ``+``): its ``__init__`` declares it (a ``darel.methods.base.Method``
registered with ``@register``: training set, settings, plan at a budget, selection), and
its docstring is the method's card (what it does, where it follows or leaves its source,
what was decided where the source is silent). A method with a selection rule of its own
keeps that torch code in the folder's ``policy`` module, imported only when a run builds
its policy. Every folder is imported when the package is, so a new method is one new
folder (and its settings in params.yaml): the config schema, the workflow's rules and
the training loop find it here. Shared pieces sit beside the folders: ``base`` (what a
method declares, its typed plan and selection), ``policy`` (the ``SelectionPolicy``
protocol and Algorithm 3's policy, torch), ``subsets`` (the per-class random draws).
Algorithm 3 itself is darel.sampler and IDS darel.ids. No declaration imports torch at
import time.

Every method of a study cell gets the same budget B(t, m), the same calibrated batch and
a time plan from the same cost model, so a difference in accuracy is a difference of the
methods, not of the budgets.
"""

from __future__ import annotations

import importlib
import pkgutil

from darel import grammar
from darel.methods.base import FULL_DATA, SCORER_SUBSET, Method, MethodPlan, PlanError, Selection

_REGISTRY: dict[str, Method] = {}


def register(cls: type[Method]) -> type[Method]:
    """Class decorator: one instance of ``cls`` becomes the method called ``cls.name``."""
    name = cls.name
    for what, value in (("name", name), ("subset", cls.subset)):  # a study method's folder and subset file
        if cls.study and not grammar.matches(grammar.NAME, value):
            raise ValueError(f"method {name!r} ({cls.__module__}): a study method's {what} must match {grammar.NAME}, "
                             f"got {value!r}")
    if name in _REGISTRY and type(_REGISTRY[name]) is not cls:
        raise ValueError(f"method {name!r} is declared twice: {type(_REGISTRY[name]).__module__} and {cls.__module__}")
    _REGISTRY[name] = cls()
    return cls


def _discover() -> None:
    """Import every method folder (a package; the shared modules beside them are not methods)."""
    for info in pkgutil.iter_modules(__path__):
        if info.ispkg and not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")


def get(name: str) -> Method:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown method {name!r}; known: {', '.join(names())}") from None


def of_run(run: str) -> Method:
    """The method a study run belongs to: the method of that name, or the method that names
    its further runs ``<method>-<k>`` (``Method.run_index``: the negative control's restreams)."""
    if run in _REGISTRY:
        return _REGISTRY[run]
    owner = run.rpartition("-")[0]
    if owner in _REGISTRY and _REGISTRY[owner].run_index(run) is not None:
        return _REGISTRY[owner]
    raise ValueError(f"unknown method or run {run!r}; known methods: {', '.join(names())}")


def all_methods() -> list[Method]:
    return sorted(_REGISTRY.values(), key=lambda m: (m.order, m.name))


def names(*, study: bool = False) -> tuple[str, ...]:
    """Every method's name (``study``: only those a study may list), in listing order."""
    return tuple(m.name for m in all_methods() if m.study or not study)


def own_subsets() -> dict[str, Method]:
    """The training sets methods draw themselves (e.g. "random"), each with the first
    method that declares it (every method of one name draws it alike)."""
    found: dict[str, Method] = {}
    for method in all_methods():
        if method.subset not in (SCORER_SUBSET, FULL_DATA) and method.study:
            found.setdefault(method.subset, method)
    return found


_discover()

__all__ = ["FULL_DATA", "SCORER_SUBSET", "Method", "MethodPlan", "PlanError", "Selection", "all_methods", "get",
           "names", "of_run", "own_subsets", "register"]
