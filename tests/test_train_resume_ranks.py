"""Resuming with several ranks (gloo, 2 processes × 1 thread, dropout 0.1).

Each rank draws its own dropout masks, so a checkpoint holds every rank's RNG states: a run stopped at
update 3 and continued to 6 ends with the weights, optimizer state and rank 1's RNG state of a run that
went to 6 at once. And every rank resumes from the checkpoint rank 0 resumes from: a rank that cannot see
it (a run directory not shared between machines) stops the run with an error instead of starting again.
A kill while ``best/`` is replaced loses no ``best/``.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from conftest import write_config
from safetensors.torch import load_file

from transduce.data import PreparedData
from transduce.train.checkpoint import prune, rank_rng_name, read_state, resume_point, save_checkpoint, step_dir
from transduce.train.config import load_config, model_config
from transduce.train.distributed import Dist
from transduce.train.trainer import Trainer, write_run_header

STEPS, STOP = 6, 3


def train(config: Path, rank: int, resume: bool = False, overrides: tuple[str, ...] = ()) -> Trainer:
    cfg, table = load_config(config, list(overrides))
    data = PreparedData.open(cfg.data)
    mcfg = model_config(table, data.vocabs, "test")
    if rank == 0:
        write_run_header(cfg, mcfg, data.vocabs)
    trainer = Trainer(cfg, mcfg, data, resume=resume)
    trainer.train()
    return trainer


def worker(rank: int, ports: list[int], config: Path, root: Path, out) -> None:
    os.environ.update(
        RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", TRANSDUCE_NATIVE_DROPOUT="0"
    )
    try:
        for port, run, resume, steps in (
            (ports[0], "ref", False, STEPS),  # uninterrupted
            (ports[1], "cont", False, STOP),  # stopped at update 3 ...
            (ports[2], "cont", True, STEPS),  # ... and continued
        ):
            os.environ["MASTER_PORT"] = str(port)
            train(config, rank, resume, (f"out={root / run}", f"max_steps={steps}"))
        os.environ["MASTER_PORT"] = str(ports[3])
        mine = root / ("cont" if rank == 0 else "elsewhere")  # rank 1's machine does not see rank 0's files
        try:
            train(config, rank, True, (f"out={mine}", f"max_steps={STEPS + 2}"))
            out.put((rank, "no error"))
        except FileNotFoundError as e:
            out.put((rank, str(e)))
            # both ranks left the check's last collective before either tears the group down: a rank that
            # destroyed it while the other was still finishing that all-reduce killed the other, unreported
            torch.distributed.barrier()
            torch.distributed.destroy_process_group()
    except BaseException as e:
        out.put((rank, f"failed: {e!r}"))
        raise


@pytest.mark.slow
def test_two_ranks_with_dropout_resume_bit_identically(data_dir, tmp_path):
    # log_every 2: updates 1 and 5 are counted late (trainer._may_defer), with both ranks
    config = write_config(
        tmp_path / "c.toml", data_dir, tmp_path / "ref", dtype="fp32", save_every_steps=STOP, log_every=2
    )
    table = load_config(config)[1]
    assert model_config(table, PreparedData.open(data_dir).vocabs, "test").dropout == 0.1  # the tiny preset's
    socks = [socket.socket() for _ in range(4)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, ports, config, tmp_path, queue)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        results = dict(queue.get(timeout=900) for _ in range(2))  # a guard against a hung rank, not a speed limit
    finally:
        for p in procs:
            p.join(60 if p.is_alive() else 0)
            p.kill()  # a rank left waiting for a failed one
    assert not any(r.startswith("failed") for r in results.values()), results

    last = f"checkpoints/step_{STEPS:08d}"
    for name in ("model.safetensors", "optimizer.safetensors"):
        ref = load_file(str(tmp_path / "ref" / last / name))
        got = load_file(str(tmp_path / "cont" / last / name))
        assert ref.keys() == got.keys() and all(torch.equal(ref[k], got[k]) for k in ref), name
    ref, got = (json.loads((tmp_path / run / last / rank_rng_name(1)).read_text()) for run in ("ref", "cont"))
    assert ref == got  # rank 1's stream went on as if never stopped

    for rank, run in enumerate(("cont", "elsewhere")):  # every rank refuses, naming the checkpoint rank 0 chose
        assert f"{tmp_path / run / last}: rank 0 resumes from this checkpoint, but 1 of 2 ranks" in results[rank]
    assert "(rank 1 among them)" in results[1] and "shared file system" in results[0]
    assert not (tmp_path / "elsewhere/checkpoints").exists()  # and nobody trained


def test_a_kill_while_best_is_replaced_loses_no_best(tmp_path):
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.Adam(model.parameters())
    root = tmp_path / "checkpoints"
    for step in (1, 2, 3):
        save_checkpoint(step_dir(root, step), model, opt, {"step": step})
    save_checkpoint(root / "best", model, opt, {"step": 2})
    (root / "best").rename(root / ".best.old")  # killed between moving the old best aside and the new one in
    assert resume_point(root, Dist(), torch.device("cpu")) == step_dir(root, 3)
    assert read_state(root / "best")["step"] == 2
    prune(root, 1)
    assert sorted(p.name for p in root.iterdir()) == ["best", "step_00000003"]
