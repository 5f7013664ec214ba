# Rules shared by every table: the data set of the active profile, and the helpers the
# rule files use. Paths come from darel.layout (L), wildcard grammars from darel.grammar;
# every value reaches the shell quoted ({...:q}).
import json

from darel import grammar
from darel.layout import Layout

L = Layout(PROFILE)


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


def existing_logs(pattern):
    """The stage logs of a cell that exist (attached to its MLflow run; not the tracking job's own)."""
    import glob

    return sorted(p for p in glob.glob(pattern) if not p.endswith("/track.log"))


# Jobs whose time or energy enters a table (training, calibration) ask for the resource
# "timed" (the workflow profile limits it to 1) and for every core Snakemake has, so
# nothing else runs beside them: a number must not change because a neighbour was busy.
TIMED_THREADS = workflow.cores


wildcard_constraints:
    model="|".join(dconfig.KNOWN_MODELS),
    seed=grammar.SEED,
    cell=grammar.TABLE1_CELL,


def _download_inputs(wildcards):
    """Nothing from the DAG; what the data set needs from outside is announced (and in a
    real run fetched) while the DAG is built, so a network failure is one line."""
    preflight.announce_raw_inputs(CFG, L, workflow)
    return []


def table_inputs(table, files):
    """A table's inputs: every file it is made from. Under an existing table, missing ones are
    re-created (darel.preflight.rebuild_missing); a profile's GPU need is said first."""
    preflight.check_device(CFG, workflow)
    preflight.rebuild_missing(workflow, f"results/{table}.csv", files)
    return files


rule download:
    input:
        _download_inputs,
    output:
        L.data_file("train.npz"),
        L.data_file("test.npz"),
        L.data_file("meta.json"),
    params:
        slice=lambda w: as_json(dconfig.dataset_params(CFG)),
        out=L.data,
    log:
        L.log("download.log"),
    shell:
        "{PY:q} stages/download.py --params {params.slice:q} --out {params.out:q} --raw data/raw --log {log:q} "
        "--no-progress"
