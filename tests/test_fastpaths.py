"""The fast paths are chosen in one place, from the config, the hardware and the model's accuracy record."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys

import pytest
import torch

from transduce.backends import policy, requested_backend
from transduce.backends import record as record_
from transduce.backends.options import add_backend_arguments, backend_from_args
from transduce.backends.policy import decoder_backend
from transduce.config import ConfigError, build
from transduce.fastpaths import Choice, FastPaths
from transduce.train.config import TrainConfig
from transduce.train.kernels import for_training

CPU = torch.device("cpu")


@pytest.mark.slow
def test_importing_transduce_changes_nothing_in_the_process():
    code = (
        "import os, sys; before = dict(os.environ); import transduce, transduce.api, transduce.fastpaths, transduce.backends; "
        "assert dict(os.environ) == before, set(os.environ) ^ set(before); "
        "assert 'torch.utils.cpp_extension' not in sys.modules or True"
    )
    env = {k: v for k, v in __import__("os").environ.items() if k != "MKL_CBWR"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


def test_training_commands_keep_more_onednn_primitives_and_say_so(monkeypatch, capsys):
    """``transduce train``/``recipe``/``demo`` raise oneDNN's primitive cache before torch runs a matmul (a value
    the user set is kept), other commands leave it alone; a bf16 CPU run's fast-path line reports it."""
    import os

    from transduce import cli

    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    assert cli.main(["translate", "--model", "/nonexistent", "/nonexistent"]) == 2
    assert "ONEDNN_PRIMITIVE_CACHE_CAPACITY" not in os.environ
    with pytest.raises(SystemExit):  # argparse: no config given, after the environment was set
        cli.main(["train"])
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == cli.ONEDNN_CACHE
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "77")
    with pytest.raises(SystemExit):
        cli.main(["demo", "--no-such-option"])
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "77"
    capsys.readouterr()
    line = for_training(build(TrainConfig, {"data": "d", "out": "o", "dtype": "bf16"}), CPU).line()
    assert "onednn_cache=77 (" in line
    assert for_training(build(TrainConfig, {"data": "d", "out": "o", "dtype": "fp32"}), CPU).onednn_cache is None


def test_the_log_line_names_each_part_and_why():
    fast = FastPaths(loss=Choice("native", "C++ loss on CPU"), decoder=Choice("fp32", "asked for"))
    assert fast.line() == "fast paths: loss=native (C++ loss on CPU); decoder=fp32 (asked for)"
    with pytest.raises(AttributeError):
        fast.loss = Choice("tensor", "")  # frozen: chosen once


def test_requested_backend_from_names_and_from_dtype_native():
    assert requested_backend() == "auto"
    assert requested_backend("auto", "int8", True) == "int8-native"
    assert requested_backend("auto", None, True) == "fp32-native"
    assert requested_backend("auto", "bf16") == "bf16"
    with pytest.raises(ValueError, match="not both"):
        requested_backend("fp32", "int8")
    with pytest.raises(ValueError, match="int4"):
        requested_backend("int4")


def test_cli_options_exact_and_conflicts():
    p = argparse.ArgumentParser()
    add_backend_arguments(p)
    assert backend_from_args(p.parse_args([])) == "auto"
    assert backend_from_args(p.parse_args(["--exact"])) == "fp32"
    assert backend_from_args(p.parse_args(["--dtype", "int8", "--native"])) == "int8-native"
    assert backend_from_args(p.parse_args(["--backend", "fp32-native"])) == "fp32-native"
    with pytest.raises(ValueError, match="--exact"):
        backend_from_args(p.parse_args(["--exact", "--backend", "int8-native"]))


def _record(model_dir, delta: float, digest: str | None = None, speed: dict | None = None) -> None:
    """A record; ``speed``: words/s of fp32 and int8-native on this machine (default: int8 3x faster)."""
    here = {"words_per_s": speed or {"fp32": 100.0, "int8-native": 300.0}, "threads": 1}
    record = {
        "candidate": "int8-native",
        "metric": "bleu",
        "delta": delta,
        "data": "d valid",
        "sentences": 10,
        "scores": {},
        "weights_sha256": digest or record_.weights_digest(model_dir),
        "speed": {record_.machine(): here, "Some Other CPU (avx512vnni)": here},
    }
    (model_dir / record_.RECORD).write_text(json.dumps(record))


@pytest.fixture
def model_dir(tiny_model_dir, tmp_path):
    target = tmp_path / "model"
    shutil.copytree(tiny_model_dir, target)
    return target


@pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler for the C++ step")
def test_auto_stays_on_fp32_arithmetic_without_a_record_and_says_why(model_dir):
    """No record: fp32 arithmetic, in the C++ loop step (fp32-native) where it builds; --backend fp32 is the
    Python step."""
    from transduce.api import load
    from transduce.backends.native import NativeStep

    translator = load(model_dir)
    choice = translator.fast_paths.decoder
    assert choice.name == "fp32-native" and "no accuracy record" in choice.why and "check-backends" in choice.why
    assert isinstance(translator.model, NativeStep) and translator.model.maps == "fp32"
    assert type(load(model_dir, backend="fp32").model).__name__ == "Transformer"


def test_auto_follows_the_record(model_dir, monkeypatch):
    from transduce.backends import native

    model = torch.nn.Linear(1, 1)  # the C++ step "covers" it below: only the record decides
    monkeypatch.setattr(native, "supports", lambda m: None)
    monkeypatch.setattr(native, "extension", lambda: object())
    _record(model_dir, -0.5)
    choice = decoder_backend(model, model_dir, CPU)
    assert choice.name == "fp32-native" and "0.50 BLEU below" in choice.why and "--backend fp32" in choice.why
    _record(model_dir, -0.1, digest="0" * 64)
    assert "other weights" in decoder_backend(model, model_dir, CPU).why
    (model_dir / record_.RECORD).write_text("{not json")
    assert "not a valid record" in decoder_backend(model, model_dir, CPU).why
    _record(model_dir, -0.1)
    choice = decoder_backend(model, model_dir, CPU)
    assert choice.name == "int8-native" and "-0.10 BLEU" in choice.why and "3.0x fp32's speed" in choice.why
    assert decoder_backend(model, model_dir, torch.device("cuda")).name == "fp32"
    assert decoder_backend(model, model_dir, CPU, ensemble=True).name == "fp32"
    assert decoder_backend(model, model_dir, CPU, "bf16") == Choice("bf16", "asked for")
    monkeypatch.setattr(native, "extension", lambda: None)
    choice = decoder_backend(model, model_dir, CPU)
    assert choice.name == "fp32" and "could not be built" in choice.why
    monkeypatch.setattr(native, "supports", lambda m: "additive attention")
    choice = decoder_backend(model, model_dir, CPU)
    assert choice.name == "fp32" and "does not cover this model (additive attention)" in choice.why


@pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler for int8-native")
def test_check_backends_writes_a_record_that_load_then_uses(model_dir, capsys):
    from transduce.api import load
    from transduce.backends.native import NativeStep
    from transduce.cli import main

    src, ref = model_dir.parent / "v.en", model_dir.parent / "v.de"
    src.write_text("A dog runs.\nTwo men sit on a bench.\nA girl in a red coat.\n")
    ref.write_text("Ein Hund rennt.\nZwei Männer sitzen auf einer Bank.\nEin Mädchen in einem roten Mantel.\n")
    assert main(["check-backends", str(model_dir), "--src", str(src), "--ref", str(ref), "--lang", "de"]) == 0
    assert "fp32" in capsys.readouterr().out
    record = json.loads((model_dir / record_.RECORD).read_text())
    assert record["sentences"] == 3 and set(record["scores"]) == {"fp32", "int8-native"}
    assert record["delta"] == round(record["scores"]["int8-native"]["bleu"] - record["scores"]["fp32"]["bleu"], 2)
    speed = record_.speed_here(record)
    assert set(speed) == {"fp32", "fp32-native", "int8-native"} and all(v > 0 for v in speed.values())
    translator = load(model_dir)
    if record["delta"] >= -policy.TOLERANCE and speed["int8-native"] > speed["fp32-native"]:
        assert translator.fast_paths.decoder.name == "int8-native" and isinstance(translator.model, NativeStep)
    else:
        assert translator.fast_paths.decoder.name == "fp32-native"
    assert load(model_dir, backend="fp32").fast_paths.decoder.name == "fp32"
    # on another machine: its speed is added beside this one's, the accuracy kept, no references needed
    record["speed"] = {"Another CPU (scalar)": record["speed"][record_.machine()]}
    (model_dir / record_.RECORD).write_text(json.dumps(record))
    assert load(model_dir).fast_paths.decoder.name == "fp32-native"
    assert main(["check-backends", str(model_dir), "--src", str(src), "--speed-only", "--count", "2"]) == 0
    again = json.loads((model_dir / record_.RECORD).read_text())
    assert set(again["speed"]) == {"Another CPU (scalar)", record_.machine()}
    assert again["scores"] == record["scores"] and again["speed"][record_.machine()]["sentences"] == 2


