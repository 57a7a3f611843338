"""Fine-tuning: ``train.init_from`` a model directory (trained here, or imported), data prepared with the
model's vocabulary (``prepare --vocab-from``), frozen parts, errors naming both directories, export after."""

import random
import shutil

import pytest
import torch

from transduce.cli import main
from transduce.interop.marian import export_marian
from transduce.modeldir import load_model_dir

WORDS = {
    "the": "der",
    "a": "ein",
    "dog": "hund",
    "cat": "katze",
    "runs": "läuft",
    "sleeps": "schläft",
    "on": "auf",
    "red": "rot",
    "blue": "blau",
    "house": "haus",
    "tree": "baum",
    "man": "mann",
    "big": "groß",
}


def write_tsv(path, n: int, seed: int) -> None:
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        src = [rng.choice(list(WORDS)) for _ in range(rng.randint(3, 8))]
        lines.append(" ".join(src) + "\t" + " ".join(WORDS[w] for w in src))
    path.write_text("\n".join(lines) + "\n")


def prepare(tmp, name: str, seed: int, *extra: str):
    for split, n in (("train", 300), ("valid", 20)):
        write_tsv(tmp / f"{name}.{split}.tsv", n, seed + (split == "valid"))
    assert (
        main(
            [
                "prepare",
                "files",
                "--tsv",
                str(tmp / f"{name}.train.tsv"),
                "--valid-tsv",
                str(tmp / f"{name}.valid.tsv"),
                "--src-lang",
                "en",
                "--tgt-lang",
                "de",
                "--vocab-size",
                "60",
                "--out",
                str(tmp / name),
                *extra,
            ]
        )
        == 0
    )
    return tmp / name


def train(tmp, data, out: str, *sets: str, model: str = '[model]\npreset = "tiny"\nmax_positions = 64\n'):
    config = tmp / f"{out}.toml"
    config.write_text(
        f'[train]\ndata = "{data}"\nout = "{tmp / out}"\nmax_tokens = 512\nmax_steps = 8\n'
        "warmup = 4\nvalidate_every = 100\nbleu_sentences = 0\nsave_every_steps = 100\n"
        "tensorboard = false\nthreads = 1\nlog_every = 4\n" + model
    )
    return main(["train", str(config), *[a for s in sets for a in ("--set", s)]])


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ft")
    data = prepare(tmp, "base-data", 1)
    assert train(tmp, data, "base") == 0
    return tmp, tmp / "base" / "model"


@pytest.mark.slow
def test_fine_tuning_starts_from_the_model_and_keeps_frozen_parts(base, capsys):
    tmp, model_dir = base
    data = prepare(tmp, "domain-data", 7, "--vocab-from", str(model_dir))
    init, vocabs, _ = load_model_dir(model_dir)
    assert (data / "vocab" / "shared.model").read_bytes() == vocabs.src.proto  # the model's own vocabulary
    assert (
        train(
            tmp,
            data,
            "tuned",
            f'init_from="{model_dir}"',
            'freeze=["embeddings"]',
            "peak_lr=1e-3",
            'schedule="linear"',
            model="[model]\ndropout = 0.0\n",
        )
        == 0
    )
    tuned, _, _ = load_model_dir(tmp / "tuned" / "model")
    assert tuned.config == init.config.__class__(**{**init.config.to_dict(), "dropout": 0.0})
    a, b = init.state_dict(), tuned.state_dict()
    assert torch.equal(a["src_embed.token.weight"], b["src_embed.token.weight"])  # frozen
    assert not torch.equal(a["encoder.layers.0.ff.w1.weight"], b["encoder.layers.0.ff.w1.weight"])  # trained
    # the starting point is the model: a run with a zero learning rate ends where it began
    assert train(tmp, data, "lr0", f'init_from="{model_dir}"', "lr_scale=1e-30", model="") == 0
    still, _, _ = load_model_dir(tmp / "lr0" / "model")
    assert all(torch.allclose(a[k], v, atol=1e-6) for k, v in still.state_dict().items())
    for fmt in ("hf", "ct2") if _has("ctranslate2") else ("hf",):
        assert main(["export", "--to", fmt, "--model", str(tmp / "tuned" / "model"), "--out", str(tmp / fmt)]) == 0


def _has(module: str) -> bool:
    try:
        __import__(module)
        return True
    except ImportError:
        return False


def test_mismatched_vocabulary_and_shape_are_named(base, capsys):
    tmp, model_dir = base
    other = prepare(tmp, "own-vocab", 7, "--vocab-size", "70")
    capsys.readouterr()
    assert train(tmp, other, "bad", f'init_from="{model_dir}"', model="") == 2
    err = capsys.readouterr().err
    assert str(model_dir) in err and str(other) in err and "--vocab-from" in err
    data = prepare(tmp, "domain-data", 7, "--vocab-from", str(model_dir))
    capsys.readouterr()
    assert train(tmp, data, "bad2", f'init_from="{model_dir}"') == 2  # [model] preset = "tiny"
    assert "key 'preset'" in capsys.readouterr().err
    assert train(tmp, data, "bad3", f'init_from="{tmp / "nowhere"}"', model="") == 2
    assert "nowhere/config.toml" in capsys.readouterr().err
    assert train(tmp, data, "bad4", 'freeze=["embeddings"]', model="") == 2
    assert "'freeze'" in capsys.readouterr().err
    assert train(tmp, data, "bad5", f'init_from="{model_dir}"', 'freeze=["heads"]', model="") == 2
    assert "'freeze'" in capsys.readouterr().err


def test_a_model_without_source_eos_is_refused_for_training(base, capsys):
    """Batches end every source with </s>: a model configured without it (as OpenNMT-py / Argos imports are)
    would train on other inputs than it translates, so training refuses it, naming the key."""
    tmp, _ = base
    capsys.readouterr()
    assert train(tmp, tmp / "base-data", "noeos", "model.source_eos=false") == 2
    assert "'source_eos'" in capsys.readouterr().err


@pytest.mark.slow
def test_an_imported_model_fine_tunes(base, tmp_path):
    _, model_dir = base
    model, vocabs, meta = load_model_dir(model_dir)
    export_marian(model, vocabs, tmp_path / "hf", meta)
    assert main(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "imported")]) == 0
    shutil.rmtree(tmp_path / "hf")
    tmp_data = tmp_path / "d"
    tmp_data.mkdir()
    data = prepare(tmp_data, "data", 3, "--vocab-from", str(tmp_path / "imported"))
    assert train(tmp_path, data, "tuned", f'init_from="{tmp_path / "imported"}"', model="") == 0
    assert (
        main(["export", "--to", "hf", "--model", str(tmp_path / "tuned" / "model"), "--out", str(tmp_path / "hf2")])
        == 0
    )


def test_the_recipe_prepares_with_the_model_vocabulary():
    from pathlib import Path

    from transduce.recipe import PrepareSection

    argv = PrepareSection(corpus="multi30k", raw="r", vocab_from="models/base").argv(Path("d"))
    assert argv[argv.index("--vocab-from") + 1] == "models/base"
    assert "--vocab-from" not in PrepareSection(raw="r").argv(Path("d"))
