"""Stage "tracking": complete a cell's MLflow run once its cell JSON is final. The run its
training started (with the per-epoch metrics) gets the final figures as metrics, the
full settings as parameters, the labels as tags, and the cell's files and stage logs as
artifacts; a marker (the run id) is written for the workflow. A tracking failure stops
this job with a message naming the store, and costs no result: the cell JSON is the
output of the job before."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from darel import provenance, stagekit
from darel.io import inside_project
from darel.nlg.metrics import VARIANT_KEYS
from darel.tracking import TrackingError, job_uri, log_cell_run, redacted

# Cell JSON fields logged as final metrics (what MLflow compares); other scalars are params.
METRICS = ("top1", "time_s", "peak_mem_bytes", "energy_kwh", "co2e_kg", "eq6_co2e_kg", "budget_adherence",
           "predicted_adherence", "epochs", "samples_trained", "nvml_peak_bytes", "energy_duration_s", "BLEU", "TER",
           "METEOR", "NIST", "ROUGE_L", "CIDEr", "n_outputs_cut", *VARIANT_KEYS)
TAGS = ("profile", "model", "method", "cell", "seed", "dataset_label", "memory_source", "energy_source",
        "energy_covers", "enforce", "precision", "device", "table", "results_sha256")
CURVE_KEYS = ("train_loss", "train_top1", "test_top1", "lr", "epoch_time_s", "samples_trained", "kept_fraction",
              "loss_refreshed", "tokens_per_s")


def stage_logs(paths: list[str], own: str | None = None) -> list[str]:
    """The log files among ``paths``; a folder gives its *.log files, sorted, except this
    job's own log (still being written). Only plain files this user's stages wrote count
    (``own_plain_file``): a link among them is never followed."""
    found: list[str] = []
    for path in map(Path, paths):
        inside_project(path)  # a folder reached through a link out of the project: the job stops, naming it
        if path.is_dir() and not path.is_symlink():
            found += [str(p) for p in sorted(path.glob("*.log"))
                      if p.name != "track.log" and (own is None or os.path.abspath(p) != os.path.abspath(own))
                      and own_plain_file(p)]
        elif own_plain_file(path):
            found.append(str(path))
    return found


def own_plain_file(path: Path) -> bool:
    """A regular file (not a link, no other hard link) owned by this user."""
    import stat

    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(info.st_mode) and info.st_nlink == 1 and info.st_uid == os.geteuid()


def copy_plain(path: str | Path, dest: Path) -> str:
    """Copy a file without following a link (one put in its place since it was listed is refused)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as source, open(dest, "wb") as out:
        shutil.copyfileobj(source, out)
    return str(dest)


def main() -> None:
    ap = stagekit.parser(__doc__)
    ap.add_argument("--cell", required=True, help="the cell JSON (final)")
    ap.add_argument("--train", required=True, help="the training's train.json")
    ap.add_argument("--artifact", nargs="*", default=[], help="more files to attach (calibration, plan, carbon)")
    ap.add_argument("--logs", nargs="*", default=[],
                    help="the cell's stage logs, or their folder (every *.log in it but this job's own)")
    ap.add_argument("--out", required=True, help="marker JSON with the run id")
    args = ap.parse_args()
    params, log = stagekit.start(args, "track", writes=Path(args.out).parent)
    # Every record against its place, the cell's against the training given, and every
    # record attached as well (a swapped carbon.json or calibration stops here).
    cell, train = provenance.read_record(args.cell, inputs={"train": args.train}), provenance.read_record(args.train)
    for path in args.artifact:
        if path.endswith(".json"):
            provenance.read_record(path, inputs={"train": args.train} if Path(path).name == "carbon.json" else None)
    curves = train.get("curves") or {key: train[key] for key in CURVE_KEYS if isinstance(train.get(key), list)}
    metrics = {key: cell[key] for key in METRICS if key in cell}
    run_params = {"cell": {k: v for k, v in cell.items() if k not in metrics and k not in TAGS
                           and not isinstance(v, (dict, list))},
                  "params": train.get("params", {}),
                  # the run plan its live run logged (without one: from train.json, the same values)
                  **({"plan": train["run_plan"]} if train.get("run_plan") else {}),
                  # the method's plan, apart from the run plan (plan.*)
                  "method_plan": cell.get("plan") or {},
                  # what a study compares by, beside the settings (they are tags too)
                  **{key: cell[key] for key in ("method", "seed") if cell.get(key) is not None}}
    tags = {key: cell[key] for key in TAGS if cell.get(key) is not None}
    # The logs are copied first: a job of the same cell that starts meanwhile (the scoring
    # beside the baseline's tracking) has Snakemake delete its log file, which would
    # otherwise vanish between the listing and the upload.
    snapshot = tempfile.TemporaryDirectory(prefix="darel-track-logs-")
    logs = []
    for path in stage_logs(args.logs, own=args.log):
        try:
            logs.append(copy_plain(path, Path(snapshot.name) / Path(path).name))
        except FileNotFoundError:
            log.info("log %s is gone (its job is running again); not attached", path)
        except OSError as err:  # replaced by a link since it was listed
            log.warning("log %s not attached (%s)", path, err.strerror)
    artifacts = [args.cell, args.train, *args.artifact, *logs]
    try:
        run_id = log_cell_run(job_uri(params["tracking_uri"]), experiment=params["experiment"], cell_key=params["cell_key"],
                              params=run_params, metrics=metrics,
                              curves={k: v for k, v in curves.items() if k not in metrics}, tags=tags,
                              artifacts=artifacts)
    except TrackingError as err:
        stagekit.fail(log, f"MLflow: {err}")
    except Exception as err:  # noqa: BLE001 - name the store, whatever MLflow raised
        stagekit.fail(log, f"MLflow: could not record {params['cell_key']} in {redacted(params['tracking_uri'])} "
                           f"({type(err).__name__}: {err}); the cell's results are intact, run again once the store "
                           "works")
    snapshot.cleanup()
    provenance.write_record(args.out, {"run_id": run_id, "experiment": params["experiment"],
                                       "cell_key": params["cell_key"]}, inputs={"cell": args.cell})
    log.info("MLflow run %s (%s, %s) complete", run_id, params["experiment"], params["cell_key"])


if __name__ == "__main__":
    main()
