"""A stage's command line: arguments, its log file, the errors it reports in one line, and
its MLflow arguments."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from darel import preemption
from darel.stagekit.errors import fail
from darel.stagekit.watchdog import claim_folder, stop_with_parent


def _process_age_s() -> float:
    import time

    import psutil

    return time.time() - psutil.Process().create_time()


def parser(description: str, *required: str) -> argparse.ArgumentParser:
    """A stage's argument parser: ``--params``, ``--log``, ``--no-progress``, and each option
    named in ``required`` (e.g. ``"--data"``) as a required one."""
    preemption.watch()  # a stage's first call, before torch or MLflow: no notice is lost while it starts
    ap = argparse.ArgumentParser(description=description)
    for option in required:
        ap.add_argument(option, required=True)
    ap.add_argument("--params", default="{}", help="JSON object: this stage's slice of params.yaml")
    # --log-file: the same option under a name torchrun's own parser does not take for its --log-dir.
    ap.add_argument("--log", "--log-file", dest="log",
                    help="log file (overwritten); stderr then only gets warnings and errors")
    ap.add_argument("--no-progress", action="store_true", help="hide progress bars")
    return ap


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
        from darel.io import OutputError

        try:  # created afresh (a link in its place is never written through); a requeued run's names its attempt
            handlers.append(logging.StreamHandler(preemption.attempt_log(args.log)))
        except OutputError as err:
            raise SystemExit(f"{name}: {err}") from None
    from darel.tracking import ScrubbingFormatter

    formatter = ScrubbingFormatter("%(asctime)s %(name)s %(levelname)s %(message)s")  # no password in any line
    for handler in handlers:
        handler.setFormatter(formatter)
    logging.basicConfig(level=logging.INFO, handlers=handlers, force=True)
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
    logger.info("%s: %.2f s since the process started (the interpreter and the stage's imports)", name,
                _process_age_s())
    stop_with_parent(logger)
    try:
        preemption.check_requeue_cap()
    except SystemExit as limit:
        logger.error("%s stopped: %s", name, limit)  # the one line, in the log file and on stderr
        raise SystemExit(preemption.CAPPED_EXIT_CODE) from None
    if writes is not None:
        claim_folder(writes, name, logger)
    return params, logger


def _user_errors() -> tuple[type[BaseException], ...]:
    """Errors whose message says everything (file, cause, remedy): no traceback."""
    from darel import data, io, provenance, sealkey
    from darel.checkpoint import CheckpointError

    return (provenance.ArtifactError, data.IntegrityError, data.DataUnavailable, io.OutputError, CheckpointError,
            sealkey.SealKeyError, io.InputRefused)


def add_tracking_args(ap: argparse.ArgumentParser) -> None:
    """Where a training stage's live MLflow run goes (all three, or none: no live run)."""
    ap.add_argument("--tracking-uri", help="MLflow tracking URI (e.g. sqlite:///mlflow.db)")
    ap.add_argument("--experiment", help="MLflow experiment of the cell (e.g. table1)")
    ap.add_argument("--cell-key", help="the cell's key in its experiment (profile/model/s<seed>/<cell>[/<method>])")
    ap.add_argument("--no-live-run", action="store_true",
                    help="no live run (the profile's live_tracking: false): the cell's tracking job writes it")


def table_parser(description: str, *required: str) -> argparse.ArgumentParser:
    """A table stage's parser (table1, nlg_table): ``parser``'s options with ``required``,
    the cell records it gathers (``--cells``), its headline figures for `dvc metrics show`
    (``--metrics``) and the MLflow store that follows the table with the profile whose runs
    it holds (``--tracking-uri``, ``--profile``). The stage adds its own outputs."""
    ap = parser(description, *required)
    ap.add_argument("--cells", nargs="+", required=True, help="the table's cell JSON files, baselines included")
    ap.add_argument("--metrics", help="JSON of the table's headline figures, for `dvc metrics show`")
    ap.add_argument("--tracking-uri", help="MLflow store to keep in step with the table")
    ap.add_argument("--profile", help="the profile whose runs the table holds")
    return ap


def image_training_parser(description: str) -> argparse.ArgumentParser:
    """An image training stage's parser (pretrain, train_online, train_control): ``parser``'s
    options, the data folder and the run folder it writes (``--data``, ``--out-dir``), the
    live run's options (``add_tracking_args``) and where it writes its model's evaluation
    (``--eval-out``, the evaluation stage's eval.json). The stage adds its own inputs."""
    ap = parser(description, "--data", "--out-dir")
    add_tracking_args(ap)
    ap.add_argument("--eval-out", help="eval.json to write once trained: top-1 on the whole test split, from the "
                                       "model in memory (what stages/evaluate.py writes from model.pt)")
    return ap


