"""The device and threads a job runs with (image training, LoRA fine-tuning, scoring),
and the seeding of torch's default generators for the draws that cannot take one."""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

import torch

from darel import devicelock
from darel.layout import COMPILE_CACHE


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("the profile asks for device 'cuda' but torch sees no CUDA device; "
                           "use the quick profile or set the profile's device to cpu/auto")
    return torch.device(name)


def use_project_compile_cache(root: str | os.PathLike = ".") -> str:
    """Point torch.compile's on-disk cache (inductor's kernels, its FX and AOT-autograd
    graphs, Triton's kernels beneath) at the project's folder (darel.layout.COMPILE_CACHE)
    unless the user exported TORCHINDUCTOR_CACHE_DIR: a compiled profile then compiles each
    graph once per machine, or once per GPU kind on a cluster sharing the project, not once
    per job where each job gets a private /tmp (torch's default). Returns the folder in use
    (torch creates it on its first compilation, not here)."""
    return os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.abspath(os.path.join(root, COMPILE_CACHE)))


def configure_runtime(device: torch.device, threads: int, deterministic: bool = False,
                      take_turn: bool = True, algorithm_search: bool = True) -> float | None:
    """Torch's thread count (the profile's ``threads``, never the host's or Snakemake's
    cores: a CPU reduction splits its work by thread, so its rounding follows the
    count) and, with ``deterministic``, torch's deterministic algorithms: a job then
    gives the same bits on every run on the same hardware and software (Tables 2/3,
    which have no time budget). On a CPU an operation without a deterministic version
    stops the job; on a GPU it is warned about in the job's log (the GPU paths are not
    run in CI). cuDNN's benchmark mode picks its algorithms by timing them, so it is off
    then. ``algorithm_search`` (a profile's ``cudnn_benchmark``) turns it off otherwise:
    the search costs every process seconds on each new shape (about 11 s for ResNet18's
    two training batch shapes on an H200, bench/gpu_warmup.py), which a short run and
    the calibration's probes, one process each, pay again and again.

    With ``take_turn`` a job of a profile with ``device_turns`` waits here for the GPU
    (darel.devicelock) and holds it until it exits; a stage that can do more of its start
    first passes False and takes the turn itself before it puts anything on the device.
    Returns the seconds waited, or None where no turn applies. torch.compile's cache is
    the project's (``use_project_compile_cache``), set before anything compiles."""
    torch.set_num_threads(threads)
    use_project_compile_cache()
    if deterministic:
        # cuBLAS reduces in a fixed order only with a fixed workspace; it reads this when
        # its first handle is made, after this call.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=device.type == "cuda")
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = algorithm_search and not deterministic
        torch.backends.cudnn.deterministic = deterministic
    return take_device_turn(device.type) if take_turn else None


def take_device_turn(device_type: str) -> float | None:
    """devicelock.take_turn, after the host-side work a job would otherwise do holding the
    GPU: torch imports its compiler (torch._dynamo) the first time an optimizer is built,
    which takes seconds and would otherwise fall inside every training's and calibration's
    turn (measured in bench/results/gpu_2026-11-28/README.md). With turns on it is
    imported here, beside the previous job's work. Returns the seconds waited, or None."""
    if devicelock.turns_on(device_type):
        import torch._dynamo  # noqa: F401
    return devicelock.take_turn(device_type)


@contextlib.contextmanager
def seeded(seed: int, device: torch.device | str = "cpu") -> Iterator[None]:
    """torch's default generators (the CPU's and, on a GPU, the device's) seeded with
    ``seed`` inside the block and put back after it. For the draws that take no
    generator argument (transformers' weight initialisation, peft's LoRA initialisation,
    dropout): inside the block they depend on ``seed`` alone, not on what the process
    drew before, and nothing after the block sees them."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    device = torch.device(device)
    devices = [device.index if device.index is not None else torch.cuda.current_device()] \
        if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield
