"""bench/gpu.py's counting part (runs on CPU) and, on CUDA only, the no-host-sync checks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from darel.sampler import OnlineSampler
from tests.conftest import load_script

ROOT = Path(__file__).resolve().parents[1]


gpu = load_script("bench/gpu.py", "bench_gpu")


def _tiny_step_setting() -> tuple[dict, dict, torch.device, torch.Tensor, torch.Tensor]:
    """(protocol, augmentation, device, images, labels) of a width-4 ResNet18 step on 64
    random 16-px images: what the step variants' CPU tests train."""
    proto = {"width": 4, "lr": 0.1, "momentum": 0.9, "weight_decay": 5e-4}
    augment = {"pad": 4, "hflip": True, "rotation_deg": 15}
    images = torch.randint(0, 256, (64, 3, 16, 16), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    return proto, augment, torch.device("cpu"), images, torch.arange(64) % gpu.CLASSES


def test_planning_op_count_does_not_grow_with_the_number_of_chunks() -> None:
    batch, history, bins, A = 16, 64, 8, 0.3
    new, old = {}, {}
    for chunks in (8, 16, 64):  # every epoch longer than the buffer (its push is then one copy)
        n = chunks * batch - 5  # a partial last chunk
        new[chunks] = gpu.planning_ops(n, batch, history, bins, A, "batched", torch.device("cpu"))
        old[chunks] = gpu.planning_ops(n, batch, history, bins, A, "per_chunk", torch.device("cpu"))
    assert new[8] == new[16] == new[64]
    # The per-chunk reference pays tens of operations per chunk; the batched plan is >= 20x fewer at 64.
    assert old[64] - old[16] >= 48 * 20
    assert old[64] >= 20 * new[64]


def test_op_counter_counts_forward_and_backward() -> None:
    x = torch.randn(3, requires_grad=True)
    assert gpu.count_ops(lambda: (x * 2).sum().backward()) >= 3
    assert gpu.count_syncs(torch.device("cpu"), lambda: None) is None


def test_bench_cpu_counting_part_runs(capsys) -> None:
    gpu.main(["--device", "cpu", "--quick", "--n", "64", "--batch", "4", "--hc-size", "32", "--plan-n", "600",
              "--plan-batches", "16,64"])
    out = capsys.readouterr().out
    assert out.count("device ops per training step") == 2
    assert out.count("timings (images/s, epochs, 200-epoch projection): need a GPU") == 2
    assert "arithmetic floor for 200 epochs x 50,000 at 800 TFLOP/s: 41.7 s" in out  # 555.5 M MACs (ResNet18)
    rows = [line.split() for line in out.splitlines() if line.strip().startswith(("16 ", "64 "))]
    assert len(rows) == 2 and rows[0][3] == rows[1][3]  # batched count, same for 38 and 10 chunks


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", ["resnet18", "resnet18_hc"])
def test_steps_and_planning_make_no_host_sync_on_cuda(name: str) -> None:
    device = torch.device("cuda")
    gen = torch.Generator(device=device).manual_seed(0)
    images = torch.randint(0, 256, (512, 3, 32, 32), dtype=torch.uint8, generator=gen, device=device)
    labels = torch.randint(0, 100, (512,), generator=gen, device=device)
    settings = gpu.paper_settings()
    proto = dict(settings["protocols"][name], width=8)
    input_size = 64 if proto.get("input_size") else None
    precisions = ["fp32", "fp16"] + (["bf16"] if torch.cuda.is_bf16_supported() else [])
    for precision in precisions:
        step = gpu.make_step(name, proto, settings["augment"], images, labels, device, precision, False, input_size)
        warm = OnlineSampler(n_samples=512, batch_size=64, keep_fraction=1.0, eta=1, warmup_epochs=10,
                             history_size=1, bins=2, seed=0, device=device)
        idx = torch.randperm(512, generator=gen, device=device)[:64]
        for _ in range(2):  # optimiser state and scaler are created lazily
            step(idx, gen)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for batch in warm.plan_epoch(0)[:3]:  # a warm-up epoch's planning and steps: no sync at all
                step(batch, gen)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    online = gpu.planning_sampler(512, 64, 128, 8, 0.3, "batched", device)
    assert gpu.count_syncs(device, lambda: online.plan_epoch(1)) <= 1  # the kept indices' length


def test_every_variant_starts_from_the_same_model_and_batches() -> None:
    """The side-by-side comparison's premise: two fresh steps of a variant give the same
    loss curve (same initial model, batches and augmentation draws), bit for bit on CPU."""
    proto, augment, device, images, labels = _tiny_step_setting()
    curves = [gpu.loss_curve(gpu.make_step("resnet18", proto, augment, images, labels, device, "fp32", False, None),
                             images, 4, 8, device) for _ in range(2)]
    assert curves[0] == curves[1] and len(curves[0]) == 4 and all(v > 0 for v in curves[0])
    assert len(set(curves[0])) == 4  # the model trains: every step's loss differs


def test_jitter_moves_the_initial_model_by_one_rounding_and_nothing_else() -> None:
    """The noise yardstick starts from the same model moved by a relative 2^-9 per weight
    (fixed signs: two jitter steps give one curve), so its first loss is within a rounding
    of eager's and its curve departs from eager's as rounding noise grows."""
    proto, augment, device, images, labels = _tiny_step_setting()

    def step(jitter: float):
        return gpu.make_step("resnet18", proto, augment, images, labels, device, "fp32", False, None, jitter=jitter)

    eager, moved = step(0.0), step(gpu.JITTER)
    for (name, a), (_, b) in zip(eager.model.state_dict().items(), moved.model.state_dict().items()):
        if name.endswith(("weight", "bias")):  # a weight at zero (batch norm's bias at start) rounds to zero
            ratio = (b / a)[a != 0]
            assert torch.allclose((ratio - 1).abs(), torch.full_like(ratio, gpu.JITTER), rtol=1e-3), name
            assert len(ratio) < 8 or bool((ratio > 1).any() and (ratio < 1).any()), name  # both signs
        else:  # batch-norm statistics are buffers, not weights: untouched
            assert torch.equal(a, b), name
    curves = {key: gpu.loss_curve(s, images, 4, 8, device) for key, s in
              (("eager", eager), ("jitter", moved), ("jitter2", step(gpu.JITTER)))}
    assert curves["jitter"] == curves["jitter2"] and curves["jitter"] != curves["eager"]
    assert abs(curves["jitter"][0] - curves["eager"][0]) < 1e-2 * curves["eager"][0]


def test_a_curve_is_within_rounding_noise_when_its_distance_from_eager_is_at_most_twice_jitters() -> None:
    eager = [4.0, 3.0, 2.0, 1.0, 0.5]
    curves = {"eager": eager, "jitter": [e + d for e, d in zip(eager, [0.0, 0.01, -0.02, 0.01, 0.03])],
              "compile": [e + d for e, d in zip(eager, [0.0, -0.02, 0.02, 0.01, -0.5])],
              "graphs": [e + d for e, d in zip(eager, [0.1, 0.05, -0.05, 0.04, 0.03])]}
    checks = gpu.curve_check(curves)
    assert set(checks) == {"jitter", "compile", "graphs"}
    assert checks["jitter"] == {"median_abs_diff": pytest.approx(0.01), "max_abs_diff": pytest.approx(0.03),
                                "x_noise": pytest.approx(1.0), "within_noise": True}
    # compile: median 0.02 = 2 x noise (within; one large step does not move a median), graphs 0.05 = 5 x
    assert checks["compile"]["x_noise"] == pytest.approx(2.0) and checks["compile"]["within_noise"]
    assert checks["compile"]["max_abs_diff"] == pytest.approx(0.5)
    assert checks["graphs"]["x_noise"] == pytest.approx(5.0) and not checks["graphs"]["within_noise"]
    assert gpu.curve_check({"eager": eager, "graphs": eager}) == {}  # no yardstick, no verdict
    assert gpu.parse_args(["--device", "cuda"]).variants == ["eager", "jitter", "graphs", "graphs_full", "graphs_opt"]


def test_the_warmup_bench_measures_every_piece_in_both_search_modes_on_a_cpu(tmp_path) -> None:
    """bench/gpu_warmup.py's probe path at a tiny size (the GPU session's `warmup` part): both
    fresh processes report every piece, and the epoch's last batch has its own shape."""
    import json
    import subprocess
    import sys

    out = tmp_path / "warmup.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_warmup.py"), "--device", "cpu", "--width", "4",
                           "--n-train", "300", "--n-test", "50", "--batch", "128", "--steady-steps", "2",
                           "--threads", "1", "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads(out.read_text())["results"]
    assert set(results) == {"cudnn.benchmark=True", "cudnn.benchmark=False"}
    for row in results.values():
        assert "first step, the epoch's last batch (44)" in row and row["precision"] == "fp32"
        assert all(value > 0 for key, value in row.items() if key != "precision")
    assert "the first steps of the two shapes cost" in done.stdout


