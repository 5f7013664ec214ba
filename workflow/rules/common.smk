# Rules shared by every table: the data set of the active profile, and the helpers the
# rule files use. Paths come from darel.layout (L), wildcard grammars from darel.grammar;
# every value reaches the shell quoted ({...:q}).
import json
import os
import shlex

from pathlib import Path

from darel import devicelock
from darel import grammar
from darel import launch
from darel import methods
from darel import tracking as dtracking
from darel.layout import Layout

L = Layout(PROFILE)


def for_report(files, category, subcategory=None):
    """A table's or study's files with the ones a reader opens marked for `snakemake --report`
    (`make report`): rows, comparison, plots and verdict, each with its caption in
    workflow/report/ (the metrics JSON and the summary CSV stay out: the rows hold them)."""
    captions = {"csv": "rows.rst", "rows": "rows.rst", "compare": "compare.rst", "plot": "plot.rst",
                "verdict": "verdict.rst", "composition": "composition.rst"}
    return {key: report(path, caption=f"../report/{captions[key]}", category=category, subcategory=subcategory)
            if key in captions else path for key, path in files.items()}
# The methods the study trains itself (darel.methods): every control, and DAREL too when the
# study's schedule rule is not Table 1's (then Table 1's own DAREL cells cannot stand in for it);
# each by its runs (the negative control's restreams: darel-restream, darel-restream-2, ...).
CONTROL = "|".join(run for m in methods.names(study=True) if m != "darel" or dconfig.study_trains_darel(CFG)
                   for run in methods.get(m).runs(CFG))
# The training sets a study draws itself (e.g. random), each built by rule study_subset.
OWN_SUBSETS = "|".join(methods.own_subsets())


def as_json(obj):
    """A stage's parameter slice, passed on the command line. Snakemake compares it with
    the last run's (rerun trigger 'params'), so a job re-runs exactly when its slice changes."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


# Jobs that run on a GPU ask for the resource "gpu" (the workflow profile sets gpu=1): on a
# GPU profile they run one at a time, so no timed job shares the device with another job;
# a job that asks for more than the limit (a multi-GPU fine-tuning) runs alone. On CPU
# profiles they ask for none and run side by side as before. On Slurm the same resource
# is sbatch --gpus: GPUs of the job's own.
# A cuda profile with `device_turns` run on this machine: the device itself is handed from
# job to job by a lock (darel.devicelock: a job holds it from its first use of the GPU to
# its exit), so the scheduler may start the next GPU job while one works: GPU jobs then ask
# "gpu_queue" (the workflow profile allows two at once: one on the device, one starting
# up) and neither "gpu" nor "timed". On a cluster nothing changes: each job's GPUs are its
# own. Functions: the executor is known only once the DAG is built.
ON_GPU = CFG["profiles"][PROFILE]["device"] != "cpu"
DEVICE_TURNS = bool(CFG["profiles"][PROFILE].get("device_turns", False))
if DEVICE_TURNS:
    os.environ[devicelock.LOCK_DIR_ENV] = str(Path(".snakemake", "darel-device").resolve())


def _turns_here():
    return DEVICE_TURNS and not workflow.non_local_exec


def GPU_JOB(wildcards):
    return 1 if ON_GPU and not _turns_here() else 0


def GPU_QUEUE(wildcards):
    return 1 if _turns_here() else 0


def TIMED_JOB(wildcards):
    return 0 if _turns_here() else 1


# The MLflow store. The training jobs get it in their shell command, never as a param:
# Snakemake re-runs a job whose params change, and switching the store (a file, a database,
# a server) must re-run only the tracking jobs and the tables (their slices hold the URI),
# never a training. The shell text itself (the `code` trigger) holds only the name.
# Command lines and slices carry it redacted (a password replaced by ***; Snakemake records
# both in .snakemake/ and its logs); the jobs take the whole URI from their environment
# (darel.tracking.job_uri), where this Snakemake puts it. Without a password the two are one.
os.environ[dtracking.URI_ENV] = CFG["tracking"]["uri"]
TRACKING_URI = dtracking.redacted(CFG["tracking"]["uri"])
# The profile's live_tracking: false keeps MLflow out of its trainings (its start, about 2 s,
# in every training job); each cell's tracking job writes the whole run from train.json.
LIVE_RUN = "" if CFG["profiles"][PROFILE].get("live_tracking", True) else "--no-live-run "


def cell_key(*parts):
    """A cell's key in its MLflow experiment: profile/model/s<seed>/<cell>[/<method>]."""
    return "/".join([PROFILE, *(str(part) for part in parts)])


