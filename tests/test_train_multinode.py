"""Two machines over loopback: `torchrun --nnodes=2` with a c10d rendezvous on 127.0.0.1 (node 0 hosts its
store, as the machine named in --rdzv_endpoint does), one process per node, gloo, dropout on. Node 1 dies
(its torchrun agent and its training process, which torchrun starts in a session of its own) at a point the
run signals: after checkpoint KILL_AT, while node 0 waits for it at the next update. Node 0 then fails, and
both nodes restarted with --resume finish the run with the same weights and optimizer state as a run never
interrupted: each rank resumes its own dropout stream from the checkpoint."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import write_config
from safetensors.torch import load_file
from test_data_streaming import pair

from transduce.cli import main as cli_main
from transduce.train.checkpoint import list_checkpoints

REPO = Path(__file__).resolve().parents[1]
STEPS, KILL_AT = 8, 4  # node 1 dies after checkpoint 4 of 8 (one every 2 updates)


def free_ports(n: int) -> list[int]:
    """``n`` distinct free ports (each socket stays bound until all are chosen)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


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


def launch(config: Path, port: int, job: str, logs: Path, *extra: str, pause_at: int = 0) -> list[subprocess.Popen]:
    """Two torchrun agents (node 0 and node 1), each in its own process group, like two machines; their
    output goes to ``logs``/JOB-NODE.log. ``pause_at``: both run tests/torchrun_pause.py (`-m transduce`
    otherwise), and node 1's training process stops after that checkpoint and writes ``logs``/JOB.paused."""
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO / "src"),
        "GLOO_SOCKET_IFNAME": "lo",
        "OMP_NUM_THREADS": "1",
    }
    nodes = []
    for node in range(2):
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes=2",
            "--nproc_per_node=1",
            "--rdzv_backend=c10d",
            f"--rdzv_endpoint=127.0.0.1:{port}",
            f"--rdzv_id={job}",
            f"--rdzv_conf=is_host={int(node == 0)}",
            "--local_addr=127.0.0.1",
            "--max_restarts=0",
            *([str(REPO / "tests/torchrun_pause.py")] if pause_at else ["-m", "transduce"]),
            "train",
            str(config),
            "--set",
            "train.loss_kernel='tensor'",  # no C++ build inside the nodes
            "--set",
            "train.dropout_kernel='tensor'",
            *extra,
        ]
        pause = {"TRANSDUCE_TEST_PAUSE_AT": str(pause_at), "TRANSDUCE_TEST_PAUSE_FILE": str(logs / f"{job}.paused")}
        with open(logs / f"{job}-{node}.log", "w") as out:
            nodes.append(
                subprocess.Popen(
                    cmd,
                    env={**env, **(pause if node == 1 and pause_at else {})},
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
    return nodes


def kill_node(agent: subprocess.Popen) -> None:
    """SIGKILL a torchrun agent and its training processes (each in a session of its own), like a machine
    that dies."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process just ended
            continue
        if int(fields[1]) == agent.pid:  # fields: state, ppid, ...
            children.append(int(stat.parent.name))
    for pid in [agent.pid, *children]:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    agent.wait()


def finish(nodes: list[subprocess.Popen], logs: Path, job: str, timeout: float = 180) -> str:
    """Wait for both nodes to succeed; return their output."""
    for node in nodes:
        node.wait(timeout=timeout)
    outs = [(logs / f"{job}-{i}.log").read_text() for i in range(2)]
    for node, out in zip(nodes, outs):
        assert node.returncode == 0, out[-3000:]
    return outs[0] + outs[1]


@pytest.mark.slow
def test_two_nodes_killed_and_resumed_end_like_an_uninterrupted_run(small_data, tmp_path):
    common = dict(max_steps=STEPS, save_every_steps=2, dtype="fp32", max_tokens=400)
    ref_cfg = write_config(tmp_path / "ref.toml", small_data, tmp_path / "ref", **common)
    kill_cfg = write_config(tmp_path / "kill.toml", small_data, tmp_path / "kill", **common)
    ports = free_ports(2)
    reference = launch(ref_cfg, ports[0], "ref", tmp_path)
    victim = launch(kill_cfg, ports[1], "kill", tmp_path, pause_at=KILL_AT)
    try:
        deadline = time.time() + 180
        while not (tmp_path / "kill.paused").is_file():
            assert time.time() < deadline and all(n.poll() is None for n in victim), "node 1 never paused"
            time.sleep(0.05)
        kill_node(victim[1])  # node 1 dies: its agent and its training process
        victim[0].wait(timeout=120)  # node 0 loses its peer: its collective fails, its agent gives up
        assert victim[0].returncode != 0
        assert "Connection closed by peer" in (tmp_path / "kill-0.log").read_text()
        done = list_checkpoints(tmp_path / "kill/checkpoints")
        assert [p.name for p in done][-1] == f"step_{KILL_AT:08d}"  # nothing after the kill point
        finish(reference, tmp_path, "ref")
    finally:
        for node in reference + victim:
            kill_node(node)
    out = finish(launch(kill_cfg, free_ports(1)[0], "resume", tmp_path, "--resume"), tmp_path, "resume")
    assert f"resumed from {tmp_path / 'kill/checkpoints'}/step_{KILL_AT:08d}" in out
    last = f"checkpoints/step_{STEPS:08d}"
    assert load_file(str(tmp_path / "ref" / last / "model.safetensors"))["src_embed.token.weight"].shape[0] == 120
    for name in ("model.safetensors", "optimizer.safetensors"):
        ref = load_file(str(tmp_path / "ref" / last / name))
        got = load_file(str(tmp_path / "kill" / last / name))
        assert ref.keys() == got.keys() and all(torch.equal(ref[k], got[k]) for k in ref), name
