"""darel.sgd.PlainSGD against torch.optim.SGD on the CPU: the same weights bit for bit, the
same state-dict layout both ways, and an eager job that never imports torch's compiler."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from darel import schedules
from darel.sgd import PlainSGD
from darel.step import sgd

SETTINGS = {"lr": 0.1, "momentum": 0.9, "weight_decay": 5e-4}


def _model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5),
                          nn.Linear(5, 5))
    model[5].requires_grad_(False)  # frozen: no gradient, no state
    return model


def _train(model: nn.Module, optimizer, steps: range, *, lr_at=None) -> None:
    for k in steps:
        gen = torch.Generator().manual_seed(k)
        x, y = torch.randn(6, 3, 8, 8, generator=gen), torch.randint(0, 5, (6,), generator=gen)
        if lr_at is not None:
            schedules.set_rate(optimizer, lr_at(k))
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def _same(a: nn.Module, b: nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


@pytest.mark.parametrize("settings", [SETTINGS, {"lr": 0.05, "momentum": 0.0, "weight_decay": 0.0},
                                      {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.0}])
def test_plain_sgd_trains_torchs_weights_bit_for_bit(settings):
    ours, theirs = _model(), _model()
    plain = PlainSGD(ours.parameters(), **settings)
    reference = torch.optim.SGD(theirs.parameters(), **settings)
    lr_at = lambda k: settings["lr"] * (0.2 if k >= 4 else 1.0)  # noqa: E731 - a milestone mid-way
    _train(ours, plain, range(8), lr_at=lr_at)
    _train(theirs, reference, range(8), lr_at=lr_at)
    assert _same(ours, theirs)
    assert not torch.equal(ours[0].weight, _model()[0].weight)  # it trained
    if settings["momentum"]:
        own = [plain.state[p]["momentum_buffer"] for p in ours.parameters() if p.requires_grad]
        ref = [reference.state[p]["momentum_buffer"] for p in theirs.parameters() if p.requires_grad]
        assert all(torch.equal(a, b) for a, b in zip(own, ref))
    assert ours[5].weight not in plain.state  # the frozen layer has no state, as in torch


def test_state_dicts_load_across_both_optimizers():
    """A checkpoint of either resumes in the other: each run is split in two halves with the
    optimizer swapped at the join, and ends where the unbroken run ends."""
    unbroken = _model()
    _train(unbroken, torch.optim.SGD(unbroken.parameters(), **SETTINGS), range(6))
    for first, second in ((PlainSGD, torch.optim.SGD), (torch.optim.SGD, PlainSGD)):
        model = _model()
        before = first(model.parameters(), **SETTINGS)
        _train(model, before, range(3))
        saved = copy.deepcopy(before.state_dict())
        after = second(model.parameters(), lr=1.0, momentum=0.5, weight_decay=0.0)  # the saved values win
        after.load_state_dict(saved)
        _train(model, after, range(3, 6))
        assert _same(model, unbroken), (first.__name__, second.__name__)


def test_load_state_dict_copies_the_buffers():
    model = _model()
    optimizer = PlainSGD(model.parameters(), **SETTINGS)
    _train(model, optimizer, range(2))
    saved = optimizer.state_dict()
    kept = {k: v["momentum_buffer"].clone() for k, v in saved["state"].items()}
    optimizer.load_state_dict(saved)
    _train(model, optimizer, range(2, 4))
    assert all(torch.equal(saved["state"][k]["momentum_buffer"], v) for k, v in kept.items())


def test_plain_sgd_refuses_bad_settings_naming_them():
    params = list(_model().parameters())
    with pytest.raises(ValueError, match="lr must be a non-negative number, got -0.1"):
        PlainSGD(params, lr=-0.1)
    with pytest.raises(ValueError, match="momentum .* got nan"):
        PlainSGD(params, lr=0.1, momentum=float("nan"))
    with pytest.raises(ValueError, match="empty parameter list"):
        PlainSGD([], lr=0.1)
    model = _model()
    optimizer = PlainSGD(model.parameters(), **SETTINGS)
    with pytest.raises(ValueError, match="does not match"):
        optimizer.load_state_dict({"state": {}, "param_groups": [{"params": [0], **SETTINGS}]})


def test_the_projects_sgd_is_plain_on_the_cpu():
    assert isinstance(sgd(_model().parameters(), device="cpu", **SETTINGS), PlainSGD)


def test_an_eager_cpu_training_never_imports_torchs_compiler():
    """The project's step with its SGD and the CPU memory meter counting a step (a dispatch
    mode, which torch would otherwise wrap with its compiler): torch._dynamo stays unloaded."""
    script = r"""
import sys
import torch
import torch.nn.functional as F
from torch import nn
from darel.measure import StepMemoryMeter
from darel.step import TrainStep, sgd
model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5))
optimizer = sgd(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4, device="cpu")
step = TrainStep(model, optimizer, device="cpu", precision="fp32", assemble=lambda x, y: (x, y),
                 loss_fn=lambda m, inputs: (F.cross_entropy(m(inputs[0]), inputs[1]), {}))
meter = StepMemoryMeter(model, optimizer, "cpu")
x, y = torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 2, 3])
for _ in range(3):
    with meter.step(key=4):
        step(x, y)
assert meter.peak_bytes > 0
print("torch._dynamo" in sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "False"


def test_zero_grad_without_set_to_none_zeroes_in_place_as_torch_does():
    model = _model()
    optimizer = PlainSGD(model.parameters(), **SETTINGS)
    _train(model, optimizer, range(1))
    F.cross_entropy(model(torch.randn(2, 3, 8, 8)), torch.tensor([0, 1])).backward()
    grads = {p: p.grad for p in model.parameters() if p.grad is not None}
    optimizer.zero_grad(set_to_none=False)
    assert grads and all(p.grad is g and not g.any() for p, g in grads.items())  # the same tensors, zeroed
