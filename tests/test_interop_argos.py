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
@pytest.mark.slow
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
    # transduce stops at the model's max_positions; CTranslate2 computes the sinusoid past it, so a tiny model that
    # repeats itself to the limit (as this one does on some CPUs' arithmetic) must agree up to it
    limit = model.config.max_positions
    ours = [greedy(model, vocabs.src.encode(s), limit) for s in sentences]
    for theirs, ids, source in zip(result["translations"], ours, sentences):
        mine = vocabs.tgt.decode(ids)
        assert theirs == mine if len(ids) < limit else theirs.startswith(mine), source
    assert sum(len(ids) < limit for ids in ours) >= len(sentences) - 2  # most end before the limit


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


@pytest.mark.slow
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
def package(fitted, tmp_path):
    """An .argosmodel exported from the tiny model (en -> fr)."""
    model, vocabs, meta, _ = fitted
    return export_argos(model, vocabs, tmp_path / "good.argosmodel", meta)


@pytest.fixture
def exported(package, tmp_path):
    """An unpacked package exported from the tiny model: its folder."""
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


# ----------------------------------------------------------------------------- by name, from a package index
@pytest.fixture
def offline(monkeypatch):
    """Every download goes through urllib.request.urlopen: only file:// addresses may be opened, and
    argostranslate's index setting from the environment is unset."""
    import urllib.request

    monkeypatch.delenv("ARGOS_PACKAGE_INDEX", raising=False)
    real = urllib.request.urlopen
    opened = []

    def file_only(request, *args, **kwargs):
        url = request.full_url if isinstance(request, urllib.request.Request) else request
        assert url.startswith("file:"), f"a test tried to open {url}"
        opened.append(url)
        return real(request, *args, **kwargs)

    monkeypatch.setattr(urllib.request, "urlopen", file_only)
    return opened


def index_entry(link: str, from_code: str = "en", to_code: str = "fr", version: str = "1.0", **more) -> dict:
    """An entry as the published index writes them (argospm-index's index.json)."""
    return {
        "package_version": version,
        "argos_version": "1.0",
        "from_code": from_code,
        "from_name": from_code,
        "to_code": to_code,
        "to_name": to_code,
        "links": [link],
        "code": f"translate-{from_code}_{to_code}",
        **more,
    }


def write_index(path: Path, *entries: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(list(entries), indent=2))
    return path


def imports(capsys, *argv: str) -> tuple[int, str]:
    """(exit status, stderr) of `transduce import ARGV`."""
    capsys.readouterr()
    status = main(["import", *argv])
    return status, capsys.readouterr().err


def left_behind(folder: Path) -> list[str]:
    """The files under ``folder`` (none when it does not exist)."""
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


@pytest.mark.slow
def test_a_pair_by_name_imports_and_translates_as_its_package_file(
    offline, fitted, package, sentences, tmp_path, capsys
):
    import hashlib

    digest = hashlib.sha256(package.read_bytes()).hexdigest()
    index = write_index(
        tmp_path / "site" / "index.json",
        index_entry(str(tmp_path / "absent-old.argosmodel"), version="0.9"),  # older: not chosen
        index_entry("ipfs://QmNotFetched", "de", "en"),
        index_entry(package.as_uri(), sha256=digest),
    )
    cache, by_name, by_file = tmp_path / "cache", tmp_path / "by-name", tmp_path / "by-file"
    common = ["--argos-index", str(index), "--cache-dir", str(cache)]
    assert imports(capsys, "argos:en-fr", *common, "--out", str(by_name)) == (0, "")
    assert main(["import", str(package), "--out", str(by_file)]) == 0
    assert offline == [package.as_uri()]  # the index is a local file: read, not downloaded
    assert left_behind(cache) == ["argos/translate-en_fr-1_0.argosmodel"]

    (a, avocabs, meta), (b, _, _) = load_model_dir(by_name), load_model_dir(by_file)
    assert (meta["imported_from"], meta["argos_index"]) == ("argos:en-fr", index.resolve().as_uri())
    assert (meta["src_lang"], meta["tgt_lang"], meta["argos_package_version"]) == ("en", "fr", "1.0")
    assert a.state_dict().keys() == b.state_dict().keys()
    assert all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items())
    ours = [avocabs.tgt.decode(greedy(a, avocabs.src.encode(s))) for s in sentences]
    assert ours == [avocabs.tgt.decode(greedy(b, avocabs.src.encode(s))) for s in sentences]
    assert len(set(ours)) > 3

    # an --out that holds a model is refused before the index is read
    status, err = imports(capsys, "argos:en-fr", "--argos-index", str(tmp_path / "none.json"), "--out", str(by_name))
    assert status == 2 and "already holds a model; give --force" in err

    # the kept package is reused (its source is gone), under argospm's name for it too
    package.rename(tmp_path / "moved.argosmodel")
    assert imports(capsys, "argos:translate-en_fr", *common, "--out", str(by_name), "--force") == (0, "")
    assert load_model_dir(by_name)[2]["imported_from"] == "argos:translate-en_fr"
    assert len(offline) == 1

    # a kept copy that no longer verifies is downloaded again
    (tmp_path / "moved.argosmodel").rename(package)
    kept = cache / "argos" / "translate-en_fr-1_0.argosmodel"
    kept.write_bytes(kept.read_bytes()[:1000])
    status, err = imports(capsys, "argos:en_fr", *common, "--out", str(tmp_path / "again"))
    assert status == 0 and "downloading it again" in err and kept.read_bytes() == package.read_bytes()


