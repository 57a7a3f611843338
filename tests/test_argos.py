"""Argos Translate packages both ways, and the CTranslate2 model.bin reader behind the import.

* transduce -> .argosmodel -> the real argostranslate (installed into a temporary home, network cut off, beam 1,
  float32) translates exactly as transduce's fp32 greedy search.
* an OpenNMT-py-shaped package (pre-norm, no source </s>, OpenNMT's <unk>/<blank>/<s>/</s> vocabulary order,
  a sines-then-cosines position table, untied output layer with a bias) -> ``transduce import`` -> the same
  greedy translations as CTranslate2 running the package's model.bin.
* int8 packages: the weights read back are CTranslate2's int8 values divided by their scales.
* malformed packages are refused with the file and key, entry or variable named.
"""

from __future__ import annotations

import importlib.util
import json
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import read_corpus

from transduce.cli import main
from transduce.config import ConfigError
from transduce.interop.argos import export_argos, import_argos
from transduce.interop.ct2_import import check_transformer_spec
from transduce.interop.ct2_model import DTYPES, CT2Model, dequantize, read_model_bin, read_model_dir
from transduce.model import ModelConfig, Transformer
from transduce.model.embeddings import sinusoid_table
from transduce.modeldir import load_model_dir

ctranslate2 = pytest.importorskip("ctranslate2", reason="Argos packages hold CTranslate2 models (the interop extra)")
HERE = Path(__file__).resolve().parent
MAX_LEN = 39


@pytest.fixture(scope="module")
def fitted(tiny_model_dir):
    model, vocabs, meta = load_model_dir(tiny_model_dir)
    return model, vocabs, meta, tiny_model_dir


@pytest.fixture(scope="module")
def sentences():
    return read_corpus("valid", "en", 12)


@torch.no_grad()
def greedy(model: Transformer, ids: list[int], max_len: int = MAX_LEN) -> list[int]:
    """Reference greedy search, fp32: bos, argmax until eos (not returned); the source ends with eos only
    for ``source_eos`` models."""
    src = ids + [model.config.eos_id] * model.config.source_eos
    cache = model.init_cache(model.encode(torch.tensor([src])), beam=1)
    token, out = torch.tensor([model.config.bos_id]), []
    for _ in range(max_len):
        token = model.decode_step(token, cache).argmax(-1)  # (1,)
        if token.item() == model.config.eos_id:
            break
        out.append(token.item())
    return out


def ct2_greedy(model_dir: Path, spm_path: Path, sentences: list[str], compute_type: str = "float32") -> list[str]:
    """CTranslate2 on a model directory, tokenised as argostranslate does (SentencePiece pieces, no </s>)."""
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_file=str(spm_path))
    translator = ctranslate2.Translator(str(model_dir), device="cpu", compute_type=compute_type, intra_threads=1)
    pieces = [sp.encode(s, out_type=str) for s in sentences]
    results = translator.translate_batch(pieces, beam_size=1, max_decoding_length=MAX_LEN)
    return [sp.decode_pieces(r.hypotheses[0]) for r in results]


def unpack(package: Path, out: Path) -> Path:
    with zipfile.ZipFile(package) as z:
        z.extractall(out)
    (root,) = [p for p in out.iterdir() if p.is_dir()]
    return root


def write_package(folder: Path, out: Path, extra: dict[str, bytes] | None = None) -> Path:
    """Zip ``folder`` as one top-level folder (an .argosmodel), plus ``extra`` raw entries."""
    with zipfile.ZipFile(out, "w") as z:
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                z.write(path, f"{folder.name}/{path.relative_to(folder).as_posix()}")
        for name, data in (extra or {}).items():
            z.writestr(name, data)
    return out


