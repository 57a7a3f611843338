"""DistributedDataParallel on CPU (gloo, 2 processes × 1 thread).

After every update both ranks hold identical weights, and 2 ranks with one batch each compute the same
update as 1 process accumulating both batches (losses are normalised by the global token count); so do
2 ranks accumulating two micro-batches each (update_freq 2: gradients gather in DDP's buckets under
no_sync) against 1 process with all four. SGD makes the comparison sharp (weight change = lr · gradient);
Adam checks rank agreement, and Muon, whose ranks share its work, both.
"""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from transduce.data import PreparedData
from transduce.data.batching import TokenBatches
from transduce.model import Transformer
from transduce.train.config import TrainConfig, model_config
from transduce.train.distributed import Dist
from transduce.train.optim import build_optimizer
from transduce.train.schedule import Schedule
from transduce.train.step import Stepper

UPDATES = 3
RUNS = (("sgd", 1), ("adam", 1), ("muon", 1), ("sgd", 2))  # (optimizer, micro-batches per rank and update)


def make(data_dir, optimizer: str, rank: int, world: int):
    data = PreparedData.open(data_dir)
    cfg = model_config({"preset": "tiny", "dropout": 0.0}, data.vocabs, "test")
    torch.manual_seed(5)
    model = Transformer(cfg).train()
    opt = (
        torch.optim.SGD(model.parameters(), lr=1.0)
        if optimizer == "sgd"
        else build_optimizer(
            model.named_parameters(), TrainConfig(data="d", out="o", optimizer=optimizer), Dist(rank, world)
        )
    )
    stepper = Stepper(
        model,
        opt,
        Schedule("inverse_sqrt", 1, peak_lr=1.0 if optimizer == "sgd" else 1e-3),
        device=torch.device("cpu"),
        dtype="fp32",
        ctx=Dist(rank, world),
    )
    batches = TokenBatches(data.split("train"), 400, seed=3, world_size=2).indices(1)  # the 2-rank plan
    return model, stepper, batches, TokenBatches(data.split("train"), 400, seed=3)


def worker(rank: int, port: int, data_dir, out) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        for optimizer, micro in RUNS:
            model, stepper, plan, tb = make(data_dir, optimizer, rank, 2)
            for u in range(UPDATES):  # rank r's shard: batches r, r+2, ...
                first = 2 * micro * u
                stepper.update([tb.make(plan[first + 2 * m + rank]) for m in range(micro)], u + 1)
                flat = torch.cat([p.detach().flatten() for p in model.parameters()])
                gathered = [torch.empty_like(flat) for _ in range(2)]
                dist.all_gather(gathered, flat)
                out.put(((optimizer, micro), rank, u, torch.equal(gathered[0], gathered[1])))
            if rank == 0:  # numpy: no shared memory to outlive the process
                out.put(((optimizer, micro), "weights", {k: v.numpy().copy() for k, v in model.state_dict().items()}))
            stepper.close()  # no DDP reducer may outlive the process group: gloo aborts the process at exit
    finally:
        dist.destroy_process_group()


def spawn_two_ranks(target, data_dir, results: int) -> list:
    """Run ``target(rank, port, data_dir, queue)`` in 2 spawned processes; collect ``results`` queue items."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=target, args=(r, port, data_dir, out)) for r in range(2)]
    for p in procs:
        p.start()
    got = [out.get(timeout=180) for _ in range(results)]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    return got


def run_two_ranks(data_dir):
    return spawn_two_ranks(worker, data_dir, len(RUNS) * (2 * UPDATES + 1))


@pytest.mark.slow
def test_two_ranks_agree_and_match_one_process_with_both_batches(data_dir):
    results = run_two_ranks(data_dir)
    for run in RUNS:  # after every update, both ranks hold identical weights
        flags = [x[3] for x in results if x[0] == run and x[1] != "weights"]
        assert len(flags) == 2 * UPDATES and all(flags), run
    for optimizer, micro in (("sgd", 1), ("sgd", 2), ("muon", 1)):  # Muon: each rank orthogonalizes half
        ddp = next(x[2] for x in results if x[0] == (optimizer, micro) and x[1] == "weights")
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            initial = {k: v.clone() for k, v in make(data_dir, optimizer, 0, 1)[0].state_dict().items()}
            model, stepper, plan, tb = make(data_dir, optimizer, 0, 1)
            for u in range(UPDATES):  # one process, every rank's batches of the update
                stepper.update([tb.make(plan[2 * micro * u + i]) for i in range(2 * micro)], u + 1)
        finally:
            torch.set_num_threads(threads)
        moved = 0.0
        for name, value in model.state_dict().items():
            torch.testing.assert_close(
                torch.from_numpy(ddp[name]),
                value,
                rtol=1e-4,
                atol=1e-5,
                msg=f"{name}, {optimizer}, {micro} micro-batch(es)",
            )
            moved = max(moved, (value - initial[name]).abs().max().item())
        assert moved > (1e-2 if optimizer == "sgd" else 1e-3)  # the updates were real (Muon's lr is 1e-3)
