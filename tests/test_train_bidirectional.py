"""BiT (train.bidirectional): the doubled split holds every pair both ways, the run switches to
source→target at the first epoch that starts past the fraction, and a resumed run makes the same choice."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from conftest import read_multi30k
from test_train_run import train_in_process, write_config
from transduce.cli import main as cli_main
from transduce.config import ConfigError
from transduce.data import PreparedData
from transduce.data.batching import TokenBatches
from transduce.data.bidirectional import BothDirections
from transduce.modeldir import read_model_config
from transduce.train.config import load_config

PAIRS = 200


def prepare(root: Path, *flags: str) -> Path:
    for lang in ("en", "de"):
        (root / f"train.{lang}").write_text("\n".join(read_multi30k("train", lang, PAIRS)) + "\n")
    assert cli_main(["prepare", "files", "--src-file", str(root / "train.en"), "--tgt-file", str(root / "train.de"),
                     "--src-lang", "en", "--tgt-lang", "de", "--vocab-size", "300", "--out", str(root / "data"),
                     *flags]) == 0
    return root / "data"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return prepare(tmp_path_factory.mktemp("bit"))


def test_the_doubled_split_holds_every_pair_forward_then_reversed(data_dir):
    split = PreparedData.open(data_dir).split("train")
    both = BothDirections(split)
    n = len(split)
    assert len(both) == 2 * n and both.name == "train+reversed"
    for i in (0, 1, n // 2, n - 1):
        assert both.src[i].tolist() == split.src[i].tolist() and both.tgt[i].tolist() == split.tgt[i].tolist()
        assert both.src[n + i].tolist() == split.tgt[i].tolist() and both.tgt[n + i].tolist() == split.src[i].tolist()
        assert not both.reversed(i) and both.reversed(n + i)
    batches = TokenBatches(both, max_tokens=600, seed=3)  # an epoch covers each of the 2N pairs once
    seen = np.sort(np.concatenate([b.index.numpy() for b in batches.epoch(1)]))
    assert seen.tolist() == list(range(2 * n))


@pytest.mark.parametrize("override, message", [
    ("bidirectional=1.0", "must be a fraction of the budget"),
    ("bidirectional=-0.1", "must be a fraction of the budget"),
    ("subword_dropout=0.1", "does not combine with subword_dropout"),
])
def test_config_rejects_impossible_fractions_and_bpe_dropout(data_dir, tmp_path, override, message):
    config = write_config(tmp_path / "c.toml", data_dir, tmp_path / "run", bidirectional=0.3)
    with pytest.raises(ConfigError, match=f"'bidirectional'.*{message}"):
        load_config(config, [override])


def test_separate_vocabularies_are_refused_naming_the_key(tmp_path):
    data = prepare(tmp_path, "--separate-vocab")
    config = write_config(tmp_path / "c.toml", data, tmp_path / "run", bidirectional=0.3)
    with pytest.raises(ConfigError, match="'bidirectional'.*separate source and target vocabularies"):
        train_in_process(config)


def test_first_epochs_run_both_ways_then_forward_and_resume_agrees(data_dir, tmp_path, capsys):
    straight = write_config(tmp_path / "a.toml", data_dir, tmp_path / "a", bidirectional=0.25, max_steps=40,
                            max_tokens=600, save_every_steps=1000)
    trainer = train_in_process(straight)
    out = "".join(capsys.readouterr())
    forward = len(trainer.forward_batches)
    assert len(trainer.both_batches) >= 2 * forward - 1  # the doubled split: twice the batches per epoch
    assert trainer.both_epochs == 1 and trainer.epoch >= 2 and trainer.batches is trainer.forward_batches
    assert "epoch 1 (update 0, 0.0% of the budget): both directions, 400 pairs" in out
    assert "epoch 2 (update" in out and "source -> target only from here, 200 pairs" in out
    # the weights at the switch are kept as a target->source model (the recipe's channel model)
    switch = int(out.split("epoch 2 (update ")[1].split(",")[0])
    assert f"update {switch}: saved the model at BiT's switch" in out
    config, meta = read_model_config(tmp_path / "a" / "bit-model")
    assert (meta["src_lang"], meta["tgt_lang"], meta["steps"]) == ("de", "en", switch)
    # stopped inside the both-ways epoch but past the fraction (update 14 of 40), then resumed to the same end:
    # the checkpoint's both_epochs keeps epoch 1 both ways, so the same batches and weights
    split = write_config(tmp_path / "b.toml", data_dir, tmp_path / "b", bidirectional=0.25, max_steps=14,
                         max_tokens=600, save_every_steps=1000)
    train_in_process(split)
    resumed = train_in_process(split, resume=True, overrides=["max_steps=40"])
    assert resumed.both_epochs == 1
    ref, got = (load_file(str(tmp_path / run / "checkpoints/step_00000040/model.safetensors")) for run in "ab")
    assert all(torch.equal(ref[k], got[k]) for k in ref)


def test_off_by_default_the_run_never_sees_a_reversed_pair(data_dir, tmp_path, capsys):
    trainer = train_in_process(write_config(tmp_path / "c.toml", data_dir, tmp_path / "run", max_steps=3))
    assert trainer.both_batches is None and trainer.both_epochs == 0
    assert not (tmp_path / "run" / "bit-model").exists()
    assert "both directions" not in "".join(capsys.readouterr())
