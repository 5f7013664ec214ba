"""The epoch skeleton every training of the project runs: image training (the baseline,
DAREL, IDS + ADONIS, the study's controls) and LoRA fine-tuning.

One place decides, for every loop alike:

* resumption: a checkpoint is loaded only when its fingerprint matches (darel.checkpoint),
  and every part of the state comes back (the body's, the clock's, the curves, the peaks);
* measurement: each epoch's per-batch work runs inside one ``TimedWork.interval`` (time
  and energy over the same interval); the CPU memory count of the passes handed over as
  replays runs after it, with the training state put back, so it never enters a time;
* the record: one entry per epoch in the curves, the memory peaks per kind of pass;
* checkpoints every ``checkpoint_every`` epochs and after the last (what is between
  intervals, evaluation included, is in neither time nor energy), and at the first epoch
  boundary after a preemption notice, which then ends the process (darel.preemption);
* the end: the energy record of exactly the timed intervals of the whole run.

A loop supplies only its body (``EpochBody``): the per-batch work of one epoch, what it
does after the interval (evaluation, a wall-clock budget), and its state.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ContextManager, Protocol

from tqdm import tqdm

from darel import checkpoint as checkpoints
from darel import preemption
from darel.measure import EnergyTracker, StepMemoryMeter, TimedWork


@dataclass
class EpochEnd:
    """What a body reports after an epoch: the curves' entry, and whether to stop now."""

    record: dict
    stop: bool = False


class EpochBody(Protocol):
    """The part of a training loop that differs between loops."""

    def train_epoch(self, epoch: int) -> Any:
        """The epoch's per-batch work, inside the timed interval; returns what
        ``end_epoch`` needs (device tensors may be read there, outside the clock)."""

    def end_epoch(self, epoch: int, timed: Any, seconds: float, last_planned: bool) -> EpochEnd:
        """After the interval: the epoch's figures (evaluation included) and whether to stop."""

    def preserved_state(self) -> ContextManager:
        """A context that puts the training state back after the memory count's replays."""

    def state_dict(self) -> dict:
        """Everything the body needs to resume (called on every process under torchrun)."""

    def load_state_dict(self, state: dict) -> None: ...


class World(Protocol):
    """The processes of a data-parallel run (darel.distributed.World)."""

    is_main: bool


@dataclass
class LoopResult:
    epochs_completed: int
    stopped: bool  # stopped early by the body (a budget, a step limit)
    resumed_from_epoch: int | None
    curves: dict[str, list]
    time_s: float
    wall_time_s: float
    segments: int
    peak_by_kind: dict[str, int]
    nvml_peak_bytes: int | None
    energy: dict | None = None
    fingerprint: Any = None
    cpu_beside_s: float = float("nan")  # other processes' CPU seconds during the timed intervals
    extra: dict = field(default_factory=dict)

    @property
    def peak_mem_bytes(self) -> int:
        return int(max(self.peak_by_kind.values(), default=0))


def _resumed_loop(body: EpochBody, work: TimedWork, ckpt: Path | None, fingerprint: Any, say: Callable[[str], None],
                  main: bool, gather: Callable[[Any], list] | None, map_location: Any) -> dict:
    """The loop's bookkeeping: a fresh one, or the checkpoint's when it belongs to this run
    (``body`` and ``work`` then get their saved state back)."""
    loop: dict = {"epoch": 0, "stopped": False, "curves": {}, "peak_by_kind": {}, "nvml_peak_bytes": None,
                  "resumed_from_epoch": None}
    if ckpt is None:
        return loop
    saved = checkpoints.load(ckpt, fingerprint, lambda line: say(f"checkpoint {ckpt}: {line}"),
                             map_location=map_location) if main else None
    if gather is not None:  # the others read the file process 0 verified
        chosen = gather(None if saved is None else saved["checkpoint_file"])[0]
        if saved is None and chosen is not None:
            saved = checkpoints.loads(Path(chosen).read_bytes(), map_location)
    if saved is not None:
        body.load_state_dict(saved["body"])
        work.load_state_dict(saved["work"])
        loop = saved["loop"]
        loop["resumed_from_epoch"] = loop["epoch"]
        if main:
            say(f"resumed at epoch {loop['epoch']} ({work.time_s:.1f} s already trained)")
    return loop