def test_the_host_phases_cover_the_steps_and_leave_the_step_as_it_was() -> None:
    """host_phases (issue 52 item 2): every part's host milliseconds per step, the rest what
    they leave of the total; the step's callables are its own again afterwards, and the
    steps timed are training steps like any other (the same weights as untimed steps)."""
    proto, augment, device, images, labels = _tiny_step_setting()
    idx = torch.arange(8)
    states = []
    for timed in (False, True):
        step = gpu.make_step("resnet18", proto, augment, images, labels, device, "fp32", False, None)
        assemble, forward = step.assemble, step._forward_loss
        gen = torch.Generator().manual_seed(3)
        if timed:
            phases = gpu.host_phases(step, idx, gen, device, steps=3)
        else:
            for _ in range(3):
                step(idx, gen)
        states.append({k: v.clone() for k, v in step.model.state_dict().items()})
        assert step.assemble is assemble and step._forward_loss is forward
        assert "step" not in vars(step.optimizer) and "zero_grad" not in vars(step.optimizer)
    assert set(phases) == {"assembly", "forward", "optimizer", "zero_grad", "rest", "total"}
    assert all(phases[part] > 0 for part in ("assembly", "forward", "optimizer", "total"))
    parts = sum(phases[part] for part in ("assembly", "forward", "optimizer", "zero_grad", "rest"))
    assert parts == pytest.approx(phases["total"])
    for name, value in states[1].items():
        assert torch.equal(value, states[0][name]), name


