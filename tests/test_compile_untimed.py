"""A compiled step's compilation is not training (issue 52 item 1): it runs in
``TimedWork.excluded``, which takes its seconds and energy out of the interval around it,
and it changes nothing the run trains."""

from __future__ import annotations

import contextlib

import pytest
import torch

from darel import image_training
from darel.measure import timing
from tests.test_compile import _batch, _model, _problem, _step


class _Ticks:
    """A fake clock for every counter an interval reads: each reading advances it by one
    tick; ``spend(s)`` advances it by s (work of known length)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now

    def spend(self, seconds: float) -> None:
        self.now += seconds


class _Tracker:
    """Cumulative energy that grows with the fake clock: 1 kWh per clock second."""

    def __init__(self, clock: _Ticks) -> None:
        self.clock = clock

    def reading(self) -> dict:
        at = self.clock.now
        return {"at": at, "energy_kwh": at, "cpu_energy_kwh": at, "ram_energy_kwh": 0.0, "gpu_energy_kwh": 0.0}

    def carbon_intensity_kg_per_kwh(self) -> float:
        return 1.0


@pytest.fixture
def ticks(monkeypatch) -> _Ticks:
    clock = _Ticks()

    class FakeTime:
        perf_counter = staticmethod(clock)
        process_time = staticmethod(clock)

    monkeypatch.setattr(timing, "time", FakeTime)
    monkeypatch.setattr(timing, "machine_busy_cpu_s", clock)
    return clock


def _work(ticks: _Ticks) -> timing.TimedWork:
    work = timing.TimedWork(_Tracker(ticks), "cpu")
    work.clock = ticks
    return work


def test_an_excluded_window_leaves_the_intervals_time_and_energy(ticks):
    plain, with_window = _work(ticks), _work(ticks)
    with plain.interval():
        ticks.spend(10.0)
    with with_window.interval():
        ticks.spend(10.0)
        with with_window.excluded():
            ticks.spend(100.0)
    # Each counter read is one tick. The window's clock span is its work and the four reads
    # between its two clock reads; the interval keeps only the window's other four reads.
    assert with_window.excluded_s == 100.0 + 4
    assert with_window.time_s == plain.time_s + 4 and with_window.wall_time_s == plain.wall_time_s + 4
    # Energy is read outside the clocks on both sides, so the window takes all of its own.
    assert with_window.energy["energy_kwh"] == plain.energy["energy_kwh"]
    assert with_window.energy["co2e_kg"] == plain.energy["co2e_kg"]
    assert with_window.tracker_duration_s == plain.tracker_duration_s
    assert with_window.energy_gaps == plain.energy_gaps == 0
    resumed = _work(ticks)
    resumed.load_state_dict(with_window.state_dict())
    assert resumed.excluded_s == with_window.excluded_s


def test_outside_an_interval_excluded_changes_nothing(ticks):
    work = _work(ticks)
    with work.excluded():
        ticks.spend(50.0)
    assert work.time_s == work.excluded_s == 0.0 and work.intervals == 0


def test_each_new_batch_shape_is_compiled_once_untimed_and_the_model_is_eagers():
    """An exact 'compiler': the run with its untimed compile checks trains bit for bit the
    model the eager run trains; a short batch is a new shape, compiled (checked) once."""
    x, y = _batch()
    shapes = [(x, y), (x, y), (x[:5], y[:5]), (x, y), (x[:5], y[:5])]
    runs = []
    for kw in ({}, {"compile": True, "compiler": lambda fn: fn}):
        model = _model()
        torch.manual_seed(7)
        batches = iter(shapes)
        step = _step(model, x, y, **kw)
        step.assemble = lambda: next(batches)
        entered = []

        @contextlib.contextmanager
        def untimed():
            entered.append(len(entered))
            yield

        step.untimed = untimed
        losses = [step()["loss"].item() for _ in shapes]
        runs.append((losses, model.state_dict(), torch.rand(1).item(), entered, step.compile_calls))
    (eager_losses, eager_state, eager_draw, eager_entered, eager_calls), (losses, state, draw, entered, calls) = runs
    assert eager_entered == [] and eager_calls == 0
    assert entered == [0, 1] and calls == 2  # the batch of 8 and the batch of 5
    assert losses == eager_losses and draw == eager_draw
    for name, value in state.items():
        assert torch.equal(value, eager_state[name]), name


def test_under_graphs_each_new_shape_is_rehearsed_untimed_and_the_model_is_eagers():
    """Under compile: graphs a new shape's compiled step is called GRAPH_REHEARSALS more times
    inside the untimed window (where torch's CUDA graph trees record it), undone like the check:
    every training call after it runs outside the window, and the weights are eager's bit for
    bit. Off a GPU graphs never applies, so the step is told it replays graphs (an exact
    'compiler' counting its calls stands in for torch.compile)."""
    from darel.step import GRAPH_REHEARSALS

    x, y = _batch()
    shapes = [(x, y), (x, y), (x[:5], y[:5]), (x, y)]
    runs = []
    for graphs in (False, True):
        model = _model()
        torch.manual_seed(7)
        batches = iter(shapes)
        calls = {"untimed": 0, "timed": 0}
        window = {"open": False}

        def counting(fn):
            def compiled(inputs):
                calls["untimed" if window["open"] else "timed"] += 1
                return fn(inputs)
            return compiled

        step = _step(model, x, y, compile=graphs, compiler=counting) if graphs else _step(model, x, y)
        step.graphs = graphs
        step.assemble = lambda: next(batches)

        @contextlib.contextmanager
        def untimed():
            window["open"] = True
            yield
            window["open"] = False

        step.untimed = untimed
        losses = [step()["loss"].item() for _ in shapes]
        runs.append((losses, model.state_dict(), torch.rand(1).item(), calls))
    (eager_losses, eager_state, eager_draw, _), (losses, state, draw, calls) = runs
    # Two shapes: each the check's call and the rehearsals inside the window; the 4 steps outside.
    assert calls == {"untimed": 2 * (1 + GRAPH_REHEARSALS), "timed": len(shapes)}
    assert losses == eager_losses and draw == eager_draw
    for name, value in state.items():
        assert torch.equal(value, eager_state[name]), name


@pytest.mark.parametrize("compile", [True, "graphs"])
def test_a_compiled_training_reports_its_compile_seconds_and_trains_the_eager_model(monkeypatch, compile):
    """image_training.train with an exact 'compiler' (torch.compile replaced by the identity):
    the same weights as the eager run, and the compile checks' seconds reported apart. With
    graphs the step is told it replays CUDA graphs (off a GPU it never does), so the whole
    loop runs the graphs path: a step boundary per step, the untimed rehearsals of each new
    shape, the statistics copied, between evaluations and scoring passes."""
    from darel import step as step_module
    from darel.augment import DeviceAugment
    from darel.methods.darel import OnlineSettings
    from darel.models import build_model
    from darel.plans import RunPlan
    from darel.schedules import LrSchedule

    monkeypatch.setattr(torch, "compile", lambda fn, **kw: fn)
    if compile == "graphs":
        monkeypatch.setattr(step_module, "uses_cuda_graphs", lambda setting, device, precision: setting == "graphs")
        counts = {"checks": 0, "rehearsals": 0}
        real_check, real_rehearse = step_module.check_compiled_gradients, step_module.TrainStep._rehearse

        def counted_check(*args, **kwargs):
            counts["checks"] += 1
            return real_check(*args, **kwargs)

        def counted_rehearse(self, inputs):
            counts["rehearsals"] += 1
            return real_rehearse(self, inputs)

        monkeypatch.setattr(step_module, "check_compiled_gradients", counted_check)
        monkeypatch.setattr(step_module.TrainStep, "_rehearse", counted_rehearse)
    images, labels = _problem(40)  # batches of 16: two full and a short one, two shapes
    results = []
    for compile in (False, compile):
        torch.manual_seed(0)
        model = build_model("resnet18", num_classes=4, in_channels=1, width=4)
        aug = DeviceAugment(pad=1, hflip=True, max_rotation_deg=10, mean=[0.3], std=[0.2])
        plan = RunPlan(epochs=2, batch=16, lr_schedule=LrSchedule("multistep", 0.05, milestones=(1,), gamma=0.2),
                       momentum=0.9, weight_decay=5e-4, seed=3, eval_batch=40, compile=compile,
                       selection=OnlineSettings(keep_fraction=0.5, eta=1, warmup_epochs=1, history_size=64, bins=8))
        summary = image_training.train(model, images, labels, aug, aug.normalise, plan, torch.device("cpu"),
                                       progress=False)
        results.append((summary, {k: v.clone() for k, v in model.state_dict().items()}))
    (eager, eager_state), (compiled, state) = results
    assert eager["compile_s"] is None and compiled["compile_s"] > 0
    assert compiled["compile_check"]["train_step"]["grad_rel_diff"] == 0.0
    assert (eager["step"], compiled["step"]) == ("eager", "graphs" if compile == "graphs" else "compiled")
    if compile == "graphs":
        # Each new shape (the warm-up epoch's 16 and its short last batch at least) checked once
        # and rehearsed GRAPH_REHEARSALS times.
        assert counts["checks"] >= 2 and counts["rehearsals"] == step_module.GRAPH_REHEARSALS * counts["checks"]
    for name, value in state.items():
        assert torch.equal(value, eager_state[name]), name
