"""Which training step each profile runs, and that its calibration probes time that same step
(issue 52 item 1): darel.step.step_kind resolved for every profile of params.yaml from the
calibration's and the training's own parameter slices, and calibrate_cell building its
probes' step and scoring forward with the plan's ``compile`` setting."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from torch import nn

from darel import config, plans
from darel.config import slices
from darel.config.cells import table1_cells
from darel.grammar import IDS_ADONIS, TABLE1_BASELINE
from darel.step import step_kind

ROOT = Path(__file__).resolve().parents[1]

# What each profile is declared to train with on its device: a GPU with bf16 (an H100) for
# the GPU profiles. paper: CUDA graphs (the fastest step, the same losses as compile: true,
# docs/gpu.md); gpu: eager (the faster profile end to end at 4 epochs, docs/gpu.md).
EXPECTED = {"quick": "eager", "fit": "eager", "gpu": "eager", "paper": "graphs"}


def test_step_kind_names_what_a_setting_runs_where():
    assert step_kind(False, "cuda", "bf16") == "eager"
    assert step_kind(True, "cuda", "bf16") == "compiled"
    assert step_kind("graphs", "cuda", "bf16") == "graphs"
    assert step_kind("graphs", "cuda", "fp16") == "compiled"  # GradScaler's host-side scale: no graphs
    assert step_kind("graphs", "cpu", "fp32") == "compiled"  # off a GPU graphs is plain torch.compile
    with pytest.raises(ValueError, match="compile must be one of"):
        step_kind("fast", "cuda", "bf16")


def _resolved_precision(runtime: plans.Runtime) -> str:
    # darel.step.resolve_precision without asking a GPU: "auto" is bf16 on the GPUs lent (H100, H200).
    if runtime.device != "cuda":
        return "fp32"
    return "bf16" if runtime.precision == "auto" else runtime.precision


@pytest.mark.parametrize("profile", sorted(EXPECTED))
def test_every_profile_calibrates_with_the_step_it_trains_with(profile):
    cfg = config.load_params(ROOT / "params.yaml", {"profile": profile})
    budgeted = [(model, seed, cell) for model, seed, cell in table1_cells(cfg)
                if cell not in (TABLE1_BASELINE, IDS_ADONIS)]
    assert budgeted, f"profile {profile} has no budgeted Table 1 cell"
    kinds = set()
    for model, seed, cell in budgeted:
        probes = plans.ImageSettings.from_slice(slices.calibration_params(cfg, model, cell, seed)).runtime
        run = plans.ImageSettings.from_slice(slices.online_params(cfg, model, cell, seed)).runtime
        baseline = plans.ImageSettings.from_slice(slices.training_params(cfg, model, seed)).runtime
        for runtime in (run, baseline):
            assert (runtime.device, runtime.precision, runtime.compile) == (
                probes.device, probes.precision, probes.compile), (model, cell)
        kinds.add(step_kind(probes.compile, probes.device, _resolved_precision(probes)))
    assert kinds == {EXPECTED[profile]}
    assert set(EXPECTED) == set(cfg["profiles"]) - _profiles_without_table1(cfg)


def _profiles_without_table1(cfg: dict) -> set[str]:
    return {name for name, prof in cfg["profiles"].items() if not prof.get("table1")}


class _CountingForward(nn.Module):
    """What the stand-in torch.compile returns for a module: the module, its calls counted."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.module(x)


@pytest.fixture(scope="module")
def setting():
    from test_calibration import calibration_setting
    return calibration_setting()


@pytest.mark.parametrize("compile", [False, True, "graphs"])
def test_the_probes_run_the_runs_step_and_scoring_forward(monkeypatch, setting, compile):
    """calibrate_cell compiles the probes' step and scoring forward exactly when the plan
    compiles (torch.compile replaced by a stand-in that records what it compiles), and the
    calibration record names the step it timed."""
    from test_calibration import _calibrate

    compiled: list = []

    def stand_in(target, **kwargs):
        wrapped = _CountingForward(target) if isinstance(target, nn.Module) else target
        compiled.append((wrapped, kwargs))
        return wrapped

    monkeypatch.setattr(torch, "compile", stand_in)
    cal = _calibrate({**setting, "plan": dataclasses.replace(setting["plan"], compile=compile)}, t=0.5, m=1.0)
    assert cal["compile"] == compile
    assert cal["step"] == ("compiled" if compile else "eager")  # on a CPU graphs is plain torch.compile
    if not compile:
        assert compiled == []
        return
    assert [kwargs.get("mode") for _, kwargs in compiled] == [None, None]  # no graphs on a CPU
    scoring = [wrapped for wrapped, _ in compiled if isinstance(wrapped, _CountingForward)]
    assert len(scoring) == 1 and scoring[0].calls > 0  # the probes' scoring passes ran through it
    step_forward = [wrapped for wrapped, _ in compiled if not isinstance(wrapped, nn.Module)]
    assert len(step_forward) == 1 and step_forward[0].__name__ == "_forward"  # TrainStep's forward and loss


