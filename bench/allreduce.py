"""gloo's all-reduce between 2 processes on loopback at the sizes of a ``small`` model's gradients, 1 thread each:
``torchrun --standalone --nproc_per_node=2 bench/allreduce.py`` (docs/performance.md, "Where the demo's update goes
on 2 processes"). 2,349,056 values is the demo model's parameter count."""

import time

import torch
import torch.distributed as dist

torch.set_num_threads(1)
dist.init_process_group("gloo")
for n, dtype in ((2_349_056, torch.float32), (2_349_056, torch.bfloat16), (1_200_000, torch.float32)):
    x = torch.randn(n).to(dtype)
    for _ in range(5):
        dist.all_reduce(x)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(30):
        dist.all_reduce(x)
    if dist.get_rank() == 0:
        print(f"{n:,} {dtype}: {(time.perf_counter() - start) / 30 * 1000:.1f} ms per all_reduce")
dist.destroy_process_group()
