"""Data parallel training under torchrun: the process group, and gradients averaged across ranks.

Launched with torchrun, every rank takes its slice of each global batch (minbert.data.batches,
`TaskStream`) and gradients are averaged across ranks before the update by one explicit
all-reduce, which also works with PCGrad and SMART's extra gradients.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from minbert.core.errors import MinBertError
from minbert.core.settings import batch_statistic_tasks


@dataclass
class DistInfo:
    rank: int = 0
    world: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0


def init_distributed(device_setting: str = "auto") -> tuple[DistInfo, torch.device | None]:
    """Under torchrun (WORLD_SIZE > 1) start the process group; gloo on CPU, nccl on CUDA. The
    rank's GPU is set first and named to the group (`device_id`), so NCCL binds each rank to its own
    device; `shutdown_distributed` ends the group (a job in one process starts none)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo(), None
    rank = int(os.environ["RANK"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    use_cuda = torch.cuda.is_available() and device_setting != "cpu"
    device = torch.device(f"cuda:{local}") if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if use_cuda else "gloo", device_id=device if use_cuda else None)
    return DistInfo(rank, world), device


def shutdown_distributed(dist_info: DistInfo) -> None:
    if dist_info.world > 1:
        if dist.is_initialized():
            dist.destroy_process_group()


def refuse_batch_statistics(heads, tasks: list[str], world: int) -> None:
    """A loss that is a statistic of the whole batch (its declaration says so: minbert.core.losses):
    under torchrun each process would compute it on its slice (one pair per rank at batch 8 on 8
    GPUs: no gradient at all)."""
    whole = batch_statistic_tasks(heads, tasks) if world > 1 else []
    if whole:
        task, name = whole[0]
        raise MinBertError(f"finetune.heads: {task}'s loss '{name}' is a statistic of the whole batch, which "
                           f"{world} processes would each compute on their slice; run this experiment in one "
                           f"process (python -m stages.finetune) or give {task} another loss")


def average_gradients(params: list[torch.nn.Parameter], world: int, flag: torch.Tensor | None = None) -> None:
    """Average the gradients over the ranks (one all-reduce); `flag` (a float tensor, e.g. this
    update's count of non-finite losses) rides along and comes back summed over the ranks."""
    if world <= 1:
        return
    # every rank runs the same tasks, so the same parameters have no gradient on all ranks; they
    # stay None (a zero gradient would let AdamW move them by momentum and weight decay, unlike one process)
    grads = [p.grad for p in params if p.grad is not None]
    extra = [flag.reshape(-1).to(grads[0].dtype)] if flag is not None else []
    flat = torch.cat([g.reshape(-1) for g in grads] + extra)
    dist.all_reduce(flat)
    if flag is not None:
        flag.copy_(flat[-flag.numel():].view_as(flag))
    flat /= world
    offset = 0
    for g in grads:
        n = g.numel()
        g.copy_(flat[offset:offset + n].view_as(g))
        offset += n


def from_main(dist_info: DistInfo, flag: bool, device: torch.device) -> bool:
    """The main rank's `flag` on every rank (one broadcast): a decision only the main rank can make,
    such as early stopping on its dev evaluation, which every rank must follow."""
    if dist_info.world <= 1:
        return flag
    t = torch.tensor([int(flag)], device=device)
    dist.broadcast(t, 0)
    return bool(t.item())


def barrier(dist_info: DistInfo) -> None:
    if dist_info.world > 1:
        dist.barrier()
