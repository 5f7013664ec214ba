"""The device and threads a job runs with (image training, LoRA fine-tuning, scoring)."""

from __future__ import annotations

import torch


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("the profile asks for device 'cuda' but torch sees no CUDA device; "
                           "use the quick profile or set the profile's device to cpu/auto")
    return torch.device(name)


def configure_runtime(device: torch.device, threads: int) -> None:
    torch.set_num_threads(threads)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