def test_the_index_option_takes_urls_and_folders_as_argostranslate_does(
    offline, package, tmp_path, monkeypatch, capsys
):
    site = tmp_path / "site"
    write_index(site / "index.json", index_entry("packages/en_fr.argosmodel"))  # relative to the index
    (site / "packages").mkdir()
    package.rename(site / "packages" / "en_fr.argosmodel")
    folder_url = site.as_uri() + "/"  # as ARGOS_PACKAGE_INDEX is written: index.json is appended

    for n, how in enumerate([["--argos-index", folder_url], ["--argos-index", str(site)], []]):
        if not how:
            monkeypatch.setenv("ARGOS_PACKAGE_INDEX", folder_url)
        out, cache = tmp_path / f"m{n}", tmp_path / f"c{n}"
        assert imports(capsys, "argos:en-fr", *how, "--cache-dir", str(cache), "--out", str(out)) == (0, "")
        assert load_model_dir(out)[2]["argos_index"] == site.resolve().as_uri() + "/index.json"
    kept_index = [p for p in left_behind(tmp_path / "c0") if p.startswith("argos/index-")]
    assert len(kept_index) == 1 and kept_index[0].endswith(".json")

    # the index's address unreadable: the copy kept before is used; with none kept, an error
    (site / "index.json").unlink()
    status, err = imports(capsys, "argos:en-fr", "--cache-dir", str(tmp_path / "c0"), "--out", str(tmp_path / "k"))
    assert status == 0 and "using the copy of the index kept at" in err
    status, err = imports(capsys, "argos:en-fr", "--cache-dir", str(tmp_path / "c9"), "--out", str(tmp_path / "x"))
    assert status == 2 and "no copy of this index was kept" in err and not (tmp_path / "x").exists()


def test_the_default_index_is_argostranslates(monkeypatch):
    from transduce.interop.argos_index import DEFAULT_INDEX, index_address

    monkeypatch.delenv("ARGOS_PACKAGE_INDEX", raising=False)
    assert index_address() == DEFAULT_INDEX
    assert index_address("https://example.org/mirror/") == "https://example.org/mirror/index.json"
    spec = importlib.util.find_spec("argostranslate")
    if spec is None:
        pytest.skip("needs argostranslate (dev extra) to compare with")
    settings = Path(spec.submodule_search_locations[0], "settings.py").read_text()  # read, not imported
    assert f'default="{DEFAULT_INDEX.removesuffix("index.json")}"' in settings
    assert 'remote_package_index = package_index + "index.json"' in settings


def test_a_pair_the_index_lacks_is_an_error_naming_what_it_has(offline, tmp_path, capsys):
    index = write_index(
        tmp_path / "index.json",
        *(
            index_entry(f"file:///nowhere/{a}_{b}.argosmodel", a, b)
            for a, b in [("en", "fr"), ("fr", "en"), ("en", "de")]
        ),
        {"type": "sbd", "from_code": "en", "to_code": "xx", "package_version": "1.0", "links": []},
    )
    out = tmp_path / "out"
    for name, message in [
        ("en-es", "from en it has: en-de, en-fr"),
        ("translate-en_es", "from en it has: en-de, en-fr"),
        ("eng-fra", "close: en-fr"),
        ("xx-yy", "it has 3 pairs, from en, fr"),
        ("en-xx", "from en it has: en-de, en-fr"),  # a sentence-splitter package is no translation package
    ]:
        status, err = imports(
            capsys, f"argos:{name}", "--argos-index", str(index), "--cache-dir", str(tmp_path / "c"), "--out", str(out)
        )
        assert status == 2 and f"argos:{name}: no such translation package" in err and message in err, err
    assert offline == [] and left_behind(tmp_path) == ["index.json"]


