"""Data-parallel runs started by torchrun (``python -m torch.distributed.run``) or by srun.

torchrun starts the processes and sets RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR /
MASTER_PORT (an srun task sets them from Slurm's first, darel.launch); this module only reads those variables, joins the process group (NCCL on
GPUs, Gloo on CPU) and gives the training code what it needs to shard batches and
reduce counters. A plain ``python`` start is a world of one and touches nothing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class World:
    rank: int
    size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.size > 1


def launched_world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def join(device: torch.device) -> World:
    """Join the process group torchrun set up; each process gets its own GPU
    (cuda:LOCAL_RANK). Errors before any work when there are fewer GPUs than processes."""
    size = launched_world_size()
    if size == 1:
        return World(rank=0, size=1, device=device)
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if device.type == "cuda":
        visible = torch.cuda.device_count()
        if local_rank >= visible:
            raise RuntimeError(f"{size} processes were started but this machine shows {visible} CUDA device(s); "
                               f"set nlg.finetune.processes (or the profile's) to at most {visible}")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return World(rank=rank, size=size, device=device)


def current(device: torch.device) -> World:
    """The world an already joined process belongs to (a world of one outside torchrun)."""
    if dist.is_available() and dist.is_initialized():
        return World(rank=dist.get_rank(), size=dist.get_world_size(), device=device)
    return World(rank=0, size=1, device=device)


def all_reduce(values: list[float], world: World, op: str = "sum") -> list[float]:
    """Sum (or max) a few numbers over all processes; identity for a world of one."""
    if not world.is_distributed:
        return list(values)
    tensor = torch.tensor(values, dtype=torch.float64, device=world.device)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    return tensor.tolist()


def all_gather_object(obj, world: World) -> list:
    """Every process's ``obj``, indexed by rank (a list of one for a world of one)."""
    if not world.is_distributed:
        return [obj]
    gathered: list = [None] * world.size
    dist.all_gather_object(gathered, obj)
    return gathered


def barrier(world: World) -> None:
    if world.is_distributed:
        dist.barrier()


def leave(world: World) -> None:
    if world.is_distributed and dist.is_initialized():
        dist.destroy_process_group()