# ----------------------------------------------------------------------------- transduce -> argostranslate
@pytest.mark.skipif(importlib.util.find_spec("argostranslate") is None, reason="needs argostranslate (dev extra)")
def test_exported_package_installs_and_translates_in_argostranslate(fitted, sentences, tmp_path):
    model, vocabs, _, model_dir = fitted
    package = tmp_path / "en_fr.argosmodel"
    assert main(["export", "--to", "argos", "--model", str(model_dir), "--out", str(package)]) == 0
    with zipfile.ZipFile(package) as z:
        names = set(z.namelist())
    folder = "translate-en_fr-1_0"
    assert {f"{folder}/metadata.json", f"{folder}/sentencepiece.model", f"{folder}/model/model.bin"} <= names
    assert all(n.startswith(folder + "/") for n in names)

    home = tmp_path / "home"
    env = {
        "HOME": str(home),
        "XDG_DATA_HOME": str(home / "data"),
        "XDG_CONFIG_HOME": str(home / "config"),
        "XDG_CACHE_HOME": str(home / "cache"),
        "ARGOS_PACKAGES_DIR": str(home / "packages"),
        "ARGOS_DEVICE_TYPE": "cpu",
        "ARGOS_BEAM_SIZE": "1",
        "ARGOS_COMPUTE_TYPE": "float32",
        "ARGOS_INTRA_THREADS": "1",
        "PATH": "/usr/bin:/bin",
    }
    (tmp_path / "in.json").write_text(json.dumps(sentences))
    run = subprocess.run(
        [sys.executable, str(HERE / "argos_translate_run.py"), str(package), "en", "fr", str(tmp_path / "in.json")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["installed"] == [["en", "fr", "1.0"]]
    assert (home / "packages" / folder / "metadata.json").is_file()
    ours = [vocabs.tgt.decode(greedy(model, vocabs.src.encode(s), 256)) for s in sentences]
    assert result["translations"] == ours


def test_export_refuses_what_argos_cannot_run(fitted, tmp_path):
    model, vocabs, _, _ = fitted
    with pytest.raises(ConfigError, match=r"--from-code.*--to-code.*\.argosmodel"):
        export_argos(model, vocabs, tmp_path / "x.zip")
    from transduce.data.vocab import Vocabs

    separate = Vocabs(vocabs.src, type(vocabs.src)(vocabs.src.proto))
    with pytest.raises(ConfigError, match="separate source and target vocabularies"):
        export_argos(model, separate, tmp_path / "x.argosmodel", {"src_lang": "en", "tgt_lang": "fr"})


# ----------------------------------------------------------------------------- an OpenNMT-py-shaped package
def _opennmt_like_package(model: Transformer, vocabs, tmp_path: Path, quantization: str | None = None) -> Path:
    """A package laid out as argos-train makes them: OpenNMT's vocabulary order (<unk>, <blank>, <s>, </s>, ...),
    built with CTranslate2's own converter from ``model``."""
    from transduce.interop.ctranslate2 import build_spec

    spec = build_spec(model, vocabs)
    tokens = [vocabs.src.sp.id_to_piece(i) for i in range(len(vocabs.src))]
    rows = [1, 0, 2, 3] + list(range(4, len(tokens)))  # OpenNMT: <unk> 0, <blank> 1, <s> 2, </s> 3
    onmt = [tokens[r] for r in rows]
    onmt[1] = "<blank>"
    spec.encoder.embeddings[0].weight = spec.encoder.embeddings[0].weight[rows]
    spec.decoder.embeddings.weight = spec.decoder.embeddings.weight[rows]
    spec.decoder.projection.weight = spec.decoder.projection.weight[rows]
    spec.decoder.projection.bias = spec.decoder.projection.bias[rows]
    spec._vocabularies = {"source": [onmt], "target": [onmt]}  # the converter's registered lists, replaced
    for layer in [*spec.encoder.layer, *spec.decoder.layer]:  # OpenNMT-py 3's self-attention has no biases
        for linear in layer.self_attention.linear:
            linear.bias = "__optional"  # CTranslate2's marker of an absent optional variable
    spec.config.layer_norm_epsilon = None  # OpenNMT-py conversions leave it to CTranslate2's default

    class Converter(ctranslate2.converters.Converter):
        def _load(self):
            return spec

    root = tmp_path / "src" / "translate-en_fr-1_0"
    Converter().convert(str(root / "model"), quantization=quantization, force=True)
    vocabs.src.save(root / "sentencepiece.model")
    metadata = {"package_version": "1.9", "argos_version": "1.0", "from_code": "en", "to_code": "fr"}
    (root / "metadata.json").write_text(json.dumps(metadata))
    (root / "stanza").mkdir()
    (root / "stanza" / "resources.json").write_text("{}")
    return write_package(root, tmp_path / "onmt.argosmodel")


def _opennmt_shaped(fitted_model: Transformer) -> Transformer:
    """The fitted weights in an OpenNMT-py shape: pre-norm (final norms not identity), no source </s>,
    sines-then-cosines positions, an untied output layer with a bias, LayerNorm epsilon 1e-6."""
    cfg = dict(fitted_model.config.to_dict())
    cfg.update(
        norm="pre", source_eos=False, positions="learned", tie_embeddings="none", output_bias=True, layer_norm_eps=1e-6
    )
    model = Transformer(ModelConfig(**cfg)).eval()
    model.load_state_dict(fitted_model.state_dict(), strict=False)
    gen = torch.Generator().manual_seed(3)
    d = cfg["d_model"]
    table = sinusoid_table(cfg["max_positions"], d)
    halves = table[:, torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)])]
    with torch.no_grad():
        model.src_embed.positions.weight.copy_(halves)
        model.tgt_embed.positions.weight.copy_(halves)
        model.generator.weight.add_(0.01 * torch.randn(model.generator.weight.shape, generator=gen))
        model.generator.bias.copy_(0.5 * torch.randn(model.generator.bias.shape, generator=gen))
        for norm in (model.encoder.final_norm, model.decoder.final_norm):
            norm.weight.mul_(1.5)
            norm.bias.add_(0.1)
    return model


