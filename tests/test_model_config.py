"""ModelConfig: Table 3 presets, TOML round trip, and errors that name the key."""

import pytest

from transduce import ConfigError, ModelConfig


def test_paper_presets_match_table_3():
    base = ModelConfig.preset("paper-base")
    assert (base.encoder_layers, base.decoder_layers, base.d_model, base.d_ff, base.n_heads) == (6, 6, 512, 2048, 8)
    assert (base.dropout, base.label_smoothing) == (0.1, 0.1)
    big = ModelConfig.preset("paper-big")
    assert (big.encoder_layers, big.decoder_layers, big.d_model, big.d_ff, big.n_heads) == (6, 6, 1024, 4096, 16)
    assert (big.dropout, big.label_smoothing) == (0.3, 0.1)
    for cfg in (base, big):  # the paper's choices elsewhere
        assert cfg.norm == "post" and cfg.positions == "sinusoidal" and cfg.tie_embeddings == "all"
        assert cfg.attention == "scaled_dot" and cfg.attention_dropout == 0.0 and cfg.scale_embeddings


def test_preset_overrides_and_fields():
    cfg = ModelConfig.preset("tiny", vocab_size=1234, pad_id=0)
    assert cfg.vocab_size == 1234 and cfg.pad_id == 0 and cfg.d_model == 64


def test_toml_round_trip(tmp_path):
    cfg = ModelConfig.preset(
        "small", vocab_size=900, norm="pre", attention_window=5, tie_embeddings="target", tgt_vocab_size=800
    )
    path = tmp_path / "m.toml"
    path.write_text(cfg.to_toml())
    assert ModelConfig.from_toml(path) == cfg


def test_toml_with_preset_key(tmp_path):
    path = tmp_path / "m.toml"
    path.write_text('[model]\npreset = "tiny"\nvocab_size = 500\ndropout = 0.2\n')
    cfg = ModelConfig.from_toml(path)
    assert cfg.d_model == 64 and cfg.vocab_size == 500 and cfg.dropout == 0.2


@pytest.mark.parametrize(
    "overrides, key",
    [
        (dict(d_modle=64), "d_modle"),  # unknown key
        (dict(d_model="64"), "d_model"),  # wrong type
        (dict(n_heads=2.0), "n_heads"),  # float where int expected
        (dict(d_model=66, n_heads=4), "d_model"),  # not divisible
        (dict(dropout=1.0), "dropout"),
        (dict(dropout=-0.1), "dropout"),
        (dict(label_smoothing=1.5), "label_smoothing"),
        (dict(attention_window=0), "attention_window"),  # r < 1
        (dict(norm="middle"), "norm"),
        (dict(activation="tanh"), "activation"),
        (dict(output_bias="yes"), "output_bias"),  # a bool
        (dict(tie_embeddings="all", tgt_vocab_size=77), "tie_embeddings"),
        (dict(encoder_layers=0), "encoder_layers"),
        (dict(pad_id=5000), "pad_id"),
        (dict(bos_id=0), "pad_id"),  # two specials share an id
    ],
)
def test_bad_values_name_the_key(overrides, key):
    with pytest.raises(ConfigError, match=repr(key)):
        ModelConfig.preset("tiny", vocab_size=1000, **overrides)


def test_unknown_key_in_file_names_file_and_suggests(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[model]\nd_ff = 128\nn_head = 4\n")
    with pytest.raises(ConfigError, match=r"bad\.toml.*'n_head'.*did you mean 'n_heads'"):
        ModelConfig.from_toml(path)


def test_unknown_preset():
    with pytest.raises(ConfigError, match="unknown preset 'paper-huge'"):
        ModelConfig.preset("paper-huge")


def test_invalid_toml_names_file(tmp_path):
    path = tmp_path / "broken.toml"
    path.write_text("[model\n")
    with pytest.raises(ConfigError, match="broken.toml"):
        ModelConfig.from_toml(path)