def existing_logs(pattern):
    """The folder of a cell's stage logs: the tracking job attaches every *.log in it but its
    own (stages/track.py). A folder, not the list of files found while the DAG is built: that
    list changes as jobs write logs (on a cluster, between the submitting Snakemake and the
    job's own), and a changed param would re-run the tracking job."""
    return str(Path(pattern).parent)


# Jobs whose time or energy enters a table (training, calibration) ask for the resource
# "timed" (the workflow profile limits it to 1) and, on this machine under a CPU profile,
# for every core Snakemake has, so nothing else runs beside them: a number must not change
# because a neighbour was busy. Under a cuda profile the timed job's clock is the GPU's and
# every job that touches the GPU asks gpu=1, so no neighbour can share the device; the
# timed job takes its profile's `threads`, and jobs that never touch the GPU (records,
# MLflow tracking, subsets, tables) run on the cores left instead of waiting for it.
# On a cluster (a non-local executor, e.g. profiles/slurm) the submit host's cores mean
# nothing: every job that runs torch asks for the profile's `threads` (the torch threads
# it starts) and its GPUs, cores and GPUs of its own but never a whole node; timed jobs
# must name their node type (a `constraint`, darel/slurm.py). CPUs per job come from
# params.yaml, never from the submit host.
# Functions, not numbers: the executor is known only once the DAG is built, after this
# file is read.
PROFILE_THREADS = int(CFG["profiles"][PROFILE]["threads"])
# Only a profile that names cuda is sure to train on the GPU ("auto" may fall back to the CPU).
ON_CUDA = CFG["profiles"][PROFILE]["device"] == "cuda"


def TIMED_THREADS(wildcards):
    return PROFILE_THREADS if workflow.non_local_exec or ON_CUDA else workflow.cores


# A training that follows a fixed plan (budget.enforce: plan: its epochs come from a
# calibration that ran alone) trains the same model whatever runs beside it; only its
# measured time can change. With the profile's `planned_side_by_side` (cpu, this machine)
# such a job takes the profile's threads instead of every core, so two run at once (or one
# beside an evaluation); baselines (whose time sets every budget) and calibrations (whose
# probes set every plan) still run alone. Each run records what ran beside it
# (`cores_beside`); bench/side_by_side.py measures what a neighbour costs on time_s.
PLANNED_SIDE_BY_SIDE = bool(CFG["profiles"][PROFILE].get("planned_side_by_side", False))


def _side_by_side_here():
    return PLANNED_SIDE_BY_SIDE and not workflow.non_local_exec


def PLANNED_THREADS(wildcards):
    return PROFILE_THREADS if _side_by_side_here() else TIMED_THREADS(wildcards)


def PLANNED_JOB(wildcards):
    return 0 if _side_by_side_here() else TIMED_JOB(wildcards)


def DATA_THREADS(wildcards):
    """The data set's job: every other job waits for it, so on one machine it takes every
    core (a generated data set renders on them); on a cluster the profile's threads."""
    return PROFILE_THREADS if workflow.non_local_exec else workflow.cores


def JOB_THREADS(wildcards):
    """Untimed jobs that run torch (scoring, evaluation, subsets, language-model passes)."""
    return PROFILE_THREADS if workflow.non_local_exec else 1


wildcard_constraints:
    model="|".join(dconfig.KNOWN_MODELS),
    seed=grammar.SEED,
    cell=grammar.TABLE1_CELL,



def data_dir(wildcards, input):
    """The data set's folder, from the rule's first input (a file in it)."""
    return str(Path(input[0]).parent)


def table_inputs(table, files, new_files=(), new_cells=()):
    """A table's inputs: every file it is made from. Under an existing table, missing ones are
    re-created (darel.preflight.rebuild_missing), except those of cells the table does not
    hold yet (new cells: planned, not repaired); a profile's GPU need is said first."""
    preflight.check_device(CFG, workflow)
    preflight.rebuild_missing(workflow, L.table_csv(table), files, new_files, new_cells)
    return files


def _download_inputs(wildcards):
    """Nothing from the DAG; what the data set needs from outside is announced (and in a
    real run fetched) while the DAG is built, so a network failure is one line."""
    preflight.announce_raw_inputs(CFG, L, workflow)
    return []


# ---- Table 1 -------------------------------------------------------------------------------------

def table1_inputs(wildcards=None):
    """Everything Table 1 is made from: per cell its record and MLflow marker, and every
    intermediate file behind them. A file missing under an existing table is re-created,
    so the table never silently lacks a cell's source."""
    new_cells, new_files = preflight.table1_new_cells(CFG, L)
    return table_inputs("table1", preflight.table1_files(CFG, L), new_files, new_cells)


