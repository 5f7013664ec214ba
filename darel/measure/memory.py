"""Peak memory of every pass a cell runs: torch's allocator peak (and NVML) on a GPU, the
live tensors counted by a dispatch mode on a CPU."""

from __future__ import annotations

import contextlib
import logging
import resource
import sys
import weakref
from typing import Any, Callable, Iterator

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from darel.sgd import Optimizer

log = logging.getLogger(__name__)


CPU_MEMORY_SOURCE = "cpu-live-tensors (peak bytes of live tensor storages per pass, counted by a dispatch mode)"
CUDA_MEMORY_SOURCE = "torch.cuda.max_memory_allocated (peak of torch's caching allocator per step)"


def _storage_key_and_bytes(tensor: torch.Tensor) -> tuple[int, int] | None:
    """(data pointer, bytes) of the storage behind ``tensor``; None when it has none
    (sparse, meta or other exotic tensors), so such tensors are simply not counted."""
    try:
        storage = tensor.untyped_storage()
        return storage.data_ptr(), storage.nbytes()
    except (RuntimeError, NotImplementedError, TypeError):
        return None


def _tensors_in(value: Any) -> Iterator[torch.Tensor]:
    """Every tensor inside an optimizer state entry (tensors, dicts, lists, tuples)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors_in(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors_in(item)


def _process_peak_rss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports kilobytes, macOS bytes.
    return int(peak if sys.platform == "darwin" else peak * 1024)


def open_nvml(device: torch.device | str | int) -> tuple[Any | None, str]:
    """An NVML handle for a CUDA device, or (None, why not). Never raises: NVML is an
    optional second opinion on memory, and a machine without a driver is normal."""
    try:
        import pynvml
    except ImportError as err:
        return None, f"NVML not used: pynvml is not importable ({err})"
    device = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
    if device.type != "cuda":
        return None, f"NVML not used: device is {device.type}, not cuda"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        return None, f"NVML unavailable: nvmlInit failed ({type(err).__name__}: {err})"
    index = device.index if device.index is not None else torch.cuda.current_device()
    try:
        # CUDA_VISIBLE_DEVICES can renumber devices; torch knows the NVML index.
        nvml_index = torch.cuda._get_nvml_device_index(index)  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - private helper; fall back to the CUDA index
        nvml_index = index
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(nvml_index)
        name = pynvml.nvmlDeviceGetName(handle)
    except pynvml.NVMLError as err:
        return None, f"NVML unavailable: no handle for device {nvml_index} ({type(err).__name__}: {err})"
    if isinstance(name, bytes):
        name = name.decode(errors="replace")
    return handle, f"ok: NVML device {nvml_index} ({name}), used memory sampled after every batch"


def _eager_stance() -> contextlib.AbstractContextManager:
    """torch.compile's "force_eager" stance, where compiled code can exist: only after its
    compiler (torch._dynamo) was imported, which building a compiled function or a
    torch.optim optimizer does. An eager process never imports it for this (about 1 s of
    CPU in every job, darel/sgd.py). Decided per counted pass: a function first compiled
    inside a counted pass (no warm-up call before it) would be counted as torch traces it."""
    if "torch._dynamo" not in sys.modules:
        return contextlib.nullcontext()
    return torch.compiler.set_stance("force_eager")


class _LiveTensorCounter(TorchDispatchMode):
    """Bytes of live tensor storages while a pass runs on the CPU.

    Every operator's outputs are seen here (forward, autograd's backward and the
    optimiser's kernels alike); each distinct storage is counted once, while any tensor
    that references it is alive, and released when the last one dies (weak-reference
    finalisers: torch keeps a tensor's Python object alive as long as C++ holds it, for
    example as a tensor saved for backward). Tensors alive at the start (parameters,
    gradients, optimiser state) are tracked the same way, so freeing an old gradient
    inside the pass is seen too. Allocations an operator makes internally and frees
    before returning (scratch buffers) are not visible: the figure is the peak of live
    tensor bytes, a deterministic lower bound of resident memory.
    """

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch wraps a mode's __torch_dispatch__ to keep its compiler out, which imports
        # that compiler (about 1 s) on the first counted pass of every eager job. The
        # counter runs only with compiled code forced eager (_eager_stance): nothing to keep out.
        return False

    def __init__(self) -> None:
        super().__init__()
        self._refs: dict[int, int] = {}
        self._sizes: dict[int, int] = {}
        self._finalizers: list[weakref.finalize] = []
        self.current = 0
        self.peak = 0

    def track(self, tensor: torch.Tensor) -> None:
        found = _storage_key_and_bytes(tensor)
        if found is None or found[1] == 0:
            return
        ptr, nbytes = found
        if ptr not in self._refs:
            self._refs[ptr] = 0
            self._sizes[ptr] = nbytes
            self.current += nbytes
            self.peak = max(self.peak, self.current)
        self._refs[ptr] += 1
        self._finalizers.append(weakref.finalize(tensor, self._release, ptr))

    def _release(self, ptr: int) -> None:
        left = self._refs.get(ptr)
        if left is None:
            return
        if left > 1:
            self._refs[ptr] = left - 1
            return
        del self._refs[ptr]
        self.current -= self._sizes.pop(ptr)

    def close(self) -> None:
        """Drop the finalisers left on long-lived tensors (parameters, state)."""
        for finalizer in self._finalizers:
            finalizer.detach()
        self._finalizers.clear()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for item in tree_flatten(out)[0]:
            if isinstance(item, torch.Tensor):
                self.track(item)
        return out


class StepMemoryMeter:
    """Peak memory of a run's passes: ``with meter.step(key, kind=...):`` around each
    training step, scoring batch and evaluation batch, so the cell's peak is the maximum
    over every pass it runs (``peak_bytes``; per kind in ``peak_by_kind``).

    On CUDA the figure is torch's peak allocation within each pass (the data set on the
    device included); NVML's view of the whole device's used memory (what the paper's
    pynvml reads, including the CUDA context and the allocator's cache) is kept beside it
    as ``nvml_peak_bytes``. On CPU torch keeps no allocator peak, so the meter counts
    live tensors with a dispatch mode (``_LiveTensorCounter``): parameters, gradients,
    optimiser state and everything the pass creates, at its peak. On CPU that figure
    depends only on the shapes and the operator sequence, so passes with a ``key`` (e.g.
    the batch size) are counted on their first ``cpu_samples_per_key`` occurrences only
    (the first step of a run creates the optimiser state, the second is the steady state):
    the counting costs Python work per operator. A pass inside a timed interval can hand
    over a ``replay`` callable instead of being counted in place: the meter then runs it
    under counting at ``flush()``, after the interval, so the counting's own cost never
    enters a measured time (on a CPU; on a GPU the allocator's peak costs nothing and is
    read in place). The process's peak RSS is recorded for information.
    """

    cpu_samples_per_key = 2

    def __init__(self, model: nn.Module, optimizer: Optimizer | None, device: torch.device | str) -> None:
        self.model = model
        self.optimizer = optimizer
        self.device = torch.device(device)
        self.peak_bytes = 0
        self.peak_by_kind: dict[str, int] = {}
        self.steps = 0
        self.rss_peak_bytes = _process_peak_rss_bytes()
        self.nvml_peak_bytes: int | None = None
        self._nvml_handle: Any | None = None
        self._measured_keys: dict = {}
        self._deferred: list[tuple[str, Callable[[], None]]] = []
        if self.device.type == "cuda":
            self.source = CUDA_MEMORY_SOURCE
            self._nvml_handle, self.nvml_status = open_nvml(self.device)
        else:
            self.source = CPU_MEMORY_SOURCE
            self.nvml_status = f"NVML not used: device is {self.device.type}, not cuda"

    def _record(self, kind: str, peak: int) -> None:
        self.peak_bytes = max(self.peak_bytes, peak)
        self.peak_by_kind[kind] = max(self.peak_by_kind.get(kind, 0), peak)

    @contextlib.contextmanager
    def step(self, key: Any = None, kind: str = "train", replay: Callable[[], None] | None = None) -> Iterator[None]:
        if self.device.type == "cuda":
            with self._cuda_step(kind):
                yield
        elif key is not None and self._measured_keys.get((kind, key), 0) >= self.cpu_samples_per_key:
            yield
        elif replay is not None:
            self._deferred.append((kind, replay))
            self._measured_keys[(kind, key)] = self._measured_keys.get((kind, key), 0) + 1
            yield
        else:
            with self._cpu_step(kind):
                yield
            if key is not None:
                self._measured_keys[(kind, key)] = self._measured_keys.get((kind, key), 0) + 1
        self.steps += 1
        self.rss_peak_bytes = max(self.rss_peak_bytes, _process_peak_rss_bytes())

    def wants(self, key: Any, kind: str = "train") -> bool:
        """Whether a pass of this key would be counted (on a GPU every pass is read)."""
        return self.device.type == "cuda" or self._measured_keys.get((kind, key), 0) < self.cpu_samples_per_key

    def flush(self, around: Callable[[], contextlib.AbstractContextManager] | None = None) -> None:
        """Count the passes handed over as replays (``around()`` is entered first, outside
        the counting: e.g. a context that saves and restores the training state)."""
        deferred, self._deferred = self._deferred, []
        if not deferred:
            return
        with around() if around is not None else contextlib.nullcontext():
            for kind, replay in deferred:
                with self._cpu_step(kind):
                    replay()

    @contextlib.contextmanager
    def _cuda_step(self, kind: str) -> Iterator[None]:
        torch.cuda.reset_peak_memory_stats(self.device)
        yield
        # The caching allocator records allocations when ops are issued, so no sync is needed.
        self._record(kind, int(torch.cuda.max_memory_allocated(self.device)))
        if self._nvml_handle is not None:
            import pynvml

            try:
                used = int(pynvml.nvmlDeviceGetMemoryInfo(self._nvml_handle).used)
            except pynvml.NVMLError as err:
                self._nvml_handle = None
                self.nvml_status = f"NVML stopped: nvmlDeviceGetMemoryInfo failed ({err})"
            else:
                self.nvml_peak_bytes = max(self.nvml_peak_bytes or 0, used)

    def _resident(self) -> Iterator[torch.Tensor]:
        params = list(self.model.parameters())
        yield from params
        yield from (p.grad for p in params if p.grad is not None)
        yield from self.model.buffers()
        if self.optimizer is not None:
            yield from _tensors_in(list(self.optimizer.state.values()))

    @contextlib.contextmanager
    def _cpu_step(self, kind: str) -> Iterator[None]:
        counter = _LiveTensorCounter()
        for tensor in self._resident():
            counter.track(tensor)
        try:
            # Compiled code runs eagerly while counted: under a dispatch mode torch.compile
            # would give up on the compiled frame for the rest of the process. The count is
            # therefore of the eager operators (labelled so in docs/gpu.md).
            with _eager_stance(), counter:
                yield
        finally:
            counter.close()
        self._record(kind, counter.peak)