def test_training_kernels_from_the_config(monkeypatch):
    from transduce.train import dropout, native, native_loss

    cfg = build(TrainConfig, {"data": "d", "out": "o"})
    monkeypatch.setattr(native_loss, "extension", lambda: object())
    monkeypatch.setattr(dropout, "extension", lambda: object())
    monkeypatch.setattr(native, "extension", lambda: object())
    fast = for_training(cfg, CPU)
    assert (fast.attention.name, fast.loss.name, fast.dropout.name) == ("written", "native", "native")
    assert fast.residual.name == "native"  # post-norm's connection draws the C++ dropout's mask
    assert fast.allocator.name in ("malloc", "jemalloc") and fast.decoder is None
    cfg = build(
        TrainConfig,
        {"data": "d", "out": "o", "loss_kernel": "tensor", "fast_dropout": False, "attention_kernel": "math"},
    )
    fast = for_training(cfg, CPU)
    assert (fast.attention.name, fast.loss.name, fast.dropout.name) == ("math", "tensor", "torch")
    assert fast.residual.name == "tensor"
    monkeypatch.setattr(native_loss, "extension", lambda: None)
    assert for_training(build(TrainConfig, {"data": "d", "out": "o"}), CPU).loss.name == "tensor"
    with pytest.raises(ConfigError, match="loss_kernel"):
        for_training(build(TrainConfig, {"data": "d", "out": "o", "loss_kernel": "native"}), CPU)
    with pytest.raises(ConfigError, match="dropout_kernel"):
        build(TrainConfig, {"data": "d", "out": "o", "dropout_kernel": "fast"})


def test_muons_dtype_follows_the_runs_unless_the_config_names_one():
    def muon(**keys):
        choice = for_training(build(TrainConfig, {"data": "d", "out": "o", **keys}), CPU).muon
        return choice and choice.name

    assert muon() is None and muon(muon_dtype="bf16") is None  # Adam: nothing to choose
    assert muon(optimizer="muon", dtype="bf16") == "bf16"
    assert muon(optimizer="muon", dtype="fp32") == "fp32"  # an fp32 run's CPU may emulate bf16
    assert muon(optimizer="muon", dtype="fp32", muon_dtype="bf16") == "bf16"
    assert muon(optimizer="muon", dtype="bf16", muon_dtype="fp32") == "fp32"
    assert (
        "muon=bf16 (auto in a bf16 run"
        in for_training(build(TrainConfig, {"data": "d", "out": "o", "optimizer": "muon", "dtype": "bf16"}), CPU).line()
    )
    with pytest.raises(ConfigError, match="muon_dtype"):
        build(TrainConfig, {"data": "d", "out": "o", "muon_dtype": "fp16"})


def test_auto_never_picks_a_backend_measured_slower_here(model_dir, monkeypatch):
    """Speed counts only as measured on this machine: slower or unmeasured here, auto stays on fp32 arithmetic."""
    from transduce.backends import native

    model = torch.nn.Linear(1, 1)
    monkeypatch.setattr(native, "supports", lambda m: None)
    monkeypatch.setattr(native, "extension", lambda: object())
    _record(model_dir, 0.0, speed={"fp32": 300.0, "int8-native": 250.0})  # a CPU where the C++ step loses
    choice = decoder_backend(model, model_dir, CPU)
    assert choice.name == "fp32-native" and "0.83x fp32's speed on this machine, not faster" in choice.why
    # int8 must beat what auto runs otherwise, fp32-native, where the record timed it
    _record(model_dir, 0.0, speed={"fp32": 100.0, "fp32-native": 400.0, "int8-native": 300.0})
    choice = decoder_backend(model, model_dir, CPU)
    assert choice.name == "fp32-native" and "0.75x fp32-native's speed on this machine" in choice.why
    _record(model_dir, 0.0, speed={"fp32": 100.0, "fp32-native": 200.0, "int8-native": 300.0})
    choice = decoder_backend(model, model_dir, CPU)
    assert choice.name == "int8-native" and "1.5x fp32-native's speed" in choice.why
    record = json.loads((model_dir / record_.RECORD).read_text())
    record["speed"] = {"Some Other CPU (avx512vnni)": record["speed"]["Some Other CPU (avx512vnni)"]}
    (model_dir / record_.RECORD).write_text(json.dumps(record))
    choice = decoder_backend(model, model_dir, CPU)
    assert choice.name == "fp32-native" and f"not measured on this machine ({record_.machine()})" in choice.why
    assert "--speed-only" in choice.why