def test_opennmt_shaped_package_imports_and_translates_as_ctranslate2(fitted, sentences, tmp_path, capsys):
    model, vocabs, _, _ = fitted
    package = _opennmt_like_package(_opennmt_shaped(model), vocabs, tmp_path)
    out = tmp_path / "imported"
    assert main(["import", str(package), "--out", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    imported, ivocabs, meta = load_model_dir(out)
    cfg = imported.config
    assert (cfg.norm, cfg.source_eos, cfg.positions, cfg.tie_embeddings, cfg.output_bias, cfg.layer_norm_eps) == (
        "pre",
        False,
        "learned",
        "none",
        True,
        1e-6,
    )
    assert cfg.vocab_size == len(vocabs.src)  # <blank> became the pad token: no row added
    assert (meta["src_lang"], meta["tgt_lang"], meta["import_format"]) == ("en", "fr", "argos")
    assert json.loads(meta["argos_sentence_splitter_not_used"]) == ["stanza"]

    root = unpack(package, tmp_path / "unpacked")
    assert "encoder/layer_0/self_attention/linear_0/bias" not in read_model_bin(root / "model" / "model.bin").names()
    assert not imported.state_dict()["encoder.layers.0.self_attn.qkv_proj.bias"].any()  # absent bias: zeros
    theirs = ct2_greedy(root / "model", root / "sentencepiece.model", sentences)
    ours = [ivocabs.tgt.decode(greedy(imported, ivocabs.src.encode(s))) for s in sentences]
    assert ours == theirs
    assert len(set(theirs)) > 3  # the inputs give different outputs

    # the model directory serves `transduce translate` (fp32 reference path, greedy, at most MAX_LEN tokens)
    (tmp_path / "in.en").write_text("\n".join(sentences) + "\n")
    args = ["translate", "--model", str(out), "--exact", "--beam", "1", "--max-len-a", "0", "--max-len-b", str(MAX_LEN)]
    assert main([*args, "--output", str(tmp_path / "out.fr"), str(tmp_path / "in.en")]) == 0
    assert (tmp_path / "out.fr").read_text().splitlines() == ours


def test_int8_package_reads_as_dequantised_weights(fitted, sentences, tmp_path):
    model, vocabs, _, _ = fitted
    shaped = _opennmt_shaped(model)
    package = _opennmt_like_package(shaped, vocabs, tmp_path, quantization="int8")
    root = unpack(package, tmp_path / "unpacked")
    ct2 = read_model_dir(root / "model")
    name = "encoder/layer_0/ffn/linear_0/weight"
    var, scale = ct2.get(name), ct2.get(name + "_scale")
    assert (var.dtype, scale.dtype, scale.shape) == ("int8", "float32", (var.shape[0],))
    weights = dequantize(ct2, name)
    assert np.array_equal(weights, var.data.astype(np.float32) / scale.data[:, None])
    original = shaped.state_dict()["encoder.layers.0.ff.w1.weight"].numpy()
    assert np.all(np.abs(weights - original) * scale.data[:, None] <= 0.5 + 1e-5)  # int8 rounding, per row; also
    # fails if the export quantised the model's own arrays in place
    assert np.abs(weights - original).max() > 0  # it was quantised

    imported, ivocabs, _ = import_argos(package)
    w1 = imported.state_dict()["encoder.layers.0.ff.w1.weight"].numpy()
    assert np.array_equal(w1, weights)
    # CTranslate2 computing in float32 from the same int8 weights: the same greedy translations
    theirs = ct2_greedy(root / "model", root / "sentencepiece.model", sentences, compute_type="float32")
    assert [ivocabs.tgt.decode(greedy(imported, ivocabs.src.encode(s))) for s in sentences] == theirs


@pytest.mark.parametrize("quantization", ["int16", "float16", "bfloat16"])
def test_other_weight_types_read_as_float32(fitted, tmp_path, quantization):
    """int16 (one scale per matrix), float16 and bfloat16 weights come back as float32 within their precision."""
    from transduce.interop.ctranslate2 import export_ctranslate2

    model, vocabs, _, _ = fitted
    export_ctranslate2(model, vocabs, tmp_path / "ct2", quantization=quantization)
    ct2 = read_model_dir(tmp_path / "ct2")
    name = "decoder/layer_1/ffn/linear_1/weight"
    assert ct2.get(name).dtype == quantization
    weights = dequantize(ct2, name)
    original = model.state_dict()["decoder.layers.1.ff.w2.weight"].numpy()
    assert weights.dtype == np.float32 and weights.shape == original.shape
    if quantization == "int16":
        scale = ct2.get(name + "_scale").data
        assert scale.shape == () and np.abs(weights - original).max() * scale <= 0.5 + 1e-3  # float32 rounding
    else:
        rtol = {"float16": 2**-11, "bfloat16": 2**-8}[quantization]
        assert np.allclose(weights, original, rtol=rtol, atol=1e-7) and not np.array_equal(weights, original)


# ----------------------------------------------------------------------------- malformed input
def _write_model_bin(path: Path, ct2: CT2Model) -> None:
    """model.bin in CTranslate2's layout (the module docstring of transduce.interop.ct2_model)."""

    def string(s: str) -> bytes:
        raw = s.encode() + b"\0"
        return struct.pack("<H", len(raw)) + raw

    out = [struct.pack("<I", ct2.version), string(ct2.spec), struct.pack("<I", ct2.revision)]
    out.append(struct.pack("<I", len(ct2.variables)))
    for name, var in ct2.variables.items():
        data = np.ascontiguousarray(var.data)
        out += [string(name), struct.pack("<B", len(var.shape)), *(struct.pack("<I", d) for d in var.shape)]
        out += [struct.pack("<B", DTYPES.index(var.dtype)), struct.pack("<I", data.nbytes), data.tobytes()]
    out.append(struct.pack("<I", len(ct2.aliases)))
    for alias, name in ct2.aliases.items():
        out += [string(alias), string(name)]
    path.write_bytes(b"".join(out))


@pytest.fixture
def exported(fitted, tmp_path):
    """An unpacked package exported from the tiny model: its folder."""
    model, vocabs, meta, _ = fitted
    package = export_argos(model, vocabs, tmp_path / "good.argosmodel", meta)
    return unpack(package, tmp_path / "good")


def test_an_installed_package_folder_imports(fitted, exported, tmp_path):
    """The folder argostranslate (or LibreTranslate) installs imports like the .argosmodel it came from."""
    model, _, _, _ = fitted
    assert main(["import", str(exported), "--out", str(tmp_path / "from-folder")]) == 0
    imported, _, meta = load_model_dir(tmp_path / "from-folder")
    assert meta["imported_from"] == str(exported.resolve())
    assert imported.config.max_positions == 1024  # the exported sinusoid table's rows
    ours = {k: v for k, v in model.state_dict().items()}
    assert all(torch.equal(ours[k], v) for k, v in imported.state_dict().items())


def test_model_bin_round_trips_through_the_reader(exported, tmp_path):
    ct2 = read_model_bin(exported / "model" / "model.bin")
    assert (ct2.version, ct2.spec, ct2.revision) == (6, "TransformerSpec", 7)
    assert ct2.scalar("encoder/num_heads") == 4 and ct2.scalar("decoder/pre_norm") == 0
    assert ct2.aliases["decoder/projection/weight"] == "decoder/embeddings/weight"  # tied: stored once
    _write_model_bin(tmp_path / "model.bin", ct2)
    assert (tmp_path / "model.bin").read_bytes() == (exported / "model" / "model.bin").read_bytes()


def test_unsupported_specs_are_listed_in_one_error(exported, tmp_path):
    ct2 = read_model_bin(exported / "model" / "model.bin")
    from transduce.interop.ct2_model import CT2Variable

    glu = ct2.variables["encoder/layer_0/ffn/linear_0/weight"]
    ct2.variables["encoder/layer_0/ffn/linear_0_noact/weight"] = CT2Variable(
        "encoder/layer_0/ffn/linear_0_noact/weight", glu.shape, glu.dtype, glu.data
    )
    ct2.variables["decoder/alibi"] = CT2Variable("decoder/alibi", (), "int8", np.array(1, dtype=np.int8))
    del ct2.aliases["encoder/position_encodings/encodings"]
    _write_model_bin(tmp_path / "model.bin", ct2)
    with pytest.raises(ConfigError) as err:
        check_transformer_spec(read_model_bin(tmp_path / "model.bin"))
    message = str(err.value)
    assert str(tmp_path / "model.bin") in message
    for part in ("linear_0_noact", "decoder/alibi", "encoder/position_encodings/encodings"):
        assert part in message

    ct2.spec = "WhisperSpec"
    _write_model_bin(tmp_path / "model.bin", ct2)
    with pytest.raises(ConfigError, match="spec 'WhisperSpec'.*TransformerSpec only"):
        check_transformer_spec(read_model_bin(tmp_path / "model.bin"))

    data = (exported / "model" / "model.bin").read_bytes()
    (tmp_path / "cut.bin").write_bytes(data[: len(data) // 2])
    with pytest.raises(ConfigError, match=r"cut\.bin: truncated .* of '"):
        read_model_bin(tmp_path / "cut.bin")


def test_malformed_packages_are_refused(exported, tmp_path):
    metadata = json.loads((exported / "metadata.json").read_text())
    (exported / "metadata.json").write_text(json.dumps({k: v for k, v in metadata.items() if k != "to_code"}))
    with pytest.raises(ConfigError, match=r"metadata\.json: missing key 'to_code'"):
        import_argos(write_package(exported, tmp_path / "nokey.argosmodel"))
    (exported / "metadata.json").write_text(json.dumps(metadata))

    slip = write_package(exported, tmp_path / "slip.argosmodel", {"../../evil.txt": b"x"})
    with pytest.raises(ConfigError, match=r"'\.\./\.\./evil\.txt' would be written outside"):
        import_argos(slip)
    assert not list(tmp_path.parent.glob("evil.txt")) and not (tmp_path / "evil.txt").exists()

    (exported / "sentencepiece.model").rename(exported / "bpe.model")
    with pytest.raises(ConfigError, match="bpe.model.*Moses"):
        import_argos(write_package(exported, tmp_path / "bpe.argosmodel"))

    (tmp_path / "notzip.argosmodel").write_bytes(b"not a zip")
    with pytest.raises(ConfigError, match="not a zip archive"):
        import_argos(tmp_path / "notzip.argosmodel")
