"""Training on a slice of the shipped corpus (tests/data): the loss falls, a SIGKILLed run resumes bit-identically,
checkpoint averaging is the tensor mean, the run directory holds a loadable model directory."""

from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import REPO, train_in_process, write_config
from safetensors.torch import load_file

from transduce.cli import main as cli_main
from transduce.modeldir import load_model_dir
from transduce.train.average import average
from transduce.train.checkpoint import list_checkpoints


def metrics(run: Path, kind: str) -> list[dict]:
    import json

    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == kind]


@pytest.mark.slow
def test_loss_falls_within_seconds(data_dir, tmp_path):
    config = write_config(
        tmp_path / "c.toml",
        data_dir,
        tmp_path / "run",
        max_steps=24,
        save_every_steps=1000,
        validate_every=12,
        max_tokens=600,
    )
    start = time.perf_counter()
    train_in_process(config)
    seconds = time.perf_counter() - start
    train = metrics(tmp_path / "run", "train")
    first, last = sum(r["loss"] for r in train[:3]) / 3, sum(r["loss"] for r in train[-3:]) / 3
    assert last < first - 0.5 and last < math.log(500) - 0.5, (first, last)  # below a uniform guess
    valid = metrics(tmp_path / "run", "valid")
    assert len(valid) == 2 and valid[1]["valid_loss"] < valid[0]["valid_loss"]
    model, vocabs, meta = load_model_dir(tmp_path / "run" / "model")
    assert meta["src_lang"] == "en" and "best by valid_loss" in meta["weights"]
    assert seconds < 60


@pytest.mark.slow
def test_validation_scores_bleu_through_the_translator(data_dir, tmp_path):
    config = write_config(
        tmp_path / "c.toml",
        data_dir,
        tmp_path / "run",
        max_steps=4,
        validate_every=2,
        bleu_sentences=10,
        save_every_steps=1000,
    )
    train_in_process(config)
    valid = metrics(tmp_path / "run", "valid")
    assert len(valid) == 2 and all(0.0 <= r["valid_bleu"] <= 100.0 for r in valid)
    _, _, meta = load_model_dir(tmp_path / "run" / "model")
    assert "best by valid_bleu" in meta["weights"]


@pytest.mark.slow
def test_the_last_weights_are_validated_even_between_validations(data_dir, tmp_path):
    # A time-limited run ends wherever the clock says; its last updates must still compete for "best"
    # (a 60-minute Multi30k run validating every 4,000 updates otherwise returned step-12,000 weights
    # after 15,671 updates).
    config = write_config(
        tmp_path / "c.toml", data_dir, tmp_path / "run", max_steps=10, validate_every=4, save_every_steps=5
    )  # step 10 is saved as a regular checkpoint, then the run ends
    train_in_process(config)
    assert [r["step"] for r in metrics(tmp_path / "run", "valid")] == [4, 8, 10]


@pytest.mark.slow
def test_linear_schedule_decays_to_zero_at_the_end_of_the_step_budget(data_dir, tmp_path):
    config = write_config(
        tmp_path / "c.toml",
        data_dir,
        tmp_path / "run",
        schedule="linear",
        warmup=2,
        max_steps=10,
        save_every_steps=1000,
    )
    train_in_process(config)
    lrs = [r["lr"] for r in metrics(tmp_path / "run", "train")]
    assert lrs[:2] == pytest.approx([1.5e-3, 3e-3 * 0.9])  # warm-up, then peak × (1 − 1/10) at update 2
    assert lrs[-1] == pytest.approx(3e-3 * 0.1) and all(a > b for a, b in zip(lrs[1:], lrs[2:]))


