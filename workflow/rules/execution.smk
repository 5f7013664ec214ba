# What the submitting Snakemake does first. On a cluster executor (darel/slurm.py): jobs
# whose time enters a table must name their node type (a `constraint`), SIGTERM and SIGHUP
# cancel its jobs as Ctrl-C does, a job cancelled by hand ends the workflow and a requeued
# job is named (plugin status query). Nothing on the local executor. On any executor,
# before the first job: the MLflow store must answer (a server or database that is down
# stops the run in one line, its password hidden). The jobs a `kill -9`ed submitter left
# are cancelled from the Snakefile's top level.
from darel import tracking as dtracking


onstart:
    problem = dtracking.store_answers(CFG["tracking"]["uri"]) or dslurm.timed_jobs_problem(workflow)
    if problem:
        sys.exit(problem)
    if dslurm.prepare(workflow, preflight.say):
        dslurm.stop_like_ctrl_c()


onsuccess:
    if dslurm.executor_name(workflow) == "slurm":
        dslurm.forget_mine()


onerror:
    if dslurm.executor_name(workflow) == "slurm":
        dslurm.forget_mine()