def test_the_optimizer_in_graph_variant_compiles_the_update_with_a_device_learning_rate(monkeypatch) -> None:
    """graphs_opt (issue 52 item 2's experiment): the optimiser step goes through
    torch.compile in the step's own mode (graphs replay only on a GPU; none here), the
    learning rate is a device tensor, and the curve is eager's: torch.compile is replaced by
    an exact stand-in, so what is checked is the variant's wiring, not inductor."""
    calls, runs = [], {}

    def exact_compile(fn, **kwargs):
        name = getattr(fn, "__name__", None)
        calls.append((name, kwargs.get("mode")))

        def compiled(*args, **kw):
            runs[name] = runs.get(name, 0) + 1
            return fn(*args, **kw)
        return compiled

    monkeypatch.setattr(torch, "compile", exact_compile)
    proto, augment, device, images, labels = _tiny_step_setting()
    compile, _ = gpu.VARIANTS["graphs_opt"]
    step = gpu.make_step("resnet18", proto, augment, images, labels, device, "fp32", compile, None,
                         optimizer_in_graph="graphs_opt" in gpu.OPTIMIZER_IN_GRAPH)
    assert ("step", None) in calls  # the optimiser's step, in the mode of a step without graphs
    lr = step.optimizer.param_groups[0]["lr"]
    assert isinstance(lr, torch.Tensor) and lr.device == device and lr.item() == pytest.approx(0.1)
    eager = gpu.make_step("resnet18", proto, augment, images, labels, device, "fp32", False, None)
    runs.clear()
    curves = [gpu.loss_curve(s, images, 4, 8, device) for s in (step, eager)]
    assert curves[0] == pytest.approx(curves[1], rel=1e-6) and len(set(curves[0])) == 4
    assert runs.get("step") == 4  # the training's updates went through the compiled one, once a step


