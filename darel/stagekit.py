"""Plumbing shared by the stage CLIs in ``stages/``: arguments, logging, loading the
on-disk dataset onto the device, and saving/loading trained models."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from darel.data import DeviceAugment, read_dataset, to_tensors
from darel.io import torch_save
from darel.models import build_model


def parser(description: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--params", default="{}", help="JSON object: this stage's slice of params.yaml")
    # --log-file: the same option under a name torchrun's own parser does not take for its --log-dir.
    ap.add_argument("--log", "--log-file", dest="log",
                    help="log file (overwritten); stderr then only gets warnings and errors")
    ap.add_argument("--no-progress", action="store_true", help="hide progress bars")
    return ap


_HELD_LOCKS: list = []  # open lock files, held until the process ends


def claim_folder(folder: str | Path, name: str, logger: logging.Logger) -> None:
    """One writer per output: take ``<folder>/.<name>.lock`` (holding this PID) for the
    rest of the process, or stop with a message naming the process that holds it. Then
    remove the temporary files a killed earlier run of the stage left in the folder."""
    import fcntl

    from darel.io import remove_stale_temps

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    lock = folder / f".{name}.lock"
    handle = open(lock, "a+", encoding="utf-8")
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "unknown"
        handle.close()
        fail(logger, f"{name}: {folder} is being written by another {name} process (PID {holder}); wait for it to "
                     f"finish, or stop it (kill {holder}) and run again")
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    _HELD_LOCKS.append(handle)
    removed = remove_stale_temps(folder)
    if removed:
        logger.info("removed %d temporary file(s) a killed run left in %s: %s", len(removed), folder,
                    ", ".join(p.name for p in removed))


def _workflow_ancestor() -> int | None:
    """PID of the nearest ancestor process that is Snakemake (None when run by hand)."""
    pid = os.getppid()
    for _ in range(8):
        if pid <= 1:
            return None
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return None
        # "snakemake ..." (an entry-point script run by its interpreter) or "python -m snakemake ..."
        if any(Path(os.fsdecode(part)).name == "snakemake" for part in cmdline[:3]):
            return pid
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return None


def _process_alive(pid: int) -> bool:
    """True while ``pid`` runs (an exited process that nobody reaped yet counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stop_now(logger: logging.Logger, why: str) -> None:
    """Log ``why``, flush the logs, end the process at once (like the default SIGTERM)."""
    import signal

    logger.error("%s; stopping (an interrupted training resumes from its last checkpoint)", why)
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    os._exit(128 + signal.SIGTERM)


def stop_with_parent(logger: logging.Logger, interval_s: float = 2.0) -> None:
    """A stage whose parent (or the Snakemake that started it) has died stops itself
    instead of running on as an orphan: the kernel sends SIGTERM when the parent exits
    (PR_SET_PDEATHSIG; Snakemake's shell may exec the stage, so the parent is often
    Snakemake itself), and a watchdog thread checks every ``interval_s`` that the parent
    and the nearest Snakemake ancestor are still alive. Either way the log says why the
    stage stopped. Call from the main thread."""
    import signal
    import threading

    parent = os.getppid()
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1
    watched = _workflow_ancestor()
    with contextlib.suppress(ValueError):  # not the main thread: keep the default action
        signal.signal(signal.SIGTERM, lambda signum, frame: _stop_now(
            logger, f"received SIGTERM (parent {parent} {'gone' if os.getppid() != parent else 'alive'})"))

    def watch() -> None:
        while True:
            time.sleep(interval_s)
            if os.getppid() != parent or (watched is not None and not _process_alive(watched)):
                _stop_now(logger, f"the workflow that started this stage has ended (parent {parent}, Snakemake "
                                  f"{watched})")

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


def start(args: argparse.Namespace, name: str, writes: str | Path | None = None) -> tuple[dict, logging.Logger]:
    try:
        params = json.loads(args.params)
    except json.JSONDecodeError as err:
        raise SystemExit(f"{name}: --params is not valid JSON: {err}") from None
    if args.log and int(os.environ.get("WORLD_SIZE", "1")) > 1 and int(os.environ.get("RANK", "0")) > 0:
        args.log = f"{args.log}.rank{os.environ['RANK']}"  # under torchrun: the job's log is process 0's
    console = logging.StreamHandler(sys.stderr)
    # With a log file (Snakemake jobs) the console only gets warnings, so parallel jobs
    # do not interleave their progress lines; the file has everything.
    console.setLevel(logging.WARNING if args.log else logging.INFO)
    handlers: list[logging.Handler] = [console]
    if args.log:
        Path(args.log).parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(args.log, mode="w", encoding="utf-8"))
    logging.basicConfig(level=logging.INFO, handlers=handlers, force=True,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("codecarbon").setLevel(logging.ERROR)
    logger = logging.getLogger(f"darel.stage.{name}")

    def log_uncaught(exc_type, exc, tb):
        # Snakemake shows the log file of a failed job: the traceback must be in it, except
        # for an error that names the file and what to do (a damaged input): that one line.
        if issubclass(exc_type, _user_errors()):
            logger.error("%s stopped: %s", name, exc)
            return
        logger.error("%s failed", name, exc_info=(exc_type, exc, tb))

    sys.excepthook = log_uncaught
    logger.info("%s: params %s", name, json.dumps(params, sort_keys=True))
    stop_with_parent(logger)
    if writes is not None:
        claim_folder(writes, name, logger)
    return params, logger


def _user_errors() -> tuple[type[BaseException], ...]:
    """Errors whose message says everything (file, cause, remedy): no traceback."""
    from darel import data, io, provenance
    from darel.checkpoint import CheckpointError

    return (provenance.ArtifactError, data.IntegrityError, data.DataUnavailable, io.OutputError, CheckpointError)


def add_tracking_args(ap: argparse.ArgumentParser) -> None:
    """Where a training stage's live MLflow run goes (all three, or none: no live run)."""
    ap.add_argument("--tracking-uri", help="MLflow tracking URI (e.g. sqlite:///mlflow.db)")
    ap.add_argument("--experiment", help="MLflow experiment of the cell (e.g. table1)")
    ap.add_argument("--cell-key", help="the cell's key in its experiment (profile/model/s<seed>/<cell>[/<method>])")


def tracking_target(args: argparse.Namespace) -> dict | None:
    given = [args.tracking_uri, args.experiment, args.cell_key]
    if not any(given):
        return None
    if not all(given):
        raise SystemExit("--tracking-uri, --experiment and --cell-key go together")
    return {"uri": args.tracking_uri, "experiment": args.experiment, "cell_key": args.cell_key}


def follow_table(args: argparse.Namespace, logger: logging.Logger, derived: dict, artifacts: list) -> None:
    """MLflow follows a table (``--tracking-uri``, ``--experiment``, ``--profile``): every
    row's derived figures into its run, the runs of this profile's cells no longer in the
    table deleted (and restored when they come back), the table's files in a run of their own."""
    from darel.tracking import TrackingError
    from darel.tracking import follow_table as follow

    try:
        counts = follow(args.tracking_uri, args.experiment, args.profile, derived,
                        table_key=f"{args.profile}/{args.experiment}", artifacts=artifacts)
    except TrackingError as err:
        fail(logger, f"MLflow: {err}")
    logger.info("MLflow %s: %d runs updated, %d runs of cells no longer in the table deleted, %d runs of cells back "
                "in it restored", args.experiment, counts["updated"], counts["deleted"], counts["restored"])


def fail(logger: logging.Logger, message: str) -> None:
    """Stop a stage with a message meant for the user: logged, printed, no traceback."""
    logger.error(message)
    raise SystemExit(message)


def device_and_split(params: dict, data_dir: str | Path) -> tuple[torch.device, dict[str, Any]]:
    """The stage's device (threads configured) and the data set loaded onto it."""
    from darel.engine import configure_runtime, resolve_device

    device = resolve_device(params["device"])
    configure_runtime(device, params["threads"])
    return device, load_split(data_dir, device)


def load_split(folder: str | Path, device: torch.device) -> dict[str, Any]:
    train, test, meta = read_dataset(folder)
    train_x, train_y = to_tensors(train, device)
    test_x, test_y = to_tensors(test, device)
    return {"train_x": train_x, "train_y": train_y, "test_x": test_x, "test_y": test_y, "meta": meta}


def transforms(meta: dict, augment: dict, input_size: int | None = None) -> tuple[Any, Any]:
    """(augment, normalise) callables on uint8 NCHW batches; with `input_size` their float
    output is resized (bilinear) to that side, e.g. 32 -> 224 for the ResNet18-HC protocol.
    Augmenting at the stored size and resizing after is the same crop/flip/rotation at
    a finer grid, and keeps the data on the device small."""
    aug = DeviceAugment(pad=augment["pad"], hflip=augment["hflip"], max_rotation_deg=augment["rotation_deg"],
                        mean=meta["mean"], std=meta["std"])
    if not input_size or input_size == meta["image_size"]:
        return aug, aug.normalise

    def resize(x: torch.Tensor) -> torch.Tensor:
        return F.interpolate(x, size=(input_size, input_size), mode="bilinear", align_corners=False)

    return (lambda images, gen: resize(aug(images, gen))), (lambda images: resize(aug.normalise(images)))


def model_spec(model_name: str, meta: dict, protocol: dict) -> dict:
    spec = {"name": model_name, "num_classes": meta["num_classes"], "in_channels": meta["channels"],
            "width": protocol["width"]}
    for optional in ("algebra", "stem"):
        if optional in protocol:
            spec[optional] = protocol[optional]
    return spec


def new_model(spec: dict, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    extra = {key: spec[key] for key in ("algebra", "stem") if key in spec}
    return build_model(spec["name"], num_classes=spec["num_classes"], in_channels=spec["in_channels"],
                       width=spec["width"], **extra)


def save_model(path: str | Path, model: torch.nn.Module, spec: dict) -> None:
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    torch_save(path, {"spec": spec, "state_dict": state})


def load_model(path: str | Path, device: torch.device) -> tuple[torch.nn.Module, dict]:
    """A trained model.pt, after its sha256 is checked against the sealed train.json its
    training wrote beside it; tensors and plain values only (``weights_only``)."""
    from darel import provenance

    path = Path(path)
    record = path.with_name("train.json")
    provenance.check_file(path, provenance.read_record(record).get("model_sha256"), record)
    saved = torch.load(path, map_location="cpu", weights_only=True)
    spec = saved["spec"]
    model = new_model(spec, seed=0)
    model.load_state_dict(saved["state_dict"])
    return model.to(device), spec
