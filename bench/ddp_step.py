"""What DistributedDataParallel costs a training update on 2 CPU processes, side by side in one run.

``torchrun --standalone --nproc_per_node=2 bench/ddp_step.py runs/X/data`` (with jemalloc in LD_PRELOAD as the
recipe runs). Model `small`, bf16, R-Drop α 2, 1,024 target tokens per process and update, 1 thread per
process, the trainer's Stepper. Three wrappers take turns, ``--rounds`` times, each timing ``--updates`` updates
on the same batches:

* ``torch defaults``: ``DistributedDataParallel(model)``;
* ``transduce``: :func:`transduce.train.distributed.wrap` (no buffer broadcast, gradients as bucket views);
* ``no gradient all-reduce``: the same updates under ``no_sync()``, the floor any wrapper could reach (the
  ranks still meet once per update for the loss statistics).
"""

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn

from transduce.data import PreparedData
from transduce.data.batching import TokenBatches
from transduce.model import ModelConfig, Transformer
from transduce.train.distributed import setup, wrap
from transduce.train.dropout import use_fast_dropout
from transduce.train.rdrop import RDrop
from transduce.train.schedule import Schedule
from transduce.train.step import Stepper


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data")
    p.add_argument("--updates", type=int, default=50)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--only", default="", help="time only the wrappers whose names start with this")
    args = p.parse_args()
    torch.set_num_threads(1)
    ctx = setup(torch.device("cpu"))
    torch.manual_seed(1)
    data = PreparedData.open(args.data)
    cfg = ModelConfig.preset("small", vocab_size=len(data.vocabs.src))
    model = Transformer(cfg).train()
    use_fast_dropout(model)
    opt = torch.optim.Adam(model.parameters(), betas=(0.9, 0.98), eps=1e-9, fused=True)
    stepper = Stepper(
        model,
        opt,
        Schedule("rsqrt", 4000, cfg.d_model),
        device=torch.device("cpu"),
        dtype="bf16",
        objective=RDrop(cfg.label_smoothing, 2.0),
        ctx=ctx,
    )
    batches = TokenBatches(data.split("train"), 1024, seed=1, rank=ctx.rank, world_size=ctx.world_size).epoch(1)
    warm, timed = batches[:5], batches[5 : 5 + args.updates]
    ddp = nn.parallel.DistributedDataParallel
    variants = {
        "torch defaults": lambda: ddp(stepper.loss),
        "transduce": lambda: wrap(stepper.loss, ctx, torch.device("cpu")),
        "+ batched_grad_copy": lambda: ddp(
            stepper.loss, forward_sync_buffers=False, gradient_as_bucket_view=True, batched_grad_copy=True
        ),
        "+ zero, not None, grads": lambda: wrap(stepper.loss, ctx, torch.device("cpu")),
        "no gradient all-reduce": lambda: wrap(stepper.loss, ctx, torch.device("cpu")),
    }
    zero_grad = opt.zero_grad
    for round_ in range(1, args.rounds + 1):
        for name, make in variants.items():
            if not name.startswith(args.only):
                continue
            stepper.model = make()
            update = stepper.update
            opt.zero_grad = (
                (lambda set_to_none=True: zero_grad(set_to_none=False)) if name.startswith("+ zero") else zero_grad
            )
            if name.startswith("no gradient"):

                def update(batch_list, step, _update=stepper.update, _ddp=stepper.model):
                    with _ddp.no_sync():
                        return _update(batch_list, step)

            for i, batch in enumerate(warm):
                update([batch], i + 1)
            dist.barrier()
            tokens, start = 0, time.perf_counter()
            for i, batch in enumerate(timed):
                tokens += update([batch], 100 + i).tokens
            seconds = time.perf_counter() - start
            if ctx.is_main:
                print(
                    f"round {round_} {name:24s} {seconds / len(timed) * 1000:6.1f} ms per update, "
                    f"{tokens / seconds / ctx.world_size:6.0f} target tokens/s per process "
                    f"({len(timed)} updates of ~{tokens // len(timed)} tokens on {ctx.world_size} processes)",
                    flush=True,
                )
            stepper.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