def test_the_augmentation_in_graph_variant_assembles_inside_the_compiled_forward(monkeypatch) -> None:
    """graphs_full (issue 52 item 2's second move): the step's assembly only draws the
    augmentation's random numbers, the gather and augmentation run inside the compiled
    forward, the data set's tensors are marked static (a CUDA graph reads them in place),
    and the curve is eager's bit for bit (an exact stand-in for torch.compile: the wiring,
    not inductor, is checked; the optimiser apart, the variant runs eager's operations)."""
    forwarded = []

    def exact_compile(fn, **kwargs):
        def compiled(*args, **kw):
            if getattr(fn, "__name__", None) == "_forward":
                forwarded.append(args[0])
            return fn(*args, **kw)
        return compiled

    monkeypatch.setattr(torch, "compile", exact_compile)
    proto, augment, device, images, labels = _tiny_step_setting()
    assert "graphs_full" in gpu.AUGMENT_IN_GRAPH and "graphs_full" in gpu.OPTIMIZER_IN_GRAPH
    assert gpu.parse_args(["--device", "cuda"]).variants == list(gpu.DEFAULT_GPU_VARIANTS)
    assert "graphs_full" in gpu.DEFAULT_GPU_VARIANTS
    compile, _ = gpu.VARIANTS["graphs_full"]
    in_graph = gpu.make_step("resnet18", proto, augment, images, labels, device, "fp32", compile, None,
                             augment_in_graph=True)
    assert images._dynamo_static_input_type == labels._dynamo_static_input_type == "unguarded"
    eager = gpu.make_step("resnet18", proto, augment, images, labels, device, "fp32", False, None)
    curves = [gpu.loss_curve(s, images, 4, 8, device) for s in (in_graph, eager)]
    assert curves[0] == curves[1] and len(set(curves[0])) == 4
    draws, idx = forwarded[-1]  # what the compiled forward was given: the draws and the rows, no images
    assert sorted(draws) == ["flip", "rotation", "shift"] and idx.dtype == torch.int64 and idx.shape == (8,)
    for a, b in zip(in_graph.model.parameters(), eager.model.parameters()):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="resized"):  # ResNet18-HC's input is resized after the augmentation
        gpu.make_step("resnet18", proto, augment, images, labels, device, "fp32", compile, 24, augment_in_graph=True)


def test_the_augmentation_in_graph_forward_is_one_graph_reading_the_data_in_place() -> None:
    """graphs_full through torch's compiler front end (dynamo, then aot_eager: no inductor,
    seconds on a CPU): the forward, batch assembly included, is one graph with no break,
    under bf16 autocast too (the augmentation's region turns it off inside the graph); the
    data set's images and labels are inputs of that graph, marked as static addresses (a
    CUDA graph then reads them in place instead of copying them at each replay); and its
    loss is eager's."""
    import sys

    sys.modules.setdefault("bench_gpu", gpu)  # dynamo resolves the functions' module by name
    _, _, device, images, labels = _tiny_step_setting()
    augment = gpu.DeviceAugment(4, True, 15.0, gpu.CIFAR100_MEAN, gpu.CIFAR100_STD)
    assemble, loss_fn = gpu.augmented_batch_step(augment, images, labels, device)
    torch.manual_seed(0)
    model = gpu.build_model("resnet18", num_classes=gpu.CLASSES, in_channels=3, width=4)
    gen = torch.Generator().manual_seed(1)
    inputs = assemble(torch.randint(0, 64, (8,), generator=gen), gen)
    seen: list[torch.Tensor] = []

    def backend(graph, example_inputs):
        seen.extend(t for t in example_inputs if isinstance(t, torch.Tensor))
        from torch._dynamo.backends.common import aot_autograd
        return aot_autograd(fw_compiler=lambda g, _: g, bw_compiler=lambda g, _: g)(graph, example_inputs)

    def under_bf16(batch):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return loss_fn(model, batch)

    try:
        for forward in (lambda batch: loss_fn(model, batch), under_bf16):
            explained = torch._dynamo.explain(forward)(inputs)
            assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
            torch._dynamo.reset()
        eager_loss, _ = loss_fn(model, inputs)
        compiled_loss, _ = torch.compile(lambda batch: loss_fn(model, batch), backend=backend, dynamic=False)(inputs)
    finally:
        torch._dynamo.reset()
    pointers = {t.data_ptr() for t in seen}
    assert images.data_ptr() in pointers and labels.data_ptr() in pointers
    assert images._dynamo_static_input_type == labels._dynamo_static_input_type == "unguarded"
    torch.testing.assert_close(compiled_loss, eager_loss, rtol=1e-5, atol=0)
