"""Damaged or unsafe files get one error line naming the file and the fix, never a traceback, never code run.

Covers every loader: a model directory (``transduce translate``), a training checkpoint, and
imports (MarianMT directories; native Marian ``.npz`` files are covered in test_interop_native.py).
"""

import pickle
import shutil

import numpy as np
import pytest
import torch
from opus_models import sentences

from transduce.cli import main
from transduce.data.vocab import Vocab, Vocabs
from transduce.interop.marian import export_marian, import_marian
from transduce.model import ModelConfig, Transformer
from transduce.modeldir import load_model_dir, save_model_dir
from transduce.safefiles import BadFileError, read_npz, read_safetensors
from transduce.train import checkpoint as ckpt


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    vocab = Vocab.train(sentences(300), 80)
    torch.manual_seed(0)
    model = Transformer(ModelConfig.preset("tiny", vocab_size=len(vocab), max_positions=64)).eval()
    return save_model_dir(tmp_path_factory.mktemp("m") / "model", model, Vocabs(vocab, vocab), {"src_lang": "en"})


def damaged_copy(model_dir, tmp_path, damage):
    out = tmp_path / "copy"
    shutil.copytree(model_dir, out)
    damage(out / "model.safetensors")
    return out


class Evil:
    def __reduce__(self):
        return (exec, ("open('PWNED', 'w').write('x')",))


DAMAGES = {
    "truncated": lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]),
    "header cut": lambda p: p.write_bytes(p.read_bytes()[:5]),
    "garbage": lambda p: p.write_bytes(b"\x00\x01garbage" * 100),
    "bad header json": lambda p: p.write_bytes(len(b"{not json").to_bytes(8, "little") + b"{not json"),
    "pickle": lambda p: p.write_bytes(pickle.dumps(Evil())),
    "torch.save": lambda p: torch.save({"x": torch.zeros(2)}, p),
    "empty": lambda p: p.write_bytes(b""),
}


@pytest.mark.parametrize("kind", sorted(DAMAGES))
def test_translate_names_a_damaged_weights_file_in_one_line(model_dir, tmp_path, kind, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    bad = damaged_copy(model_dir, tmp_path, DAMAGES[kind])
    with pytest.raises(BadFileError, match="model.safetensors"):
        load_model_dir(bad)
    src = tmp_path / "in.txt"
    src.write_text("the dog runs\n")
    assert main(["translate", "--model", str(bad), str(src)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert str(bad / "model.safetensors") in err and "copy it again" in err
    if kind in ("pickle", "torch.save"):
        assert "pickle" in err
    assert not (tmp_path / "PWNED").exists()


def test_a_wrong_key_and_a_missing_config_are_named(model_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    bad = tmp_path / "copy"
    shutil.copytree(model_dir, bad)
    tensors = load_file(str(bad / "model.safetensors"))
    tensors["encoder.layers.0.ff.w9.weight"] = tensors.pop("encoder.layers.0.ff.w1.weight")
    save_file(tensors, str(bad / "model.safetensors"))
    with pytest.raises(ValueError, match=r"model.safetensors: missing tensor 'encoder.layers.0.ff.w1.weight'"):
        load_model_dir(bad)
    (bad / "config.toml").unlink()
    with pytest.raises(FileNotFoundError, match="config.toml"):
        load_model_dir(bad)


def test_a_corrupted_vocabulary_is_named(model_dir, tmp_path):
    bad = tmp_path / "copy"
    shutil.copytree(model_dir, bad)
    (bad / "vocab" / "shared.model").write_bytes(b"\x01\x02 not a sentencepiece model")
    with pytest.raises(BadFileError, match="vocab.*SentencePiece model.*corrupted"):
        load_model_dir(bad)
    (bad / "vocab" / "vocab.json").write_text("{")
    with pytest.raises(BadFileError, match=r"vocab.json: not valid JSON"):
        load_model_dir(bad)


def test_checkpoint_damage_is_named_with_the_fix(model_dir, tmp_path):
    model, _, _ = load_model_dir(model_dir)
    opt = torch.optim.Adam(model.parameters())
    root = tmp_path / "checkpoints"
    ckpt.save_checkpoint(ckpt.step_dir(root, 5), model, opt, {"step": 5})
    good = ckpt.step_dir(root, 5)
    assert ckpt.load_checkpoint(good, model, opt, restore_rng=False)["step"] == 5
    for name, damage in (
        ("optimizer.safetensors", DAMAGES["truncated"]),
        ("model.safetensors", DAMAGES["pickle"]),
        ("state.json", lambda p: p.write_text('{"step": ')),
    ):
        bad = tmp_path / f"bad-{name}" / "step_00000005"
        shutil.copytree(good, bad)
        damage(bad / name)
        with pytest.raises(BadFileError, match=rf"{name}: .*move .*step_00000005 aside and resume"):
            ckpt.load_checkpoint(bad, model, opt, restore_rng=False)


def test_import_of_a_damaged_marian_directory_is_named(model_dir, tmp_path, capsys):
    model, vocabs, _ = load_model_dir(model_dir)
    export_marian(model, vocabs, tmp_path / "hf")
    DAMAGES["truncated"](tmp_path / "hf" / "model.safetensors")
    with pytest.raises(BadFileError, match="hf/model.safetensors: truncated"):
        import_marian(tmp_path / "hf")
    DAMAGES["torch.save"](tmp_path / "hf" / "model.safetensors")
    assert main(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "model.safetensors: is a Python pickle" in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_npz_reader_refuses_objects_and_names_corruption(tmp_path):
    good = tmp_path / "good.npz"
    np.savez(good, w=np.ones((2, 3), dtype=np.float32))
    assert read_npz(good, "fix")["w"].shape == (2, 3)
    objects = tmp_path / "objects.npz"
    np.savez(objects, w=np.array([Evil()], dtype=object))
    with pytest.raises(BadFileError, match="objects.npz: holds pickled Python objects"):
        read_npz(objects, "fix")
    cut = tmp_path / "cut.npz"
    cut.write_bytes(good.read_bytes()[:100])
    with pytest.raises(BadFileError, match="cut.npz: truncated or corrupted"):
        read_npz(cut, "fix")
    pkl = tmp_path / "model.npz"
    pkl.write_bytes(pickle.dumps(Evil()))
    with pytest.raises(BadFileError, match="model.npz: is a Python pickle"):
        read_npz(pkl, "fix")
    with pytest.raises(BadFileError, match="missing"):
        read_safetensors(tmp_path / "none.safetensors", "fix")
    assert not (tmp_path / "PWNED").exists()
