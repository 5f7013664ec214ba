# What the submitting Snakemake does on a cluster executor (darel/slurm.py): SIGTERM and
# SIGHUP cancel its jobs as Ctrl-C does, the jobs a `kill -9`ed submitter left are
# cancelled, a job cancelled by hand ends the workflow (plugin status fix). Nothing on the
# local executor.
from darel import slurm as dslurm


onstart:
    if dslurm.prepare(workflow, preflight.say):
        dslurm.stop_like_ctrl_c()


onsuccess:
    if dslurm.executor_name(workflow) == "slurm":
        dslurm.forget_mine()


onerror:
    if dslurm.executor_name(workflow) == "slurm":
        dslurm.forget_mine()