def run_epochs(body: EpochBody, *, epochs: int, work: TimedWork, meter: StepMemoryMeter,
               energy: EnergyTracker | None = None, checkpoint: str | Path | None = None, checkpoint_every: int = 1,
               fingerprint: Any = None, say: Callable[[str], None] = print, progress: bool = False,
               on_epoch_end: Callable[[int, dict], None] | None = None, world: World | None = None,
               gather: Callable[[Any], list] | None = None, map_location: Any = "cpu",
               describe: Callable[[int, EpochEnd, float], str] | None = None) -> LoopResult:
    """Train ``body`` for ``epochs`` epochs (fewer when it stops), resuming from
    ``checkpoint`` when that belongs to this run. Under torchrun (``world`` and
    ``gather``: an all-gather of a Python object) process 0 checks the checkpoint and the
    others read the file it chose; every process builds its state, process 0 writes it."""
    main = world is None or world.is_main
    ckpt = Path(checkpoint) if checkpoint else None
    loop = _resumed_loop(body, work, ckpt, fingerprint, say, main, gather, map_location)

    def save() -> None:
        state = body.state_dict()  # on every process: it may gather
        if main:
            checkpoints.save(ckpt, {"fingerprint": fingerprint, "body": state, "work": work.state_dict(), "loop": loop})

    curves = loop["curves"]
    if ckpt is not None:
        preemption.watch()  # stages took notices from their first line; a caller of its own from here
        if loop["epoch"] < epochs and preemption.agreed(gather):  # a notice during start-up: leave before any work
            preemption.leave(loop["epoch"], 0.0, ckpt, main=main, sync=gather, at_start=True)
    longest_s = 0.0  # an epoch with its evaluation and checkpoint: the grace a preemption notice needs
    bar = tqdm(total=epochs, initial=loop["epoch"], desc="epochs", disable=not (progress and main), mininterval=2)
    while loop["epoch"] < epochs and not loop["stopped"]:
        epoch = loop["epoch"]
        started = time.perf_counter()
        with work.interval():
            timed = body.train_epoch(epoch)
        seconds = work.last_interval_s
        # The CPU memory count of this epoch's new shapes, outside the clock, the
        # training state put back afterwards.
        meter.flush(around=body.preserved_state)
        end = body.end_epoch(epoch, timed, seconds, epoch + 1 >= epochs)
        loop["epoch"] = epoch + 1
        loop["stopped"] = bool(end.stop) and loop["epoch"] < epochs
        last = loop["epoch"] >= epochs or loop["stopped"]
        for key, value in end.record.items():
            curves.setdefault(key, []).append(value)
        for kind, peak in meter.peak_by_kind.items():
            loop["peak_by_kind"][kind] = max(loop["peak_by_kind"].get(kind, 0), peak)
        if meter.nvml_peak_bytes is not None:
            loop["nvml_peak_bytes"] = max(loop["nvml_peak_bytes"] or 0, meter.nvml_peak_bytes)
        # The last epoch is saved too: if the outputs are lost before the workflow accepts
        # them, a re-run rewrites them from it at once; the cell-record stage removes it.
        preempted = ckpt is not None and not last and preemption.agreed(gather)
        if ckpt is not None and (last or preempted or loop["epoch"] % checkpoint_every == 0):
            save()
        longest_s = max(longest_s, time.perf_counter() - started)
        if describe is not None and main:
            say(describe(epoch, end, seconds))
        bar.update(1)
        if on_epoch_end is not None:
            on_epoch_end(epoch, end.record)
        if preempted:
            bar.close()
            preemption.leave(loop["epoch"], longest_s, ckpt, main=main, sync=gather)
    bar.close()
    energy_record = work.energy_record(energy.stop(), energy.pue) if energy is not None and main else None
    return LoopResult(epochs_completed=loop["epoch"], stopped=loop["stopped"],
                      resumed_from_epoch=loop["resumed_from_epoch"], curves=curves, time_s=work.time_s,
                      wall_time_s=work.wall_time_s, cpu_beside_s=work.cpu_beside_s,
                      segments=work.segments, peak_by_kind=dict(loop["peak_by_kind"]),
                      nvml_peak_bytes=loop["nvml_peak_bytes"], energy=energy_record, fingerprint=fingerprint)


@contextlib.contextmanager
def nothing_to_restore():
    yield