# `--config calibrations_from=<another project>`: every budget cell takes that project's
# calibration.json of the same cell instead of measuring its own (stages/calibrate.py), so
# that all that follows a calibration can be compared bit for bit between two builds.
CALIBRATIONS_FROM = config.get("calibrations_from")
if CALIBRATIONS_FROM and not Path(CALIBRATIONS_FROM, "runs").is_dir():
    sys.exit(f"calibrations_from={CALIBRATIONS_FROM}: no runs/ folder there (give another project's root)")


def reused_calibration(wildcards):
    """The calibrate job's slice entry naming the calibration it reuses (none: it measures)."""
    if not CALIBRATIONS_FROM:
        return {}
    settings = L.table1("calibration.json", model=wildcards.model, seed=wildcards.seed, cell=wildcards.cell)
    return {"reuse": str(Path(CALIBRATIONS_FROM, settings).resolve())}


def _scorer_run(wildcards, name):
    """Algorithm 2's losses come from the model's scorer (protocols.<model>.scorer)."""
    return L.table1(name, model=dconfig.scorer_of(CFG, wildcards.model), seed=wildcards.seed,
                    cell=dconfig.TABLE1_BASELINE)


def _calibration_input(wildcards):
    if wildcards.cell == dconfig.TABLE1_BASELINE:
        return []
    return [L.table1_settings(model=wildcards.model, seed=wildcards.seed, cell=wildcards.cell)]


def _scorer_costs(wildcards):
    """The records of the scorer's costs a cell's report charges in its total time: its
    training's train.json and its losses (the scoring pass's time); none for a baseline.
    The IDS + ADONIS row's scorer is its own model's baseline."""
    if wildcards.cell == dconfig.TABLE1_BASELINE:
        return {}
    if wildcards.cell == dconfig.IDS_ADONIS:
        return {"scorer_train": L.table1("train.json", model=wildcards.model, seed=wildcards.seed,
                                         cell=dconfig.TABLE1_BASELINE)}
    return {"scorer_train": _scorer_run(wildcards, "train.json"), "scorer_losses": _scorer_run(wildcards, "losses.npz")}


def report_flags(wildcards, input):
    """The cell-record stage's optional records as command-line flags, from the rule's named inputs."""
    flags = []
    for name in ("model", "baseline", "calibration", "meta", "hyps", "scorer_train", "scorer_losses"):
        value = getattr(input, name, None)
        if value:
            flags += [f"--{name.replace('_', '-')}", *([value] if isinstance(value, str) else value)]
    return flags


# ---- Tables 2 and 3 -----------------------------------------------------------------------------

def _table_of(dataset):
    return next(t for t in dconfig.NLG_TABLES if CFG[t]["dataset"] == dataset)


def nlg_table_inputs(wildcards):
    return table_inputs(wildcards.table, preflight.nlg_table_files(CFG, L, wildcards.table))


def nlg_experiment(w):
    """A table's cells go to its experiment, a study control's to the study's."""
    return w.table if dconfig.split_nlg_cell(w.nlg_cell)[1] in ("lora", "darel") else f"study_{w.table}"


def _nlg_data_inputs(wildcards):
    preflight.announce_nlg_inputs(CFG, wildcards.dataset, workflow)
    return []


def _scorer_memory(wildcards):
    """The scorer model's LoRA baseline adapter on this data set, when a table has it: on a
    GPU the per-sample loss batches grow to the peak memory that fine-tuning measured."""
    table = _table_of(wildcards.dataset)
    scorer = CFG["nlg"]["scorer"]
    if scorer not in CFG[table]["models"]:
        return []
    return [L.nlg_run("adapter", table=table, model=scorer, seed=dconfig.seeds(CFG)[0], cell=dconfig.NLG_BASELINE)]


def _ranked_by_scorer(wildcards):
    """The scorer's losses of a fine-tuning whose pairs they ranked (DAREL's, the easy
    control's): its report charges their scoring pass in the total time."""
    method = dconfig.split_nlg_cell(wildcards.nlg_cell)[1]
    return _losses_input(wildcards) if method in ("darel", "easy") else []


def _losses_input(wildcards):
    if wildcards.nlg_cell == dconfig.NLG_BASELINE:
        return []
    return [L.nlg_shared("scorer_losses.npz", dataset=CFG[wildcards.table]["dataset"])]


def _nlg_data(w, name=""):
    return L.nlg_data(name, dataset=CFG[w.table]["dataset"])


