# Rules shared by every table: the data set of the active profile.
import json


def as_json(obj):
    """A stage's parameter slice, passed on the command line. Snakemake compares it with
    the last run's (rerun trigger 'params'), so a job re-runs exactly when its slice changes."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


# Jobs that run on a GPU ask for the resource "gpu" (the workflow profile sets gpu=1): on a
# GPU profile they run one at a time, so no timed job shares the device with another job;
# a job that asks for more than the limit (a multi-GPU fine-tuning) runs alone. On CPU
# profiles they ask for none and run side by side as before.
GPU_JOB = 0 if CFG["profiles"][PROFILE]["device"] == "cpu" else 1

TRACKING_URI = CFG["tracking"]["uri"]


def cell_key(*parts):
    """A cell's key in its MLflow experiment: profile/model/s<seed>/<cell>[/<method>]."""
    return "/".join([PROFILE, *(str(part) for part in parts)])


def tracking_args(experiment, key):
    """Shell arguments of a training stage's live MLflow run (not in the parameter slice:
    changing the store never re-runs a training)."""
    return f"--tracking-uri {TRACKING_URI} --experiment {experiment} --cell-key {key}"


def existing_logs(pattern):
    """The stage logs of a cell that exist (attached to its MLflow run; not the tracking job's own)."""
    import glob

    return " ".join(sorted(p for p in glob.glob(pattern) if not p.endswith("/track.log")))


# Jobs whose time or energy enters a table (training, calibration) ask for the resource
# "timed" (the workflow profile limits it to 1) and for every core Snakemake has, so
# nothing else runs beside them: a number must not change because a neighbour was busy.
TIMED_THREADS = workflow.cores


wildcard_constraints:
    model=r"[a-z0-9_]+",
    seed=r"\d+",
    cell=r"baseline|ids_adonis|t\d\.\d\d_m\d\.\d\d",


rule download:
    output:
        f"data/{PROFILE}/train.npz",
        f"data/{PROFILE}/test.npz",
        f"data/{PROFILE}/meta.json",
    params:
        slice=lambda w: as_json(dconfig.dataset_params(CFG)),
    log:
        f"logs/{PROFILE}/download.log",
    shell:
        "{PY} stages/download.py --params {params.slice:q} --out data/" + PROFILE + " "
        "--raw data/raw --log {log} --no-progress"
