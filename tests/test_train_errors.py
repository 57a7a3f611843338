"""Every error before training starts names the file, key or path at fault."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import write_config

from transduce.cli import main as cli_main
from transduce.config import ConfigError
from transduce.train.cli import preflight
from transduce.train.config import TrainConfig, load_config


def error_of(capsys, *argv) -> str:
    assert cli_main(["train", *map(str, argv)]) == 2
    return capsys.readouterr().err


def test_unknown_train_key_is_named_with_a_suggestion(tmp_path, capsys):
    path = tmp_path / "c.toml"
    path.write_text('[train]\ndata = "d"\nout = "o"\nmax_token = 10\n')
    err = error_of(capsys, path)
    assert "c.toml [train]" in err and "'max_token'" in err and "did you mean 'max_tokens'" in err


def test_unknown_override_and_bad_values_are_named(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[train]\ndata = "d"\nout = "o"\n[model]\npreset = "tiny"\n')
    with pytest.raises(ConfigError, match="'warmpu'.*did you mean 'warmup'"):
        load_config(path, ["warmpu=10"])
    with pytest.raises(ConfigError, match="key 'dtype' must be one of"):
        load_config(path, ["dtype=fp8"])
    with pytest.raises(ConfigError, match="key 'update_freq': must be at least 1"):
        load_config(path, ["update_freq=0"])
    with pytest.raises(ConfigError, match="key 'adam_betas'"):
        load_config(path, ["adam_betas=[0.9]"])
    with pytest.raises(ConfigError, match=r"key 'rdrop_alpha': must be non-negative \(0 = off\), got -1.0"):
        load_config(path, ["rdrop_alpha=-1.0"])
    with pytest.raises(ConfigError, match="unknown key 'subword_dropout'"):  # a technique that left stays unknown
        load_config(path, ["subword_dropout=0.1"])
    cfg, model = load_config(path, ["max_steps=7", "model.dropout=0.2"])
    assert cfg.max_steps == 7 and model == {"preset": "tiny", "dropout": 0.2}
    path.write_text('[train]\ndata = "d"\nout = "o"\n[optim]\nlr = 1\n')
    with pytest.raises(ConfigError, match=r"unknown table \[optim\]"):
        load_config(path)


def test_paper_defaults():
    cfg = TrainConfig(data="d", out="o")
    assert (cfg.adam_betas, cfg.adam_eps, cfg.schedule, cfg.warmup) == ([0.9, 0.98], 1e-9, "rsqrt", 4000)


def test_missing_data_directory_is_named(tmp_path, capsys):
    config = write_config(tmp_path / "c.toml", tmp_path / "nowhere", tmp_path / "run")
    err = error_of(capsys, config)
    assert "key 'data'" in err and str(tmp_path / "nowhere") in err


def test_vocabulary_that_does_not_match_the_config_is_named(data_dir, tmp_path, capsys):
    config = write_config(tmp_path / "c.toml", data_dir, tmp_path / "run")
    err = error_of(capsys, config, "--set", "model.vocab_size=8000")
    assert "'vocab_size' = 8000" in err and "500" in err and "[model]" in err
    err = error_of(capsys, config, "--set", 'model.tie_embeddings="all"', "--set", "model.tgt_vocab_size=400")
    assert "tgt_vocab_size" in err


def test_unwritable_output_directory_is_named(data_dir, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    config = write_config(tmp_path / "c.toml", data_dir, blocker / "run")
    err = error_of(capsys, config)
    assert "key 'out'" in err and str(blocker / "run") in err


def test_missing_model_key_and_bad_preset_are_named(data_dir, tmp_path, capsys):
    config = write_config(tmp_path / "c.toml", data_dir, tmp_path / "run")
    err = error_of(capsys, config, "--set", "model.d_modle=64")
    assert "'d_modle'" in err and "did you mean 'd_model'" in err


def test_fp16_without_cuda_is_refused(data_dir, tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA present: fp16 is allowed")
    config = write_config(tmp_path / "c.toml", data_dir, tmp_path / "run")
    err = error_of(capsys, config, "--set", 'dtype="fp16"')
    assert "key 'dtype'" in err and "CUDA" in err


def test_preflight_returns_vocab_sizes_from_the_data(data_dir, tmp_path):
    config = write_config(tmp_path / "c.toml", data_dir, tmp_path / "run")
    cfg, model_cfg, data = preflight(Path(config), [], resume=False)
    assert model_cfg.vocab_size == len(data.vocabs.src) == 500 and model_cfg.d_model == 64


def test_a_checkpoint_older_than_a_model_key_resumes_with_its_default():
    """A checkpoint written before a [model] key existed was built with that key's default: resuming it with
    the default is no change, with another value it is one, named with the checkpoint's (default) value."""
    from transduce.model import ModelConfig
    from transduce.train.trainer import config_changes

    current = ModelConfig.preset("tiny", vocab_size=60)
    saved = current.to_dict()
    del saved["source_eos"]  # as a checkpoint written before the key
    assert config_changes(current, saved) == {}
    without = ModelConfig.preset("tiny", vocab_size=60, source_eos=False)
    assert config_changes(without, saved) == {"source_eos": (False, True)}
    assert config_changes(ModelConfig.preset("tiny", vocab_size=60, d_model=32), saved)["d_model"][0] == 32
