"""Cost of the hypercomplex ResNet18 (ResNet18-HC) against the real ResNet18, one run.

1. Models: parameters, MACs per image ("FLOPs" in the ResNet convention) and the
   training step time (forward + backward + SGD step) of ResNet18 and of ResNet18-HC in
   each algebra, same width, input size and batch; dual and double once per product
   path (split: fewest products; block: one convolution, no activation copies).
2. One representative layer (default 64 -> 64 real channels, 3x3, 32x32, batch 64):
   time of HyperConv2d's split and block paths against the literal four-convolution
   definition (and, for the complex algebra, Gauss's three-convolution variant),
   forward alone and forward + backward. ``path=auto`` picks block on CUDA, split
   elsewhere; the table marks the pick.

Timings are medians over rounds that visit the candidates in turn, so slow drifts of a
shared machine hit all of them alike. Synthetic data; nothing is downloaded.
Usage: python bench/hypercomplex.py [--width 16] [--size 32] [--batch 32] [--device auto]
       [--layer-channels 64 --layer-size 56 --layer-batch 8]   (a 224-px stage-1 layer)
       [--memory-format channels_last]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import torch
import torch.nn.functional as F

from darel.models import count_parameters, resnet18
from darel.models.hypercomplex import (
    ALGEBRAS,
    HyperConv2d,
    count_macs_per_image,
    resnet18_hc,
    set_product_path,
)

# Product paths worth timing per algebra (complex has a single one-convolution path).
PATHS = {"complex": ("block",), "dual": ("split", "block"), "double": ("split", "block")}
QUARTERS_SPLIT = {"dual": 3, "double": 2}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def interleaved_medians(candidates: dict[str, Callable[[], object]], device: torch.device, rounds: int,
                        warmup: int = 2) -> dict[str, float]:
    """Median seconds per call of each candidate, measured round-robin."""
    for fn in candidates.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(rounds):
        for name, fn in candidates.items():
            _sync(device)
            start = time.perf_counter()
            fn()
            _sync(device)
            samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(times) for name, times in samples.items()}


def training_step(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor) -> Callable[[], None]:
    optimiser = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)

    def step() -> None:
        loss = F.cross_entropy(model(images), labels)
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()

    return step


def bench_models(args: argparse.Namespace, device: torch.device) -> None:
    torch.manual_seed(0)
    images = torch.randn(args.batch, 3, args.size, args.size, device=device).contiguous(memory_format=args.format)
    labels = torch.randint(0, args.classes, (args.batch,), device=device)
    models = {"resnet18": resnet18(args.classes, 3, args.width, args.stem)}
    for algebra in ALGEBRAS:
        for path in PATHS[algebra]:
            label = f"resnet18_hc[{algebra}]" if len(PATHS[algebra]) == 1 else f"resnet18_hc[{algebra}/{path}]"
            models[label] = set_product_path(resnet18_hc(args.classes, 3, args.width, args.stem, algebra), path)
    for model in models.values():
        model.to(device).train().to(memory_format=args.format)

    steps = {name: training_step(model, images, labels) for name, model in models.items()}
    with torch.no_grad():
        forwards = {name: (lambda m=model: m(images)) for name, model in models.items()}
        forward_times = interleaved_medians(forwards, device, args.rounds)
    step_times = interleaved_medians(steps, device, args.rounds)

    base = models["resnet18"]
    base_macs = count_macs_per_image(base, (3, args.size, args.size))
    base_params = count_parameters(base)
    print(f"\n== models: width {args.width}, input {args.size}x{args.size}, batch {args.batch}, "
          f"stem {args.stem}, {args.classes} classes ==")
    print(f"{'model':<28}{'params':>12}{'x':>7}{'MMAC/img':>11}{'x':>7}{'naive MMAC':>12}"
          f"{'fwd ms':>9}{'step ms':>9}{'x':>7}")
    for name, model in models.items():
        params = count_parameters(model)
        macs = count_macs_per_image(model, (3, args.size, args.size))
        naive = count_macs_per_image(model, (3, args.size, args.size), naive=True)
        print(f"{name:<28}{params:>12,}{params / base_params:>7.3f}{macs / 1e6:>11.2f}{macs / base_macs:>7.3f}"
              f"{naive / 1e6:>12.2f}{forward_times[name] * 1e3:>9.1f}{step_times[name] * 1e3:>9.1f}"
              f"{step_times[name] / step_times['resnet18']:>7.2f}")


def bench_layer(args: argparse.Namespace, device: torch.device) -> None:
    torch.manual_seed(0)
    c, n, s = args.layer_channels, args.layer_batch, args.layer_size
    x = torch.randn(n, c, s, s, device=device).contiguous(memory_format=args.format)
    real = torch.nn.Conv2d(c, c, 3, padding=1, bias=False).to(device).to(memory_format=args.format)
    layers = {(algebra, path): HyperConv2d(c, c, 3, 1, 1, algebra, path).to(device)
              for algebra in ALGEBRAS for path in PATHS[algebra]}
    auto = {algebra: HyperConv2d(c, c, 3, 1, 1, algebra).uses_block(x) for algebra in ALGEBRAS}

    # Each path maps an input to the layer output; the backward timing gives the input
    # a gradient too, as for every layer but the stem in a real network.
    paths: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"real Conv2d": real}
    for (algebra, path), layer in layers.items():
        paths[f"{algebra} {path}"] = layer
        if path == PATHS[algebra][-1]:
            paths[f"{algebra} naive"] = layer.naive_forward
        if algebra == "complex":
            paths["complex gauss"] = layer.gauss_forward
    x_with_grad = x.detach().clone().requires_grad_(True)

    def forward_only(path: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[], object]:
        return lambda: path(x)

    def forward_backward(path: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[], None]:
        def run() -> None:
            x_with_grad.grad = None
            path(x_with_grad).sum().backward()
        return run

    with torch.no_grad():
        forward_times = interleaved_medians({k: forward_only(v) for k, v in paths.items()}, device, args.rounds)
    backward_times = interleaved_medians({k: forward_backward(v) for k, v in paths.items()}, device, args.rounds)

    print(f"\n== one layer: {c} -> {c} real channels, 3x3, {s}x{s}, batch {n}, {args.memory_format} ==")
    print("MMAC/img: multiplications run (the block path counts its zero quarter); * = what path=auto picks here")
    print(f"{'path':<20}{'MMAC/img':>10}{'fwd ms':>9}{'x naive':>9}{'fwd+bwd ms':>12}{'x naive':>9}")
    quarter = (c // 2) ** 2 * 9 * s * s
    for name in paths:
        algebra, _, path = name.partition(" ")
        if name == "real Conv2d":
            macs, ref, mark = c * c * 9 * s * s, None, ""
        else:
            quarters = {"split": QUARTERS_SPLIT.get(algebra), "block": 4, "naive": 4, "gauss": 3}[path]
            macs, ref = quarter * quarters, f"{algebra} naive"
            mark = "*" if path in ("split", "block") and (path == "block") == auto[algebra] else ""
        fwd_ratio = f"{forward_times[name] / forward_times[ref]:>9.2f}" if ref else f"{'':>9}"
        bwd_ratio = f"{backward_times[name] / backward_times[ref]:>9.2f}" if ref else f"{'':>9}"
        print(f"{name + mark:<20}{macs / 1e6:>10.1f}{forward_times[name] * 1e3:>9.2f}{fwd_ratio}"
              f"{backward_times[name] * 1e3:>12.2f}{bwd_ratio}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--width", type=int, default=16, help="real channels of stage 1 (even)")
    ap.add_argument("--size", type=int, default=32, help="input side in pixels")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--classes", type=int, default=100)
    ap.add_argument("--stem", default="cifar", choices=["cifar", "imagenet"])
    ap.add_argument("--layer-channels", type=int, default=64)
    ap.add_argument("--layer-size", type=int, default=32)
    ap.add_argument("--layer-batch", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds per candidate (median)")
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--memory-format", default="contiguous", choices=["contiguous", "channels_last"],
                    help="layout of inputs and models (the training engine uses channels_last on CUDA)")
    ap.add_argument("--skip-models", action="store_true", help="time the single layer only")
    args = ap.parse_args()
    args.format = torch.channels_last if args.memory_format == "channels_last" else torch.contiguous_format

    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu, {torch.get_num_threads()} threads"
    print(f"torch {torch.__version__} on {name}")
    if not args.skip_models:
        bench_models(args, device)
    bench_layer(args, device)


if __name__ == "__main__":
    main()
