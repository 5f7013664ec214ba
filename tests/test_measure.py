from __future__ import annotations

import math
import platform
import threading
import time

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from darel import measure


def _tiny_conv_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5),
    )


def _batch_maker(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)

    def make_batch(b: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(b, 3, 8, 8, generator=gen), torch.randint(0, 5, (b,), generator=gen)

    return make_batch


def _step_for(model, optimizer):
    from darel.step import TrainStep

    return TrainStep(model, optimizer, device="cpu", precision="fp32", assemble=lambda x, y: (x, y),
                     loss_fn=lambda module, batch: (F.cross_entropy(module(batch[0]), batch[1]), {}))


def _probe_peak(b: int) -> int:
    """Peak of the second (steady-state) training step at batch b."""
    model = _tiny_conv_net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    step = _step_for(model, optimizer)
    make_batch = _batch_maker()
    step(*make_batch(b))
    meter = measure.StepMemoryMeter(model, optimizer, "cpu")
    with meter.step():
        step(*make_batch(b))
    return meter.peak_bytes


def test_cpu_live_tensor_count_is_linear_in_batch_and_deterministic():
    peaks = {b: _probe_peak(b) for b in (2, 3, 4, 6)}
    per_sample = peaks[3] - peaks[2]
    assert per_sample > 0
    # Linear in b (from b = 2 on; batch 1 saves a few tensors of other sizes): equal steps
    # between consecutive sizes, twice the step from 4 to 6.
    assert abs((peaks[4] - peaks[3]) - per_sample) <= 0.01 * per_sample
    assert abs((peaks[6] - peaks[4]) - 2 * per_sample) <= 0.01 * per_sample
    # The constant part holds at least the parameters and their momentum (gradients appear
    # during backward and are freed after the update).
    n_param_bytes = sum(p.numel() * p.element_size() for p in _tiny_conv_net().parameters())
    assert peaks[2] - 2 * per_sample >= 2 * n_param_bytes
    assert _probe_peak(4) == peaks[4]


def test_cpu_meter_sees_what_a_pass_allocates_and_frees():
    model = _tiny_conv_net()
    meter = measure.StepMemoryMeter(model, None, "cpu")
    resident = sum(p.numel() * p.element_size() for p in model.parameters())
    resident += sum(b.numel() * b.element_size() for b in model.buffers())
    with meter.step(kind="eval"):
        big = torch.ones(1000, 1000)  # 4 MB alive together with a second one
        other = big * 2
        del big, other
        small = torch.ones(10)
    assert meter.peak_by_kind["eval"] == resident + 2 * 4_000_000 + 0  # the small one came after both died
    del small


def test_meter_records_source_kinds_and_counts_a_key_twice_only():
    model = _tiny_conv_net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    step = _step_for(model, optimizer)
    meter = measure.StepMemoryMeter(model, optimizer, torch.device("cpu"))
    x, y = _batch_maker()(4)
    counted = []
    original = measure.StepMemoryMeter._cpu_step

    def spy(self, kind):
        counted.append(kind)
        return original(self, kind)

    measure.StepMemoryMeter._cpu_step = spy
    try:
        for _ in range(4):
            with meter.step(key=4, kind="train"):
                step(x, y)
        with torch.no_grad(), meter.step(key=4, kind="eval"):
            model(x)
    finally:
        measure.StepMemoryMeter._cpu_step = original
    assert counted == ["train", "train", "eval"]
    assert meter.steps == 5
    assert meter.source == measure.CPU_MEMORY_SOURCE
    assert meter.peak_by_kind["train"] > meter.peak_by_kind["eval"] > 0
    assert meter.peak_bytes == meter.peak_by_kind["train"]
    assert meter.rss_peak_bytes > meter.peak_bytes
    assert meter.nvml_peak_bytes is None and "cpu" in meter.nvml_status


def test_probing_leaves_training_state_untouched():
    model = _tiny_conv_net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    make_batch = _batch_maker()
    # One real step first, so there are momentum buffers and gradients to preserve.
    x, y = make_batch(4)
    F.cross_entropy(model(x), y).backward()
    optimizer.step()
    model.eval()
    before_model = {k: v.clone() for k, v in model.state_dict().items()}
    before_momentum = [optimizer.state[p]["momentum_buffer"].clone() for p in model.parameters()]
    before_grads = [p.grad.clone() for p in model.parameters()]
    before_rng = torch.get_rng_state()
    step = _step_for(model, optimizer)

    with measure.preserved_training_state(model, optimizer, step):
        model.train()
        times = measure.time_passes({8: lambda: step(*make_batch(8)), 2: lambda: step(*make_batch(2))}, "cpu",
                                    warmup=1, repeats=2, rounds=2)

    assert set(times) == {8, 2} and all(t > 0 for t in times.values())
    assert not model.training
    for key, value in model.state_dict().items():
        assert torch.equal(value, before_model[key]), key
    for p, momentum, grad in zip(model.parameters(), before_momentum, before_grads):
        assert torch.equal(optimizer.state[p]["momentum_buffer"], momentum)
        assert torch.equal(p.grad, grad)
    assert torch.equal(torch.get_rng_state(), before_rng)


def test_time_passes_interleaves_rounds():
    calls = []
    passes = {name: (lambda name=name: calls.append(name)) for name in ("a", "b", "c")}
    measure.time_passes(passes, "cpu", warmup=1, repeats=2, rounds=3)
    assert calls[:3] == ["a", "b", "c"]  # warm-up
    timed = calls[3:]
    assert timed == ["a", "a", "b", "b", "c", "c", "c", "c", "b", "b", "a", "a", "a", "a", "b", "b", "c", "c"]


@pytest.mark.parametrize("bad", [dict(repeats=0), dict(rounds=0), dict(warmup=-1)])
def test_time_passes_rejects_bad_arguments(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        measure.time_passes({"a": lambda: None}, "cpu", **{"warmup": 0, "repeats": 1, "rounds": 1, **bad})


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the fallback on a machine without a GPU")
def test_nvml_fallback_without_gpu():
    handle, status = measure.open_nvml("cuda:0")
    assert handle is None and status.startswith("NVML unavailable")
    model = _tiny_conv_net()
    meter = measure.StepMemoryMeter(model, torch.optim.SGD(model.parameters(), lr=0.1), "cuda")
    assert meter.nvml_peak_bytes is None
    assert meter.nvml_status.startswith("NVML unavailable")
    assert meter.source == measure.CUDA_MEMORY_SOURCE


def test_eq6_hand_computed():
    # 2 h at 50 W CPU + 10 W DRAM + 2 x 200 W GPU = 460 W -> 0.92 kWh; x PUE 1.5 x 0.4 kg/kWh.
    co2e = measure.eq6_co2e_kg(7200, 50, 10, 200, 2, 1.5, 0.4)
    assert co2e == pytest.approx(0.4 * 1.5 * 2 * 460 / 1000)
    assert measure.eq6_co2e_kg(7200, 50, 10, 200, 0, 1.0, 0.4) == pytest.approx(0.4 * 2 * 60 / 1000)
    with pytest.raises(ValueError, match="pue"):
        measure.eq6_co2e_kg(1, 1, 1, 1, 0, 0.5, 0.4)


def test_energy_tracker_round_trip_offline():
    threads_before = set(threading.enumerate())
    tracker = measure.EnergyTracker("USA", pue=1.2, measure_power_secs=0.5)
    started = time.perf_counter()
    tracker.start()
    a = torch.randn(128, 128)
    end = time.perf_counter() + 2.0
    while time.perf_counter() < end:
        a = torch.tanh(a @ a)
    result = tracker.stop()
    wall_s = time.perf_counter() - started

    assert set(measure.ENERGY_KEYS) <= set(result)
    assert result["energy_source"].startswith("codecarbon "), result["energy_source"]
    assert result["energy_kwh"] > 0 and result["co2e_kg"] > 0
    assert 2.0 <= result["duration_s"] <= wall_s  # the 2 s of work, within start..stop
    assert result["energy_kwh"] == pytest.approx(
        result["cpu_energy_kwh"] + result["ram_energy_kwh"] + result["gpu_energy_kwh"], rel=1e-6)
    assert result["pue"] == 1.2 and result["country_iso_code"] == "USA"
    assert result["codecarbon_version"] == "3.3.2"
    # RAM power is a constant estimate, so its energy must be that power times the
    # wall time: this catches the overlapping/lost measurement windows repaired in
    # measure.energy._serialised_tracker_class.
    ram_expected_kwh = result["codecarbon_ram_power_w"] * result["duration_s"] / 3.6e6
    assert result["ram_energy_kwh"] == pytest.approx(ram_expected_kwh, rel=0.1)
    # Eq. 6 from the reported mean powers, duration and intensity gives back the co2e.
    recomputed = measure.eq6_co2e_kg(result["duration_s"], result["cpu_power_w"], result["ram_power_w"],
                                     result["gpu_power_w"], result["n_gpus"], result["pue"],
                                     result["carbon_intensity_kg_per_kwh"])
    assert recomputed == pytest.approx(result["co2e_kg"], rel=0.25)
    # No timer thread of codecarbon outlives stop().
    time.sleep(0.1)
    leftover = [t for t in set(threading.enumerate()) - threads_before if t.is_alive()]
    assert leftover == []


def test_energy_tracker_failure_gives_nan_not_an_exception(monkeypatch):
    def broken() -> type:
        raise RuntimeError("simulated codecarbon failure")

    monkeypatch.setattr(measure.energy, "_serialised_tracker_class", broken)
    tracker = measure.EnergyTracker("USA")
    tracker.start()
    result = tracker.stop()
    assert set(measure.ENERGY_KEYS) <= set(result)
    assert math.isnan(result["energy_kwh"]) and math.isnan(result["co2e_kg"])
    assert "simulated codecarbon failure" in result["energy_source"]


@pytest.mark.parametrize("kwargs", [dict(country_iso_code="US"), dict(country_iso_code="XYZ"),
                                    dict(country_iso_code="USA", pue=0.9),
                                    dict(country_iso_code="USA", measure_power_secs=0),
                                    dict(country_iso_code="USA", tracking_mode="gpu")])
def test_energy_tracker_rejects_bad_settings(kwargs):
    with pytest.raises(ValueError):
        measure.EnergyTracker(**kwargs)


def test_kernel_cpu_brand_parsing():
    from darel.measure.energy import kernel_cpu_brand

    x86 = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13 64-Core Processor  \nflags\t: fpu\n"
    assert kernel_cpu_brand(x86) == "AMD EPYC 7B13 64-Core Processor"
    arm = "processor\t: 0\nBogoMIPS\t: 50.00\nCPU implementer\t: 0x41\n"
    assert kernel_cpu_brand(arm) is None
    assert kernel_cpu_brand("model name\t: \n") is None
    assert kernel_cpu_brand("model name\t: \nstepping\t: 3\n") is None  # an empty name does not take the next line


def test_energy_tracker_names_the_cpu_without_py_cpuinfos_subprocess(monkeypatch):
    """codecarbon's CPU name (its key to the TDP table) comes from the kernel during the
    tracker's start: the same string py-cpuinfo's subprocess gives, and no subprocess runs."""
    import cpuinfo
    from codecarbon.core import hardware_cache, util

    from darel.measure import energy
    from darel.measure.energy import kernel_cpu_brand

    brand = kernel_cpu_brand()
    if brand is None or platform.machine().lower() not in energy._KERNEL_NAMES_THE_BRAND:
        pytest.skip("not x86 Linux with a model name in /proc/cpuinfo: py-cpuinfo runs as before")
    assert brand == cpuinfo.get_cpu_info()["brand_raw"]  # the real subprocess, once, for the comparison
    util.detect_cpu_model.cache_clear()
    hardware_cache.clear_cache()

    def no_subprocess():
        raise AssertionError("py-cpuinfo's subprocess ran")

    monkeypatch.setattr(cpuinfo.cpuinfo, "get_cpu_info_json", no_subprocess)
    tracker = measure.EnergyTracker("USA", measure_power_secs=0.5)
    tracker.start()
    try:
        assert tracker._failure is None
        assert tracker._tracker._conf["cpu_model"] == brand
    finally:
        result = tracker.stop()
        util.detect_cpu_model.cache_clear()
        hardware_cache.clear_cache()
    assert result["energy_source"].startswith("codecarbon "), result["energy_source"]
    assert cpuinfo.get_cpu_info.__module__ == "cpuinfo.cpuinfo"  # put back after the start


def test_energy_tracker_asks_py_cpuinfo_where_the_kernels_name_is_not_its_answer(monkeypatch):
    """Off x86 (e.g. an ARM kernel, whose /proc/cpuinfo py-cpuinfo reads otherwise) the
    tracker's start asks py-cpuinfo, as codecarbon does by itself."""
    import cpuinfo
    from codecarbon.core import hardware_cache, util

    asked = []

    def stand_in():
        asked.append(True)
        return {"brand_raw": "Stand-in CPU"}

    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    monkeypatch.setattr(cpuinfo, "get_cpu_info", stand_in)
    util.detect_cpu_model.cache_clear()
    hardware_cache.clear_cache()
    tracker = measure.EnergyTracker("USA", measure_power_secs=0.5)
    tracker.start()
    try:
        assert asked and tracker._tracker._conf["cpu_model"] == "Stand-in CPU"
    finally:
        tracker.stop()
        util.detect_cpu_model.cache_clear()
        hardware_cache.clear_cache()