@pytest.mark.slow
def test_sigkill_and_resume_is_bit_identical(data_dir, tmp_path):
    reference = write_config(tmp_path / "ref.toml", data_dir, tmp_path / "ref")
    train_in_process(reference)
    config = write_config(tmp_path / "kill.toml", data_dir, tmp_path / "kill")
    cmd = [sys.executable, "-m", "transduce", "train", str(config)]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 600  # against a hang; the first run may build the C++ kernels under load
        while not list_checkpoints(tmp_path / "kill" / "checkpoints") and proc.poll() is None:
            assert time.time() < deadline, "no checkpoint appeared"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()
    done = list_checkpoints(tmp_path / "kill" / "checkpoints")
    assert done and int(done[-1].name.split("_")[1]) < 8  # killed before the end
    resumed = subprocess.run(cmd + ["--resume"], env=env, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stdout
    for name in ("model.safetensors", "optimizer.safetensors"):
        ref = load_file(str(tmp_path / "ref/checkpoints/step_00000008" / name))
        got = load_file(str(tmp_path / "kill/checkpoints/step_00000008" / name))
        assert ref.keys() == got.keys()
        assert all(torch.equal(ref[k], got[k]) for k in ref), name
    # the final model directories hold the same tensors (the files' bytes can differ: safetensors writes
    # its map of tied names in set order, which depends on each process's PYTHONHASHSEED)
    ref, got = (load_file(str(tmp_path / run / "model/model.safetensors")) for run in ("ref", "kill"))
    assert ref.keys() == got.keys() and all(torch.equal(ref[k], got[k]) for k in ref)


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_and_exits_cleanly(data_dir, tmp_path):
    config = write_config(tmp_path / "c.toml", data_dir, tmp_path / "run", max_steps=10_000, save_every_steps=3)
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "transduce", "train", str(config)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 600  # a guard against a hang, as above
    while not list_checkpoints(tmp_path / "run" / "checkpoints") and proc.poll() is None:
        assert time.time() < deadline, "no checkpoint appeared"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "SIGTERM received" in out
    line = next(x for x in out.splitlines() if x.startswith("fast paths: "))  # one line says what runs
    assert (
        "attention=" in line
        and "; loss=" in line
        and "; dropout=" in line
        and "; residual=" in line
        and "; allocator=" in line
    )
    last = list_checkpoints(tmp_path / "run" / "checkpoints")[-1]
    stopped_at = int(last.name.split("_")[1])
    assert 3 <= stopped_at < 10_000 and f"stopped at step {stopped_at}" in out
    assert (tmp_path / "run" / "model" / "model.safetensors").is_file()


@pytest.mark.slow
def test_existing_run_needs_resume_and_resume_continues(data_dir, tmp_path):
    config = write_config(tmp_path / "c.toml", data_dir, tmp_path / "run", max_steps=2)
    train_in_process(config)
    rc = cli_main(["train", str(config)])
    assert rc == 2
    trainer = train_in_process(config, resume=True, overrides=["max_steps=4"])
    assert trainer.step == 4
    assert [p.name for p in list_checkpoints(tmp_path / "run/checkpoints")] == ["step_00000002", "step_00000004"]


@pytest.mark.slow
def test_average_is_the_tensor_mean_and_keep_last_prunes(data_dir, tmp_path):
    config = write_config(tmp_path / "c.toml", data_dir, tmp_path / "run", max_steps=8, save_every_steps=1, keep_last=3)
    train_in_process(config)
    found = list_checkpoints(tmp_path / "run/checkpoints")
    assert [p.name for p in found] == ["step_00000006", "step_00000007", "step_00000008"]
    out = average(tmp_path / "run", 3, tmp_path / "avg")
    tensors = [load_file(str(p / "model.safetensors")) for p in found]
    averaged = load_file(str(out / "model.safetensors"))
    for name, value in tensors[0].items():
        mean = torch.stack([t[name].double() for t in tensors]).mean(0).float()
        assert torch.equal(averaged[name], mean), name
    model, _, meta = load_model_dir(out)
    assert meta["averaged"] == '["step_00000006", "step_00000007", "step_00000008"]' or meta["averaged"]
    with pytest.raises(ValueError, match="only 3 checkpoints"):
        average(tmp_path / "run", 4, tmp_path / "avg2")


@pytest.mark.slow
def test_nonfinite_losses_skip_updates_then_stop_with_a_message(data_dir, tmp_path, monkeypatch):
    from transduce.train import loss as loss_module

    real = loss_module.ProjectedSmoothedCrossEntropy

    class NaNLoss:
        @staticmethod
        def apply(*args):
            loss, nll = real.apply(*args)
            return loss * float("nan"), nll

    monkeypatch.setattr(loss_module, "ProjectedSmoothedCrossEntropy", NaNLoss)  # what SmoothedLoss calls
    config = write_config(tmp_path / "c.toml", data_dir, tmp_path / "run", max_nonfinite=3)
    from transduce.train.trainer import TrainingStopped

    with pytest.raises(TrainingStopped, match="not finite for 3 updates in a row"):
        train_in_process(config)
    assert [r["in_a_row"] for r in metrics(tmp_path / "run", "nonfinite")] == [1, 2, 3]


@pytest.mark.slow
def test_resume_refuses_a_changed_model_config(data_dir, tmp_path, capsys):
    config = write_config(tmp_path / "c.toml", data_dir, tmp_path / "run", max_steps=2)
    train_in_process(config)
    assert cli_main(["train", str(config), "--resume", "--set", "model.d_ff=128"]) == 2
    err = capsys.readouterr().err
    assert "d_ff = 128 (checkpoint: 256)" in err and "step_00000002" in err


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler for int8-native")
def test_a_trained_or_averaged_model_decodes_on_the_fast_path_by_default(data_dir, tmp_path, capsys):
    """train and average measure the backends on this machine and record them (backends.json), so that
    transduce.load picks int8-native with no other command where it is accurate and measured faster, and the
    fp32 C++ step otherwise."""
    import json

    from transduce.api import load
    from transduce.backends.record import RECORD, speed_here

    config = write_config(tmp_path / "c.toml", data_dir, tmp_path / "run", max_steps=8, check_backends=24)
    train_in_process(config)
    model = tmp_path / "run" / "model"
    record = json.loads((model / RECORD).read_text())
    speed = speed_here(record)
    assert record["sentences"] == 24 and record["command"] == "transduce train (train.check_backends = 24)"
    assert speed["int8-native"] > speed["fp32"], speed  # the C++ int8 step is the faster one on this CPU
    chosen = load(model).fast_paths.decoder
    # int8 where accurate and faster than the fp32 C++ step (a model this small may not be), else fp32 in C++
    vouched = record["delta"] >= -0.3 and speed["int8-native"] > speed["fp32-native"]
    want = "int8-native" if vouched else "fp32-native"
    assert chosen.name == want, chosen
    shown = capsys.readouterr()
    assert "decoding backends: bleu fp32" in shown.out + shown.err
    assert cli_main(["average", str(tmp_path / "run"), "--last", "2", "--out", str(tmp_path / "avg"),
                     "--check-backends", "12"]) == 0  # fmt: skip
    assert "decoding backends: bleu fp32" in capsys.readouterr().out
    averaged = json.loads((tmp_path / "avg" / RECORD).read_text())
    assert averaged["sentences"] == 12 and speed_here(averaged) is not None
