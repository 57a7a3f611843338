"""Two machines over loopback: `torchrun --nnodes=2` with a c10d rendezvous on 127.0.0.1, one process per
node, gloo. A node SIGKILLed mid-run brings the run down; both nodes restarted with --resume finish it with
the same weights and optimizer state as a run never interrupted. (Without dropout: a checkpoint holds rank 0's
RNG streams, and other ranks re-seed theirs at the resumed step, so their dropout masks would differ.)"""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_data_streaming import pair
from test_train_run import write_config

from transduce.cli import main as cli_main
from transduce.train.checkpoint import list_checkpoints

REPO = Path(__file__).resolve().parents[1]
STEPS = 40  # long enough that the kill, right after the first checkpoint, always lands before the end


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def small_data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("pairs")
    for side, lang in ((0, "en"), (1, "de")):
        (root / f"train.{lang}").write_text("".join(pair(i)[side] + "\n" for i in range(600)))
    assert (
        cli_main(
            [
                "prepare",
                "files",
                "--src-file",
                str(root / "train.en"),
                "--tgt-file",
                str(root / "train.de"),
                "--src-lang",
                "en",
                "--tgt-lang",
                "de",
                "--vocab-size",
                "120",
                "--out",
                str(root / "data"),
            ]
        )
        == 0
    )
    return root / "data"


def launch(config: Path, port: int, job: str, *extra: str) -> list[subprocess.Popen]:
    """Two torchrun agents (node 0 and node 1), each in its own process group, like two machines."""
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO / "src"),
        "GLOO_SOCKET_IFNAME": "lo",
        "OMP_NUM_THREADS": "1",
    }
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--nproc_per_node=1",
        "--rdzv_backend=c10d",
        f"--rdzv_endpoint=127.0.0.1:{port}",
        f"--rdzv_id={job}",
        "--local_addr=127.0.0.1",
        "--max_restarts=0",
        "-m",
        "transduce",
        "train",
        str(config),
        "--set",
        "model.dropout=0.0",
        "--set",
        "train.loss_kernel='tensor'",  # no C++ build inside the nodes
        "--set",
        "train.dropout_kernel='tensor'",
        *extra,
    ]
    return [
        subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True, text=True
        )
        for _ in range(2)
    ]


def finish(nodes: list[subprocess.Popen], timeout: float = 120) -> list[str]:
    outs = []
    for node in nodes:
        out, _ = node.communicate(timeout=timeout)
        assert node.returncode == 0, out[-3000:]
        outs.append(out)
    return outs


@pytest.mark.xfail(
    strict=False, reason="fails on a loaded 2-core host about half the time (2 of 4 runs); cause not found yet"
)
def test_two_nodes_killed_and_resumed_end_like_an_uninterrupted_run(small_data, tmp_path):
    common = dict(max_steps=STEPS, save_every_steps=2, dtype="fp32", max_tokens=400)
    ref_cfg = write_config(tmp_path / "ref.toml", small_data, tmp_path / "ref", **common)
    kill_cfg = write_config(tmp_path / "kill.toml", small_data, tmp_path / "kill", **common)
    reference = launch(ref_cfg, free_port(), "ref")
    victim = launch(kill_cfg, free_port(), "kill")
    try:
        deadline = time.time() + 120
        while not list_checkpoints(tmp_path / "kill/checkpoints"):
            assert time.time() < deadline and all(n.poll() is None for n in victim), "no checkpoint appeared"
            time.sleep(0.05)
        os.killpg(victim[1].pid, signal.SIGKILL)  # node 1 dies: its agent and its training process
        victim[1].wait()
        try:  # node 0 loses its peer: its collective fails and its agent gives up (max_restarts=0)
            victim[0].wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(victim[0].pid, signal.SIGKILL)
            victim[0].wait()
        assert victim[0].returncode != 0
        done = list_checkpoints(tmp_path / "kill/checkpoints")
        assert int(done[-1].name.split("_")[1]) < STEPS  # killed before the end
        finish(reference)
    finally:
        for node in reference + victim:
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
    outs = finish(launch(kill_cfg, free_port(), "resume", "--resume"))
    assert "resumed from" in outs[0] + outs[1]
    last = f"checkpoints/step_{STEPS:08d}"
    assert load_file(str(tmp_path / "ref" / last / "model.safetensors"))["src_embed.token.weight"].shape[0] == 120
    for name in ("model.safetensors", "optimizer.safetensors"):
        ref = load_file(str(tmp_path / "ref" / last / name))
        got = load_file(str(tmp_path / "kill" / last / name))
        assert ref.keys() == got.keys() and all(torch.equal(ref[k], got[k]) for k in ref), name
