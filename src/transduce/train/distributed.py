"""Many processes with PyTorch's own engine: ``torchrun --nproc_per_node=N -m transduce train ...``.

torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT; :func:`setup` reads them and
starts the process group (gloo on CPU, nccl on CUDA). Every rank trains on its own shard of each
epoch's batches (``TokenBatches(rank=, world_size=)``), DistributedDataParallel averages gradients,
and only rank 0 writes checkpoints, logs and the model directory.

On two CPU cores, processes beat threads: `torchrun --nproc_per_node=2 ... --set threads=1` ran the
`small` bf16 model at 1,384–1,823 target tokens/s against 335–514 for one process with threads=2
(10 updates, Multi30k en-de, max_tokens 2048 per rank vs 4096; measured on a shared machine with load
average ≈ 9, which penalises multi-threaded kernels most — re-measure on a quiet machine).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup(device: torch.device) -> Dist:
    """Join the process group described by torchrun's environment; a single process if absent."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return Dist()
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=world_size)
    return Dist(rank, world_size, local_rank)


def wrap(model: nn.Module, ctx: Dist, device: torch.device) -> nn.Module:
    """DistributedDataParallel around ``model`` when there are several ranks; the model itself otherwise.

    Two of DDP's defaults cost time and buy nothing here. Buffers are not broadcast before each forward
    (``forward_sync_buffers=False``): the only one, the positional-encoding table, is a constant every rank
    builds alike. Each ``.grad`` is a view into its all-reduce bucket (``gradient_as_bucket_view``), which
    saves copying gradients in and out. `python bench/ddp_step.py` times the wrappers side by side
    (docs/performance.md).
    """
    if not ctx.enabled:
        return model
    ids = [device.index] if device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(
        model, device_ids=ids, forward_sync_buffers=False, gradient_as_bucket_view=True
    )


def all_sum(values: torch.Tensor, ctx: Dist) -> torch.Tensor:
    """Sum a small float64 tensor of statistics over all ranks (identity with one rank)."""
    if ctx.enabled:
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values


def broadcast_from_main(values: torch.Tensor, ctx: Dist) -> torch.Tensor:
    """Rank 0's ``values`` on every rank (in place; identity with one rank)."""
    if ctx.enabled:
        dist.broadcast(values, src=0)
    return values


def all_gather_bytes(blob: bytes, ctx: Dist, device: torch.device) -> list[bytes]:
    """Every rank's ``blob`` (non-empty; lengths may differ), indexed by rank, on every rank."""
    if not ctx.enabled:
        return [blob]
    length = torch.tensor([len(blob)], dtype=torch.int64, device=device)
    lengths = [torch.empty_like(length) for _ in range(ctx.world_size)]
    dist.all_gather(lengths, length)
    sizes = [int(n) for n in lengths]
    padded = torch.zeros(max(sizes), dtype=torch.uint8, device=device)  # (longest,)
    padded[: len(blob)] = torch.frombuffer(bytearray(blob), dtype=torch.uint8).to(device)
    gathered = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(gathered, padded)
    return [bytes(g[:n].cpu().numpy()) for g, n in zip(gathered, sizes)]


def teardown(ctx: Dist, together: bool = True) -> None:
    """Leave the process group. ``together``: first wait for every rank (a run that ended normally), so no
    rank exits while another still works: a gloo rank that did (rank 0 writing the model directory) was
    seen to abort at exit ("terminate called without an active exception"). A rank that failed leaves at
    once; torchrun then stops the others."""
    if ctx.enabled and dist.is_initialized():
        if together:
            dist.barrier()
        dist.destroy_process_group()
