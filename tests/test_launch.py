"""The fine-tuning's launch (darel/launch.py): the command in front of the stage, the
resources that make the Slurm plugin ask for nodes and tasks, and each srun task's rank."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from darel import launch

# What srun sets in the task of rank 3 of a step over two nodes with two tasks each.
TASK = {"SLURM_JOB_ID": "4321987", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "4", "SLURM_PROCID": "3",
        "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_STEP_NODELIST": "gpu[07-08]",
        "SLURM_JOB_NODELIST": "gpu[07-08]"}


def test_two_nodes_of_two_tasks_are_started_by_srun():
    assert launch.launch_command("/v/bin/python", 2, 2, 8, slurm=True) == [
        "srun", "--nodes=2", "--ntasks=4", "--ntasks-per-node=2", "--cpus-per-task=8", "--kill-on-bad-exit=1",
        "/v/bin/python"]


def test_one_machine_uses_torchrun_and_one_process_plain_python():
    assert launch.launch_command("py", 1, 2, 4, slurm=False) == [
        "py", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    assert launch.launch_command("py", 1, 1, 4, slurm=False) == ["py"]
    assert launch.launch_command("py", 1, 1, 4, slurm=True) == ["py"]  # the plugin's own srun -n1 starts it
    assert launch.launch_command("py", 1, 2, 4, slurm=True)[:5] == [
        "srun", "--nodes=1", "--ntasks=2", "--ntasks-per-node=2", "--cpus-per-task=4"]


@pytest.mark.parametrize("nodes, processes, said", [(2, 1, "needs Slurm"), (0, 2, "nodes = 0"),
                                                    (1, 1.5, "processes = 1.5"), (True, 1, "nodes = True")])
def test_impossible_geometries_are_refused_naming_the_value(nodes, processes, said):
    with pytest.raises(ValueError, match=said):
        launch.launch_command("py", nodes, processes, 1, slurm=False)


def test_the_plugin_is_asked_for_nodes_and_tasks_per_node():
    assert launch.slurm_resources(1, 1, gpu=True) == {}
    assert launch.slurm_resources(2, 2, gpu=False) == {"mpi": "srun", "nodes": 2, "tasks_per_node": 2}
    assert launch.slurm_resources(2, 4, gpu=True) == {"mpi": "srun", "nodes": 2, "tasks_per_node": 4,
                                                      "gres": "gpu:4", "gpu": 0}
    # One process per node: the plugin refuses tasks_per_node 1 on its mpi route.
    assert launch.slurm_resources(3, 1, gpu=True) == {"mpi": "srun", "nodes": 3, "tasks": 3, "gres": "gpu:1",
                                                      "gpu": 0, "tasks_per_gpu": 1}


def test_the_sbatch_line_has_the_geometry():
    plugin = pytest.importorskip("snakemake_executor_plugin_slurm")
    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string

    class Job:  # what the plugin reads of a job: its threads and resources
        threads = 8
        resources = type("Resources", (dict,), {"__getattr__": dict.__getitem__})(
            launch.slurm_resources(2, 2, gpu=True), runtime=60, mem_mb=1000)

    params = {"run_uuid": "u", "slurm_logfile": "l", "comment_str": "c", "account": "-A a", "partition": "-p p",
              "workdir": "/w"}
    line = (get_submit_command(Job(), params) + set_gres_string(Job())).split()
    assert plugin and {"--nodes=2", "--ntasks-per-node=2", "--cpus-per-task=8", "--gres=gpu:2"} <= set(line), line
    # No job-wide GPU count or GPU binding beside the per-node GPUs.
    assert not any(word.startswith(("--gpus", "--ntasks-per-gpu", "--ntasks=")) for word in line), line


def test_an_srun_task_gets_torchs_variables():
    assert launch.ranks_from_slurm(TASK) == {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "NODE_RANK": "1",
                                             "MASTER_ADDR": "gpu07", "MASTER_PORT": str(15000 + 1987)}
    # An address and port given by hand are kept (Lightning's rule).
    kept = launch.ranks_from_slurm({**TASK, "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"})
    assert (kept["MASTER_ADDR"], kept["MASTER_PORT"]) == ("10.0.0.1", "29500")


@pytest.mark.parametrize("environ", [
    {},  # not under Slurm
    {**TASK, "SLURM_NTASKS": "1"},  # a step of one task (the plugin's srun -n1)
    {k: v for k, v in TASK.items() if k != "SLURM_STEP_ID"},  # the batch shell, not a step
    {**TASK, "WORLD_SIZE": "2", "RANK": "0"},  # torchrun set them
])
def test_outside_a_step_of_several_tasks_nothing_is_set(environ):
    assert launch.ranks_from_slurm(environ) == {}


def test_a_task_without_its_rank_is_refused():
    with pytest.raises(ValueError, match="SLURM_LOCALID"):
        launch.ranks_from_slurm({k: v for k, v in TASK.items() if k != "SLURM_LOCALID"})


def test_adopting_sets_the_variables_once():
    environ = dict(TASK)
    assert launch.adopt_slurm_ranks(environ) and environ["RANK"] == "3"
    assert not launch.adopt_slurm_ranks(environ)  # WORLD_SIZE is set now


@pytest.mark.parametrize("nodelist, first", [("gpu[03-04,07],cpu1", "gpu03"), ("node7", "node7"),
                                             ("a,b", "a"), ("rack[2-3]-n[010-012]", "rack2-n010"),
                                             ("n[5,1-2]", "n5")])
def test_the_first_host_is_the_one_scontrol_lists_first(nodelist, first):
    assert launch.first_host(nodelist) == first
    if shutil.which("scontrol"):
        listed = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True)
        if listed.returncode == 0:
            assert listed.stdout.split()[0] == first