@pytest.mark.parametrize(
    "entry, message",
    [
        (
            {"from_code": "en", "to_code": "fr"},
            "entry 1 of 1 (en-fr): missing key 'package_version'; missing key 'links'",
        ),
        (index_entry("x.argosmodel", links=[]), "key 'links' is [], not a non-empty list"),
        (index_entry("x.argosmodel", package_version=1.0), "key 'package_version' is 1.0, not a non-empty string"),
        (
            {"code": "translate-en_fr", "links": ["x"], "package_version": "1"},
            "missing key 'from_code'; missing key 'to_code'",
        ),
        (index_entry("x.argosmodel", sha256="abc"), "key 'sha256' is 'abc', not 64 hexadecimal digits"),
        (index_entry("ipfs://QmOnlyThere"), "no link to download (http, https, file) among ['ipfs://QmOnlyThere']"),
    ],
)
def test_a_malformed_index_entry_is_refused_with_its_keys_named(offline, tmp_path, capsys, entry, message):
    index = write_index(tmp_path / "index.json", entry)
    where = ["--argos-index", str(index), "--cache-dir", str(tmp_path / "c")]
    status, err = imports(capsys, "argos:translate-en_fr", *where, "--out", str(tmp_path / "o"))
    assert status == 2 and message in err, err
    assert offline == [] and left_behind(tmp_path) == ["index.json"]


def test_a_file_that_is_no_index_is_refused(offline, tmp_path, capsys):
    for text, message in [("{not json", "not valid JSON"), ('{"en": "fr"}', "expected a JSON list of packages")]:
        (tmp_path / "index.json").write_text(text)
        status, err = imports(
            capsys, "argos:en-fr", "--argos-index", str(tmp_path / "index.json"), "--out", str(tmp_path / "o")
        )
        assert status == 2 and "not a package index" in err and message in err, err
    assert not (tmp_path / "o").exists()


def test_a_download_shorter_than_announced_is_not_kept(tmp_path, monkeypatch):
    """The byte count the server announced must arrive (a server that closes early without an error)."""
    import io
    import urllib.request

    from transduce.interop.fetch import DownloadError, fetch_file

    class Short(io.BytesIO):
        headers = {"Content-Length": "100"}

    monkeypatch.setattr(urllib.request, "urlopen", lambda request, timeout: Short(b"x" * 60))
    with pytest.raises(DownloadError, match=r"cut short \(60 of 100 bytes\)"):
        fetch_file("https://example.org/translate-en_fr-1_0.argosmodel", tmp_path / "kept" / "p.argosmodel")
    assert left_behind(tmp_path) == []
    Short.headers = {"Content-Length": "60"}
    fetch_file("https://example.org/translate-en_fr-1_0.argosmodel", tmp_path / "kept" / "p.argosmodel")
    assert left_behind(tmp_path) == ["kept/p.argosmodel"]


def _corrupted(package: Path, out: Path) -> Path:
    """``package`` with one byte flipped in the middle of its largest member's compressed data."""
    with zipfile.ZipFile(package) as z:
        info = max(z.infolist(), key=lambda i: i.compress_size)
    data = bytearray(package.read_bytes())
    name_length, extra_length = struct.unpack("<HH", data[info.header_offset + 26 : info.header_offset + 30])
    at = info.header_offset + 30 + name_length + extra_length + info.compress_size // 2
    data[at] ^= 0xFF
    out.write_bytes(bytes(data))
    return out


def test_a_corrupt_truncated_or_mismatched_package_leaves_nothing(offline, package, tmp_path, capsys):
    """Each bad download is refused before anything is kept or written: no output folder, no temporary folder
    beside it, nothing kept in the cache."""
    data = package.read_bytes()
    (tmp_path / "cut.argosmodel").write_bytes(data[: len(data) * 2 // 3])
    _corrupted(package, tmp_path / "flipped.argosmodel")
    cases = [
        (index_entry((tmp_path / "cut.argosmodel").as_uri()), "not a zip archive"),
        (index_entry((tmp_path / "flipped.argosmodel").as_uri()), "corrupted zip"),
        (index_entry(package.as_uri(), sha256="0" * 64), "but the index gives 0000"),
        (index_entry(package.as_uri(), to_code="de"), "the package translates en-fr, but the index lists it as en-de"),
        (index_entry((tmp_path / "absent.argosmodel").as_uri()), "download failed"),
    ]
    out, cache = tmp_path / "out" / "model", tmp_path / "cache"
    for entry, message in cases:
        index = write_index(tmp_path / "index.json", entry)
        name = f"argos:{entry['from_code']}-{entry['to_code']}"
        status, err = imports(capsys, name, "--argos-index", str(index), "--cache-dir", str(cache), "--out", str(out))
        assert status == 2 and message in err and "no link gave the package" in err, err
        assert not (tmp_path / "out").exists() and left_behind(cache) == [], left_behind(cache)

    # a second link that serves the package is used when the first does not
    good = index_entry((tmp_path / "cut.argosmodel").as_uri())
    good["links"].append(package.as_uri())
    index = write_index(tmp_path / "index.json", good)
    status, err = imports(
        capsys, "argos:en-fr", "--argos-index", str(index), "--cache-dir", str(cache), "--out", str(out)
    )
    assert (status, err) == (0, "")
    assert load_model_dir(out)[2]["imported_from"] == "argos:en-fr"
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["model"]  # no temporary folder beside it
