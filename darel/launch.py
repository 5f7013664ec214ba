"""How a data-parallel fine-tuning's processes are started, and how each learns its rank.

* One machine (the local executor): torchrun (``python -m torch.distributed.run
  --standalone``) starts the processes and sets torch's variables itself.
* Slurm (the workflow run with the Slurm executor plugin): ``srun`` starts one task per
  process on every node of the job, as submitit and Lightning do. The job asks Slurm for
  the nodes and tasks (``slurm_resources``, the plugin's ``mpi`` route: the job's command
  runs in its batch shell and starts its own step), and each task turns Slurm's
  variables into torch's (``ranks_from_slurm``) before it joins the group. srun rather
  than one torchrun per node with a c10d rendezvous: Slurm starts, counts and signals
  every rank itself (a preemption notice reaches each rank, ``--kill-on-bad-exit`` ends
  the others when one fails), with no agent process between Slurm and the training.

The world is ``nodes * processes`` (processes per node); the global batch is split over
it, so the adapter does not depend on how the processes are spread.
"""

from __future__ import annotations

import os
import re
from typing import Mapping, MutableMapping

PORT_BASE = 15000  # Lightning's: 15000 + the job id's last four digits


def world_size(nodes: int, processes: int) -> int:
    for name, value in (("nodes", nodes), ("processes", processes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"nlg.finetune.{name} = {value!r}: must be a whole number of at least 1")
    return nodes * processes


def launch_command(python: str, nodes: int, processes: int, threads: int, slurm: bool) -> list[str]:
    """The words in front of the stage's script. ``processes`` per node, ``threads`` CPUs
    per process; ``slurm``: the job runs under the Slurm executor (one process: the
    plugin's own ``srun`` starts it)."""
    world = world_size(nodes, processes)
    if not slurm and nodes > 1:
        raise ValueError(f"nlg.finetune.nodes = {nodes} needs Slurm (--workflow-profile profiles/slurm): on one "
                         "machine set nodes to 1 and processes to its GPUs")
    if world == 1:
        return [python]
    if not slurm:
        return [python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes)]
    return ["srun", f"--nodes={nodes}", f"--ntasks={world}", f"--ntasks-per-node={processes}",
            f"--cpus-per-task={threads}", "--kill-on-bad-exit=1", python]


def slurm_resources(nodes: int, processes: int, gpu: bool) -> dict:
    """The Snakemake resources that make the Slurm plugin ask for ``nodes`` nodes with
    ``processes`` tasks (and, on a GPU, as many GPUs) on each, and run the job's command in
    its batch shell (the ``mpi`` route), where ``launch_command``'s srun starts the ranks.
    Empty for one process (a job like any other). GPUs are asked per node (``gres``),
    every task sees its node's GPUs and takes cuda:LOCAL_RANK."""
    world = world_size(nodes, processes)
    if world == 1:
        return {}
    # The plugin refuses tasks_per_node = 1 on its mpi route: one process per node is `tasks`.
    tasks = {"tasks_per_node": processes} if processes > 1 else {"tasks": world}
    request = {"mpi": "srun", "nodes": nodes, **tasks}
    if gpu:
        # gpu 0: no job-wide --gpus beside the per-node --gres; tasks_per_gpu 1 keeps the
        # plugin from reading `tasks` as tasks per GPU.
        request.update(gres=f"gpu:{processes}", gpu=0)
        if processes == 1:
            request["tasks_per_gpu"] = 1
    return request


def first_host(nodelist: str) -> str:
    """The first host of a Slurm host list (``gpu[03-04,07],cpu1`` -> ``gpu03``), as
    ``scontrol show hostnames`` would list it first."""
    head = re.match(r"(?:[^,\[]|\[[^\]]*\])+", nodelist.strip())
    if not head:
        raise ValueError(f"Slurm host list {nodelist!r}: no host in it")
    return re.sub(r"\[([^\],\-]*)[^\]]*\]", r"\1", head.group(0))


def ranks_from_slurm(environ: Mapping[str, str]) -> dict[str, str]:
    """torch's variables (RANK, WORLD_SIZE, LOCAL_RANK, NODE_RANK, MASTER_ADDR,
    MASTER_PORT) for a task of an ``srun`` step of several tasks; empty outside one, for a
    step of one task, and where torchrun has set them already (WORLD_SIZE). An address
    or port already in the environment is kept (as Lightning does); otherwise the first
    host of the step's nodes and a port from the job id."""
    if "WORLD_SIZE" in environ or int(environ.get("SLURM_NTASKS") or 1) <= 1 or "SLURM_STEP_ID" not in environ:
        return {}
    missing = [name for name in ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_JOB_ID") if not environ.get(name)]
    nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if missing or not (nodelist or environ.get("MASTER_ADDR")):
        raise ValueError(f"an srun task of {environ['SLURM_NTASKS']} without "
                         f"{', '.join(missing or ['SLURM_STEP_NODELIST'])}: cannot tell its rank")
    job = environ["SLURM_JOB_ID"]
    if not job.isdigit():
        raise ValueError(f"SLURM_JOB_ID = {job!r}: not a job number")
    return {"RANK": environ["SLURM_PROCID"], "WORLD_SIZE": environ["SLURM_NTASKS"],
            "LOCAL_RANK": environ["SLURM_LOCALID"], "NODE_RANK": environ.get("SLURM_NODEID", "0"),
            "MASTER_ADDR": environ.get("MASTER_ADDR") or first_host(nodelist),
            "MASTER_PORT": environ.get("MASTER_PORT") or str(PORT_BASE + int(job) % 10000)}


def adopt_slurm_ranks(environ: MutableMapping[str, str] = os.environ) -> bool:
    """Set torch's variables from Slurm's in this process (``ranks_from_slurm``); whether it did."""
    ranks = ranks_from_slurm(environ)
    environ.update(ranks)
    return bool(ranks)
