"""Model directories: exact round trip, deterministic bytes, errors that name the file."""

import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from transduce import ConfigError, ModelConfig, Transformer
from transduce.data.vocab import Vocab, Vocabs
from transduce.modeldir import load_model_dir, save_model_dir, save_weights

LINES = [f"the {w} sees a {v} near the water ." for w in ("dog", "man", "girl", "cat") for v in ("boat", "tree")]


@pytest.fixture(scope="module")
def vocabs():
    vocab = Vocab.train(LINES * 5, 40)
    return Vocabs(vocab, vocab)


def tiny(vocabs, **overrides):
    torch.manual_seed(0)
    return Transformer(ModelConfig.preset("tiny", vocab_size=len(vocabs.src), **overrides))


def test_round_trip_keeps_every_tensor_and_the_tying(tmp_path, vocabs):
    model = tiny(vocabs)
    save_model_dir(tmp_path / "m", model, vocabs, meta={"src_lang": "en", "tgt_lang": "de"})
    loaded, v, meta = load_model_dir(tmp_path / "m")
    assert meta == {"src_lang": "en", "tgt_lang": "de"}
    for (name, a), b in zip(model.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b), name
    assert loaded.generator.weight is loaded.src_embed.token.weight
    assert v.src.proto == vocabs.src.proto
    stored = load_file(str(tmp_path / "m" / "model.safetensors"))
    assert "generator.weight" not in stored and "src_embed.token.weight" in stored  # stored once


@pytest.mark.parametrize(
    "overrides",
    [{"tie_embeddings": "target"}, {"tie_embeddings": "none", "positions": "learned"}, {"output_bias": True}],
)
def test_a_loaded_model_is_the_file_built_without_initialising(tmp_path, vocabs, overrides):
    """load_model_dir builds the model on the meta device and takes the file's tensors: every weight is the
    saved one, ties stay one parameter, the position table is real, and the model trains like a built one."""
    model = tiny(vocabs, **overrides)
    empty = Transformer.empty(model.config)
    assert all(p.is_meta for p in empty.parameters())
    save_model_dir(tmp_path / "m", model, vocabs)
    loaded, _, _ = load_model_dir(tmp_path / "m")
    assert not any(t.is_meta for t in [*loaded.parameters(), *loaded.buffers()])
    for (name, a), b in zip(model.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b), name
    for name, buffer in model.named_buffers():  # the non-persistent ones too (the sinusoid table)
        assert torch.equal(buffer, dict(loaded.named_buffers())[name]), name
    tied = {"all": 3, "target": 2, "none": 1}[model.config.tie_embeddings]
    shared = [loaded.src_embed.token.weight, loaded.tgt_embed.token.weight, loaded.generator.weight]
    assert sum(p is loaded.tgt_embed.token.weight for p in shared) == tied
    assert len(list(loaded.parameters())) == len(list(model.parameters()))  # one parameter per tied group
    src = torch.tensor([[5, 6, 7, 2]])
    loaded.eval(), model.eval()
    assert torch.equal(loaded(src, src), model(src, src))
    loaded.train()
    loaded(src, src).sum().backward()  # a fine-tune can start from it
    assert all(p.grad is not None for p in loaded.parameters() if p.requires_grad)


def test_a_file_in_another_dtype_loads_in_the_models(tmp_path, vocabs):
    """Weights stored in fp16 (another tool's export) load as the model's fp32, as load_state_dict's copy does."""
    model = tiny(vocabs)
    save_model_dir(tmp_path / "m", model, vocabs)
    path = tmp_path / "m" / "model.safetensors"
    save_file({k: v.half() for k, v in load_file(str(path)).items()}, str(path))
    loaded, _, _ = load_model_dir(tmp_path / "m")
    assert {p.dtype for p in loaded.parameters()} == {torch.float32}
    assert loaded.generator.weight is loaded.src_embed.token.weight
    assert torch.equal(loaded.src_embed.token.weight, model.src_embed.token.weight.half().float())


@pytest.mark.slow
def test_weights_file_is_byte_identical_across_processes(tmp_path, vocabs):
    """Tied names are resolved in module order, not hash order (PYTHONHASHSEED must not matter)."""
    model = tiny(vocabs)
    torch.save(model.state_dict(), tmp_path / "ref.pt")
    code = (
        "import sys, torch; from transduce import ModelConfig, Transformer; "
        "from transduce.modeldir import save_weights; "
        f"m = Transformer(ModelConfig.preset('tiny', vocab_size={len(vocabs.src)})); "
        f"m.load_state_dict(torch.load(r'{tmp_path / 'ref.pt'}', weights_only=True)); "
        "save_weights(m, sys.argv[1])"
    )
    for seed in ("1", "2"):
        env = {"PYTHONHASHSEED": seed, "PATH": "/usr/bin:/bin"}
        subprocess.run([sys.executable, "-c", code, str(tmp_path / f"w{seed}.safetensors")], check=True, env=env)
    assert (tmp_path / "w1.safetensors").read_bytes() == (tmp_path / "w2.safetensors").read_bytes()


def test_mismatched_weights_name_file_and_tensor(tmp_path, vocabs):
    save_model_dir(tmp_path / "m", tiny(vocabs), vocabs)
    weights = tmp_path / "m" / "model.safetensors"
    tensors = load_file(str(weights))
    del tensors["encoder.layers.0.ff.w1.weight"]
    save_file(tensors, str(weights))
    with pytest.raises(ConfigError, match=r"model\.safetensors.*'encoder\.layers\.0\.ff\.w1\.weight'"):
        load_model_dir(tmp_path / "m")
    other = tiny(vocabs, d_ff=128)
    save_weights(other, weights)
    with pytest.raises(ConfigError, match=r"model\.safetensors.*shape"):
        load_model_dir(tmp_path / "m")


def test_missing_files_are_named(tmp_path, vocabs):
    save_model_dir(tmp_path / "m", tiny(vocabs), vocabs)
    (tmp_path / "m" / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_model_dir(tmp_path / "m")
    with pytest.raises(FileNotFoundError, match="config.toml"):
        load_model_dir(tmp_path / "nothing")


def test_vocabulary_size_mismatch_is_an_error(tmp_path, vocabs):
    model = Transformer(ModelConfig.preset("tiny", vocab_size=len(vocabs.src) + 5))
    save_model_dir(tmp_path / "m", model, vocabs)
    with pytest.raises(ConfigError, match="vocab_size"):
        load_model_dir(tmp_path / "m")


def test_rewrite_is_atomic_and_leaves_no_temporaries(tmp_path, vocabs):
    save_model_dir(tmp_path / "m", tiny(vocabs), vocabs)
    save_model_dir(tmp_path / "m", tiny(vocabs), vocabs)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]