def test_a_compiled_calibration_meters_memory_where_its_run_does(monkeypatch, setting):
    """The probes meter memory as the run's meter does: on a GPU a compiled run reads its first
    step of each shape in place (the check; under graphs the recording, the only step whose
    memory the allocator sees), so the probes meter their first call at each size too; a CPU
    run counts replays of steps already compiled, so there the compiled probes count what the
    eager ones count, size by size (the CPU count runs the operators eagerly)."""
    from types import SimpleNamespace

    from test_calibration import _calibrate

    from darel import calibration

    monkeypatch.setattr(torch, "compile", lambda target, **kwargs: target)
    peaks = {}
    for compile in (False, True):
        cal = _calibrate({**setting, "plan": dataclasses.replace(setting["plan"], compile=compile)}, t=0.5, m=1.0)
        peaks[compile] = {probe["batch"]: probe["peak_mem_bytes"] for probe in cal["probes"]}
    assert peaks[True] == peaks[False]
    compiled, eager = SimpleNamespace(compiled=True), SimpleNamespace(compiled=False)
    assert calibration._meters_first_call(compiled, torch.device("cuda"))
    assert not calibration._meters_first_call(compiled, torch.device("cpu"))
    assert not calibration._meters_first_call(eager, torch.device("cuda"))


def test_the_probes_have_room_to_compile_every_size_and_give_it_back():
    """torch's recompilation limit (8) is raised above the probed sizes for the probes only:
    batch 128 and the paper profile's eval batch 1024 make 11 scoring sizes (1024 ... 1)."""
    from types import SimpleNamespace

    import torch._dynamo.config as dynamo_config

    from darel import calibration

    before = dynamo_config.recompile_limit
    with calibration._compilation_room(SimpleNamespace(compiled=True), 128, 1024):
        assert dynamo_config.recompile_limit >= 11 + 1
    assert dynamo_config.recompile_limit == before
    with calibration._compilation_room(SimpleNamespace(compiled=False), 128, 1024):
        assert dynamo_config.recompile_limit == before


@pytest.mark.parametrize("recorded, wanted, refused", [
    ({}, False, False),  # a record from before the probes compiled: eager probes, an eager profile
    ({}, "graphs", True),  # ... not for a profile that trains with graphs
    ({"compile": "graphs"}, "graphs", False),
    ({"compile": True}, "graphs", True),
    ({"compile": "graphs", "step": "compiled"}, "graphs", False),  # a CPU resolves graphs to compiled
    ({"compile": "graphs", "step": "graphs"}, "graphs", True),  # probed on a GPU: not this CPU's step
])
def test_a_reused_calibration_must_have_probed_the_same_step(monkeypatch, tmp_path, recorded, wanted, refused):
    """calibrations_from: another build's calibration is taken only when its probes timed
    the step this profile trains with (its record's ``compile``); the seal and place checks
    are stood in for (tests/test_keyed_seals.py tests them)."""
    import logging

    from darel import provenance
    from stages import calibrate

    settings = {"t": 0.8, "m": 0.8, "alpha_default": 0.8, "A_min": 0.1, "A_max": 0.8}
    record = {**settings, "enforce": "plan", "planned_epochs": 3, **recorded}
    monkeypatch.setattr(provenance, "read_record", lambda path: dict(record))
    monkeypatch.setattr(provenance, "check_calibration", lambda rec, path: rec)
    monkeypatch.setattr(provenance, "check_identity", lambda out, block: None)
    monkeypatch.setattr(calibrate.io, "file_sha256", lambda path: "0" * 64)
    params = {**settings, "compile": wanted, "device": "cpu", "precision": "auto", "budget": {"enforce": "plan"},
              "protocol": {"epochs": 4}}
    reuse = lambda: calibrate.reused(params, str(tmp_path / "cal.json"), "runs/x/calibration.json",  # noqa: E731
                                     logging.getLogger("test"))
    if refused:
        expected = (f"compile {recorded.get('compile', False)!r} instead of {wanted!r}" if "step" not in recorded
                    else "a graphs step probed instead of the compiled step this device trains with")
        with pytest.raises(SystemExit, match=expected):
            reuse()
    else:
        assert reuse()["reused_from"]["sha256"] == "0" * 64