def _nlg_shared(w, name):
    return L.nlg_shared(name, dataset=CFG[w.table]["dataset"])


def _finetune_params(w):
    return dconfig.nlg_finetune_params(CFG, w.table, w.nlg_model, w.nlg_cell, w.seed)


def _finetune_processes(w):
    return _finetune_params(w)["finetune"]["processes"]


# The fine-tuning's processes: `processes` per node on `nodes` nodes (params.yaml, the same
# for every cell of the profile). One machine: torchrun; under Slurm: srun, in a job that
# asks the plugin for the nodes and tasks (darel/launch.py says why). The resources' names
# are fixed when this file is read, before the executor is known: those of the srun route
# (harmless to the local scheduler) whenever there are several processes, with the GPU
# count a function that gives 0 under Slurm (the GPUs are asked per node there).
FINETUNE_SETTINGS = dconfig.nlg_finetune_settings(CFG) if "nlg" in CFG["profiles"][PROFILE] else {"processes": 1}
FINETUNE_NODES = FINETUNE_SETTINGS.get("nodes", 1)
FINETUNE_WORLD = FINETUNE_NODES * FINETUNE_SETTINGS["processes"]
FINETUNE_SRUN_RESOURCES = launch.slurm_resources(FINETUNE_NODES, FINETUNE_SETTINGS["processes"], gpu=ON_GPU)


def _finetune_under_slurm():
    # Inside the job the rule runs in a Snakemake of its own (remote mode; on the plugin's
    # mpi route with the local executor). A dry run of several nodes can only be of a
    # Slurm run: it shows that run's command.
    return workflow.non_local_exec or workflow.remote_exec or (workflow.dryrun and FINETUNE_NODES > 1)


def _gpus_beside_srun(per_process):
    """A GPU count that is 0 for a job of the srun route (its GPUs are per node, `gres`)."""
    return lambda w: 0 if FINETUNE_WORLD > 1 and _finetune_under_slurm() else per_process(w)


FINETUNE_RESOURCES = {**FINETUNE_SRUN_RESOURCES,
                      "gpu": _gpus_beside_srun(lambda w: GPU_JOB(w) * _finetune_processes(w))}
# The cell's evaluation, in the fine-tuning's group job, asks for the same GPUs: one request.
NLG_EVALUATE_GPUS = {"gpu": _gpus_beside_srun(GPU_JOB),
                     **{key: FINETUNE_SRUN_RESOURCES[key] for key in ("gres",) if key in FINETUNE_SRUN_RESOURCES}}


def _finetune_launcher(w):
    # Under Slurm each task has the profile's threads (the job's Snakemake, local inside the
    # job, would count every CPU of the allocation).
    slurm = _finetune_under_slurm()
    return launch.launch_command(PY, FINETUNE_NODES, _finetune_processes(w),
                                 PROFILE_THREADS if slurm else TIMED_THREADS(w), slurm=slurm)


# ---- studies -------------------------------------------------------------------------------------

def study_table1_inputs(wildcards=None):
    return table_inputs("study_table1", preflight.study_table1_files(CFG, L))


def study_table1_cells(wildcards=None):
    """Every row of the study: its methods' cells (DAREL's Table 1's own when the rules
    agree) and Table 1's baselines of the same seeds."""
    own_darel = not dconfig.study_trains_darel(CFG)
    files = set()
    for model, seed, cell, method in dconfig.study_table1_cells(CFG):
        files.add(L.table1_cell(model=model, seed=seed, cell=dconfig.TABLE1_BASELINE))
        files.add(L.table1_cell(model=model, seed=seed, cell=cell) if method == "darel" and own_darel
                  else L.study_cell(model=model, seed=seed, cell=cell, method=method))
    return sorted(files)


def study_fit_records():
    """The baselines' fit records the study's verdict reads ({"fit_records": [...]}), none
    (no key: the table job's parameters stay as they were) without a declared fitting regime."""
    found = [L.baseline_fit(model=model, seed=seed) for model, seed in dconfig.study_fit_baselines(CFG)]
    return {"fit_records": found} if found else {}


def _control_inputs(wildcards):
    return preflight.method_inputs(L, wildcards.model, wildcards.seed, wildcards.cell, wildcards.method)


def _optional_flags(wildcards, input):
    return ["--subset", input.subset] if hasattr(input, "subset") else []


def study_nlg_inputs(wildcards):
    table = wildcards.nlg_table
    return table_inputs(f"study_{table}", preflight.study_nlg_files(CFG, L, table))
