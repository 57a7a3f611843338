"""Late dropout (train.dropout_from, train/dropout.py's LateDropout): off for the budget's first share, then at
the model's rates; the switch is a function of progress, so a resumed run switches at the same update."""

from __future__ import annotations

import shutil

import pytest
import torch
from conftest import train_in_process, write_config
from safetensors.torch import load_file

from transduce.config import ConfigError
from transduce.model import ModelConfig, Transformer
from transduce.train.config import load_config
from transduce.train.dropout import FastDropout, LateDropout, use_fast_dropout


def test_late_dropout_sets_every_rate_to_zero_before_its_start_and_back_after():
    torch.manual_seed(0)
    cfg = ModelConfig.preset("tiny", vocab_size=50, dropout=0.3, attention_dropout=0.2, activation_dropout=0.1)
    model = Transformer(cfg)
    use_fast_dropout(model)
    late = LateDropout(model, start=0.5)
    assert sorted({rate for *_, rate in late.rates}) == [0.1, 0.2, 0.3]
    src, tgt = torch.randint(3, 50, (2, 7)), torch.randint(3, 50, (2, 6))

    def forward(train: bool) -> torch.Tensor:
        model.train(train)
        with torch.no_grad():
            return model(src, tgt)

    assert late(0.0) is False and late(0.49) is False  # off: training's forward is evaluation's
    assert all(getattr(m, name) == 0.0 for m, name, _ in late.rates)
    assert torch.equal(forward(True), forward(False))
    assert late(0.5) is True and late(0.9) is False  # on once, at the start
    assert [getattr(m, name) for m, name, _ in late.rates] == [rate for *_, rate in late.rates]
    assert any(isinstance(m, FastDropout) and m.p == 0.3 for m in model.modules())
    assert not torch.equal(forward(True), forward(False))


def test_dropout_from_is_checked(data_dir, tmp_path):
    config = write_config(tmp_path / "c.toml", data_dir, tmp_path / "run")
    for bad in ("dropout_from=1.0", "dropout_from=-0.1"):
        with pytest.raises(ConfigError, match="dropout_from"):
            load_config(config, [bad])
    with pytest.raises(ValueError, match="dropout_from.*no dropout to turn on"):
        train_in_process(config, overrides=["dropout_from=0.5", "model.dropout=0"])


@pytest.mark.slow
def test_a_late_dropout_run_starts_as_one_without_dropout_and_resumes_bit_identically(data_dir, tmp_path, capsys):
    weights = "checkpoints/step_{:08d}/model.safetensors"
    late = dict(dropout_from=0.5)  # of 8 updates: off for updates 1-4 (progress 0/8 .. 3/8), on from update 5

    def run(name: str, *overrides: str, max_steps: int = 8, resume: bool = False, **train) -> None:
        config = tmp_path / f"{name}.toml"
        if not resume:
            write_config(config, data_dir, tmp_path / name, max_steps=max_steps, **train)
        train_in_process(config, resume=resume, overrides=["model.dropout=0.3", *overrides])

    run("late", **late)
    assert "dropout on from update 5 (train.dropout_from = 0.5)" in capsys.readouterr().out
    run("none", "model.dropout=0")
    # the same run stopped after update 4's checkpoint (what a kill leaves), then --resume to eight
    shutil.copytree(tmp_path / "late", tmp_path / "cut")
    for later in (6, 8):
        shutil.rmtree(tmp_path / "cut" / weights.format(later).rsplit("/", 1)[0])
    write_config(tmp_path / "cut.toml", data_dir, tmp_path / "cut", max_steps=8, **late)
    run("cut", resume=True)
    assert "dropout on from update 5" in capsys.readouterr().out

    def same(a: str, b: str, step: int) -> bool:
        x, y = (load_file(str(tmp_path / run / weights.format(step))) for run in (a, b))
        return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)

    assert same("late", "none", 4)  # the first half: no dropout, no random draws
    assert not same("late", "none", 6)
    assert same("late", "cut", 8)
