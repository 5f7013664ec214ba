"""torch.compile on the training step: the first step's comparison with eager mode, and
compiled code that keeps running after the CPU memory count (a dispatch mode)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from darel import image_training
from darel.methods.darel import OnlineSettings
from darel.plans import RunPlan
from darel.schedules import LrSchedule
from darel.augment import DeviceAugment
from darel.models import build_model
from darel.step import GRAPH_REHEARSALS, CompiledGradientMismatch, TrainStep, sgd


def _step(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, **kw) -> TrainStep:
    optimizer = sgd(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4, device="cpu")

    def loss_fn(module, inputs):
        logits = module(inputs[0])
        loss = F.cross_entropy(logits, inputs[1])
        return loss, {"loss": loss.detach()}

    return TrainStep(model, optimizer, device="cpu", precision="fp32", assemble=lambda: (x, y), loss_fn=loss_fn, **kw)


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model("resnet18", num_classes=4, in_channels=1, width=8)


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return torch.randn(8, 1, 8, 8, generator=gen), torch.arange(8) % 4


def _doubled_gradient(fn):
    """A 'compiler' with a defect: the loss it returns has twice the gradient."""
    def wrong(inputs):
        loss, stats = fn(inputs)
        return 2 * loss - loss.detach(), stats
    return wrong


def test_a_compiled_step_whose_gradients_differ_stops_before_it_trains() -> None:
    x, y = _batch()
    model = _model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    step = _step(model, x, y, compile=True, compiler=_doubled_gradient)
    with pytest.raises(CompiledGradientMismatch, match=r"gradient off by 1 \(relative L2"):
        step()
    for name, value in model.state_dict().items():  # no update, batch-norm statistics put back
        assert torch.equal(value, before[name]), name
    assert all(p.grad is None for p in model.parameters())


def test_the_check_changes_nothing_the_run_depends_on() -> None:
    """With an exact 'compiler' the checked run is bit-identical to an eager one, RNG included."""
    x, y = _batch()
    runs = []
    for kw in ({}, {"compile": True, "compiler": lambda fn: fn}):
        model = _model()
        torch.manual_seed(7)
        step = _step(model, x, y, **kw)
        losses = [step()["loss"].item() for _ in range(3)]
        runs.append((losses, model.state_dict(), torch.rand(1).item(), step.compile_check))
    (eager_losses, eager_state, eager_draw, no_check), (losses, state, draw, check) = runs
    assert no_check is None
    assert check == {"loss_rel_diff": 0.0, "grad_rel_diff": 0.0, "largest_difference_in": None, "tolerance": 0.1}
    assert losses == eager_losses and draw == eager_draw
    for name, value in state.items():
        assert torch.equal(value, eager_state[name]), name


def test_compile_with_a_wrapper_module_is_refused() -> None:
    x, y = _batch()
    model = _model()
    with pytest.raises(ValueError, match="forward_module wrapper"):
        _step(model, x, y, compile=True, forward_module=torch.nn.Sequential(model))


def _problem(n: int = 96):
    gen = torch.Generator().manual_seed(0)
    labels = torch.arange(n) % 4
    images = (torch.rand(n, 1, 8, 8, generator=gen) * 120 + labels.view(-1, 1, 1, 1) * 30).to(torch.uint8)
    return images, labels


def _train(width: int, compile: bool, epochs: int = 3) -> tuple[dict, list[int]]:
    images, labels = _problem()
    torch.manual_seed(0)
    model = build_model("resnet18", num_classes=4, in_channels=1, width=width)
    aug = DeviceAugment(pad=1, hflip=True, max_rotation_deg=10, mean=[0.3], std=[0.2])
    # 96 samples: full batches of 16 and one scoring batch of 96, so few graphs to compile.
    plan = RunPlan(epochs=epochs, batch=16, lr_schedule=LrSchedule("multistep", 0.05, milestones=(2,), gamma=0.2),
                          momentum=0.9, weight_decay=5e-4, seed=3, eval_batch=96, compile=compile,
                          selection=OnlineSettings(keep_fraction=0.5, eta=1, warmup_epochs=1, history_size=64,
                                                       bins=8))
    calls: list[int] = []
    summary = image_training.train(model, images, labels, aug, aug.normalise, plan, torch.device("cpu"), progress=False,
                           on_epoch_end=lambda epoch, record: calls.append(COMPILED_CALLS["n"]))
    return summary, calls


COMPILED_CALLS = {"n": 0}


@pytest.fixture
def counted_inductor(monkeypatch):
    """torch.compile with inductor, counting the calls of the compiled forward graphs."""
    from torch._inductor.compile_fx import compile_fx

    def backend(gm, example_inputs):
        compiled = compile_fx(gm, example_inputs)

        def run(*args):
            COMPILED_CALLS["n"] += 1
            return compiled(*args)
        return run

    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real_compile(fn, **{**kw, "backend": backend}))
    torch._dynamo.reset()
    COMPILED_CALLS["n"] = 0
    yield
    torch._dynamo.reset()


def test_compiled_training_on_cpu_stays_compiled_and_matches_eager_on_the_first_batch(counted_inductor) -> None:
    """Inductor on CPU (a real compile, about a minute). The CPU memory count replays the
    first steps of each batch shape under a dispatch mode after the epoch; the compiled
    graph must still run every later step (it did not: dynamo gave the frame up)."""
    summary, calls = _train(width=8, compile=True)
    check = summary["compile_check"]
    assert check["train_step"]["grad_rel_diff"] < 1e-3 and check["train_step"]["loss_rel_diff"] < 1e-5
    assert check["score"]["rel_diff"] < 1e-3
    # Compiled forward graphs called: in epoch 1 the training step's check and its 6 steps;
    # in epochs 2 and 3 (refresh epochs: eta 1) each step and the scoring pass's one batch,
    # plus that batch once more for the scoring check. Every step and pass after the first
    # epoch's CPU memory count stays compiled.
    steps_after_first = summary["steps"] - 6
    scoring_calls = 1 + 2
    assert calls[0] == 7
    assert calls[-1] == 7 + steps_after_first + scoring_calls
    assert summary["peak_mem_by_pass"]["train"] > 0


# --- the fast path on a GPU (compile: graphs), checked where the math is the same ---------------


def test_graphs_replay_only_on_a_gpu_and_not_under_the_fp16_scaler() -> None:
    from darel.step import uses_cuda_graphs

    assert uses_cuda_graphs("graphs", "cuda", "bf16") and uses_cuda_graphs("graphs", "cuda:0", "fp32")
    assert not uses_cuda_graphs("graphs", "cuda", "fp16")  # GradScaler: compiled, no graphs
    assert not uses_cuda_graphs("graphs", "cpu", "fp32") and not uses_cuda_graphs(True, "cuda", "bf16")
    with pytest.raises(ValueError, match="compile must be one of"):
        uses_cuda_graphs("yes", "cuda", "bf16")
    import yaml

    from darel import config
    from tests.conftest import ROOT

    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["profiles"]["paper"]["compile"] = "graphs"
    config.validate(params)
    params["profiles"]["paper"]["compile"] = "fast"
    with pytest.raises(config.ConfigError, match="compile"):
        config.validate(params)


def test_the_graphs_step_trains_what_the_compiled_step_trains(monkeypatch) -> None:
    """The graphs path's own work (a step boundary per step, statistics copied off the
    graph's output buffers) run on the CPU with an exact 'compiler': the same losses and
    weights, bit for bit, as compile=True and as eager mode; and on a CPU the setting
    itself replays nothing."""
    x, y = _batch()
    marks = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    runs = []
    for kw, force_graphs in (({}, False), ({"compile": True, "compiler": lambda fn: fn}, False),
                             ({"compile": "graphs", "compiler": lambda fn: fn}, True)):
        model = _model()
        step = _step(model, x, y, **kw)
        if force_graphs:
            assert not step.graphs  # a CPU: plain compile
            step.graphs = True  # what a GPU runs around the replays
            returned = []
            real_loss_fn = step.loss_fn

            def recording_loss_fn(module, inputs, real_loss_fn=real_loss_fn):
                loss, stats = real_loss_fn(module, inputs)
                returned.append(stats["loss"])
                return loss, stats
            step.loss_fn = recording_loss_fn
        losses = [step()["loss"] for _ in range(3)]
        runs.append(([v.item() for v in losses], model.state_dict()))
    assert len(marks) == 3 + GRAPH_REHEARSALS  # a boundary per step and per untimed rehearsal of the shape
    assert all(out is not copy for out, copy in zip(returned, losses))  # copies, not the graph's buffers
    (eager_losses, eager_state), *others = runs
    for losses, state in others:
        assert losses == eager_losses
        for name, value in state.items():
            assert torch.equal(value, eager_state[name]), name


def test_fused_sgd_steps_like_the_for_loop_sgd_on_the_cpu() -> None:
    """A GPU runs the fused SGD kernel; on the CPU the same fused update agrees with the
    for-loop SGD a CPU run uses (same math, another order of operations)."""
    x, y = _batch()
    states = []
    for fused in (None, True):
        model = _model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4, fused=fused)
        for _ in range(4):
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        states.append(model.state_dict())
    for name, value in states[0].items():
        torch.testing.assert_close(states[1][name], value, rtol=1e-5, atol=1e-6, msg=name)
