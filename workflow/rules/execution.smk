# What the submitting Snakemake does first. On a cluster executor (darel/slurm.py): jobs
# whose time enters a table must name their node type (a `constraint`), Slurm must accept
# the settings of one job of each kind (sbatch --test-only: a wrong account, partition,
# memory or node type stops the run in one line naming it), SIGTERM and SIGHUP
# cancel its jobs as Ctrl-C does, a job cancelled by hand ends the workflow and a requeued
# job is named (plugin status query). Nothing on the local executor. On any executor,
# before the first job: the MLflow store must answer (a server or database that is down
# stops the run in one line, its password hidden). The jobs a `kill -9`ed submitter left
# are cancelled from the Snakefile's top level.
from darel import tracking as dtracking

# Jobs that only read and write records run in the submitting Snakemake, never as cluster
# jobs (a Slurm job of a few seconds' work costs 10-15 s of queueing and two Snakemake
# starts, and a record step inside a training's group job would hold its GPU): the
# packaged data's download, each cell's record and the tables; the MLflow records too
# where the store is a file, which the submitting node reaches as the jobs do (a store
# on a server may be reachable from the compute nodes only: there they stay jobs). None
# of them may be in a group of profiles/slurm (a group with one local job runs locally).
localrules: all, download, data_card, cell_record, study_cell_record, nlg_cell_record, table1, nlg_table, study_table1, study_nlg_table
if dtracking.lock_path_for(CFG["tracking"]["uri"]) is not None:
    localrules: track_cell, study_track, nlg_track


onstart:
    problem = (dtracking.store_answers(CFG["tracking"]["uri"]) or dslurm.timed_jobs_problem(workflow)
               or dslurm.settings_problem(workflow))
    if problem:
        sys.exit(problem)
    if FINETUNE_NODES > 1 and not workflow.non_local_exec:
        sys.exit(f"params: nlg.finetune.nodes = {FINETUNE_NODES} needs Slurm (--workflow-profile profiles/slurm); on "
                 "one machine set nodes to 1 and processes to its GPUs (docs/cluster.md, Multi-node fine-tuning)")
    if dslurm.prepare(workflow, preflight.say):
        dslurm.stop_like_ctrl_c()


onsuccess:
    if dslurm.executor_name(workflow) == "slurm":
        dslurm.forget_mine()


onerror:
    if dslurm.executor_name(workflow) == "slurm":
        dslurm.forget_mine()