def tracking_target(args: argparse.Namespace) -> dict | None:
    """The live run's store (its password from the environment: darel.tracking.job_uri)."""
    from darel.tracking import TrackingError, job_uri

    given = [args.tracking_uri, args.experiment, args.cell_key]
    if not any(given) or args.no_live_run:
        return None
    if not all(given):
        raise SystemExit("--tracking-uri, --experiment and --cell-key go together")
    try:
        uri = job_uri(args.tracking_uri)
    except TrackingError as err:
        raise SystemExit(f"MLflow: {err}") from None
    return {"uri": uri, "experiment": args.experiment, "cell_key": args.cell_key}


def follow_table(args: argparse.Namespace, logger: logging.Logger, derived: dict, artifacts: list,
                 run_ids: dict[str, str] | None = None) -> None:
    """MLflow follows a table (``--tracking-uri``, ``--experiment``, ``--profile``): every
    row's derived figures into its run, the runs of this profile's cells no longer in the
    table deleted (and restored when they come back), the table's files in a run of their
    own. ``run_ids`` (cell key -> the run its mlflow.json sealed, sealed_run_ids): no other
    run is adopted."""
    from darel.tracking import TrackingError, job_uri
    from darel.tracking import follow_table as follow

    try:
        counts = follow(job_uri(args.tracking_uri), args.experiment, args.profile, derived,
                        table_key=f"{args.profile}/{args.experiment}", artifacts=artifacts, run_ids=run_ids)
    except TrackingError as err:
        fail(logger, f"MLflow: {err}")
    logger.info("MLflow %s: %d runs updated, %d runs of cells no longer in the table deleted, %d runs of cells back "
                "in it restored", args.experiment, counts["updated"], counts["deleted"], counts["restored"])
    if counts["foreign"]:
        logger.warning("MLflow %s: %d run(s) under a cell's key but not the run its tracking job sealed in mlflow.json "
                       "were deleted (written into the store by someone else?)", args.experiment, counts["foreign"])


def sealed_run_ids(cell_records: list[str]) -> dict[str, str]:
    """Cell key -> the MLflow run its tracking job sealed in mlflow.json, for each cell
    record (its marker beside the cell's run: darel.layout.marker_of), the marker checked
    against its place and against the cell record it was written for."""
    from darel import provenance
    from darel.layout import marker_of

    found, where = {}, {}
    for path in cell_records:
        marker = provenance.read_record(marker_of(path), inputs={"cell": path})
        key = marker["cell_key"]
        if key in found:
            raise provenance.damaged(marker_of(path), f"names cell {key}, as {where[key]} does (copied?)")
        found[key], where[key] = marker["run_id"], marker_of(path)
    return found


def read_cells(paths: list[str]) -> list[dict]:
    """The cell records of a table, each checked against the records it summarises: every
    source it names (train.json, eval.json, the baseline, the calibration, carbon.json)
    must lie in the project, still have the sha256 the cell recorded, carry a valid seal,
    and hold the figures the cell copied from it (darel.records.figure_disagreements);
    ArtifactError naming the cell record otherwise."""
    from darel import io, provenance, records

    cells = []
    for path in paths:
        cell = provenance.read_record(path)
        places, hashes = cell.get("sources"), cell.get("sources_sha256")
        if not isinstance(places, dict) or not places or not isinstance(hashes, dict):
            raise provenance.damaged(path, "names no sources (written by an older version)")
        read = {}
        for name, place in sorted(places.items()):
            if not isinstance(place, str) or Path(place).is_absolute() or ".." in Path(place).parts:
                raise provenance.damaged(path, f"names its {name} at {str(place)[:80]!r}, outside the project")
            read[name] = provenance.read_record(place)
            if io.file_sha256(place) != hashes.get(name):
                raise provenance.damaged(path, f"was made from another {name} than {place} (rebuilt or replaced "
                                               "since)")
        disagreements = records.figure_disagreements(cell, read)
        if disagreements:
            raise provenance.damaged(path, f"does not hold the figures of the records it was made from "
                                           f"({'; '.join(disagreements[:3])})")
        cells.append(cell)
    return cells
