# The DAG of the reproduction. Rules only wire stages (stages/*.py) to files;
# every parameter comes from params.yaml (plus --config overrides), validated
# by darel.config before any job runs. DVC calls the targets defined here.
#
# `snakemake --lint` (run by the tests) leaves four remarks, all deliberate:
# * "Specify a conda environment or container for each rule": every rule runs in the
#   project's one virtual environment, made from the pinned requirements.lock by `make`
#   (pip and venv; these machines have no conda, and the CPU build of torch is found
#   only by pip);
# * "Shell command directly uses variable PY": PY is that environment's interpreter. It
#   is not a parameter: as a rule param it would re-run every job whenever the checkout
#   (and so the virtual environment's path) moves.
# * "Shell command directly uses variable TRACKING_URI": the MLflow store the trainings
#   stream their epochs to. Not a param either: switching the store (a file, a database, a
#   server) must re-run only the tracking jobs and the tables, never a training.
# * "Shell command directly uses variable LIVE_RUN": whether a training streams a live
#   MLflow run (the profile's live_tracking). Not a param: it changes what MLflow shows
#   while a job runs, never a result, so switching it must not re-run a training.
import sys

from snakemake.utils import min_version

from darel import config as dconfig
from darel import preflight
from darel import sealkey
from darel import slurm as dslurm

min_version("9.0")

# What `make report` (snakemake --report) opens with; the files it shows are marked in the rules.
report: "workflow/report/workflow.rst"


# params.yaml is read here (not with `configfile:`), so that a YAML error names its line
# and a bad value stops the run with one line naming the key, the value and the rule.
# Then, before the DAG is built: the data set is checked (a damaged file is re-created
# identical to its record, so no finished run looks outdated), the locks a killed
# Snakemake left are cleared, and the Slurm jobs a killed submitter left are cancelled
# (here, not in onstart: Snakemake skips onstart when nothing is left to do). A dry run
# writes nothing.
# `--config params_file=.test/params.yaml` reads another parameter file of the project
# (the tiny smoke configuration); its own profile keeps its results apart.
# One Snakemake that writes works in this folder at a time (a second one stops in one line,
# whatever Snakemake's own locks say), and no link in the folders the jobs write leads out
# of the project (darel/preflight.py). First of all, before anything writes in .snakemake/:
# everything there must be a plain file or folder of the user's own (Snakemake and the
# workflow write their records through the names they find there). Last, incomplete markers
# over outputs a sealed record vouches for are dropped, not rerun (a job really interrupted
# leaves its outputs missing or unsealed).
try:
    preflight.check_snakemake_folder(workflow)
    PARAMS_FILE = dconfig.params_file(config)
    CFG = dconfig.workflow_config(PARAMS_FILE, {k: v for k, v in config.items()
                                                if k not in ("params_file", "calibrations_from")})
    PROFILE = CFG["profile"]
    sealkey.seal_key()  # usable (made on first use) before any job seals or checks a record with it
    sealkey.export_for_jobs()  # every job, on any node, seals with this key or stops naming it
    preflight.hold_run_lock(workflow)
    if preflight.is_main_process(workflow):
        preflight.check_links(preflight.store_files(CFG))
    dslurm.cancel_orphans_at_start(workflow, preflight.say)  # before this Snakemake takes its share of the live-lock
    preflight.clear_stale_locks(workflow)
    if preflight.is_main_process(workflow):
        preflight.check_data(CFG, preflight.Layout(PROFILE), workflow)
        preflight.ignore_sealed_incomplete(workflow)
except dconfig.ConfigError as err:
    sys.exit(f"{err}\n(nothing was run: correct params.yaml or the --config override and run again)")
except (preflight.Refusal, sealkey.SealKeyError) as err:
    sys.exit(str(err))
PY = sys.executable


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/table1.smk"
include: "workflow/rules/nlg.smk"
include: "workflow/rules/study.smk"
include: "workflow/rules/execution.smk"


rule all:
    input:
        L.table_csv("table1"),
        # Tables 2/3 when the profile defines its language-model setup.
        [L.table_csv(table) for table in dconfig.NLG_TABLES if "nlg" in CFG["profiles"][PROFILE]],
