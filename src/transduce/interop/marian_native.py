"""OPUS-MT's native Marian release: a ``.npz`` of weights, SentencePiece models, ``decoder.yml``, a vocabulary YAML.

    opus-2020-02-26/
      opus.spm32k-spm32k.transformer-align.model1.npz.best-perplexity.npz   weights + "special:model.yml"
      opus.spm32k-spm32k.vocab.yml     piece -> id ("</s>": 0, "<unk>": 1, then the pieces; >>xx<< tokens)
      source.spm, target.spm           SentencePiece models
      decoder.yml                      names the model file and the vocabularies (source first)

Marian names each tensor after its place (``encoder_l1_self_Wq``, ``decoder_l3_context_Wo_ln_scale``,
``decoder_ff_logit_out_b``, ``Wemb``…) and stores projections as (in, out) matrices (x·W). This module
renames them to MarianMT's names, transposes the projections, and hands the result to
:func:`~transduce.interop.marian.convert_release`, so both formats share one conversion (special ids,
vocabulary reordering, position layout): the same weights give the same transduce model from either.

Marian has no padding token and starts the decoder from a zero vector; as MarianMT's converter does,
``<pad>`` is appended to the vocabulary with a zero embedding row and made the decoder's start.
Nothing is unpickled (``numpy.load(allow_pickle=False)``) and YAML is read with ``yaml.safe_load``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..config import ConfigError
from ..data.vocab import SPECIALS
from ..safefiles import BadFileError, read_npz
from .marian import MarianRelease

CONFIG_KEY = "special:model.yml"
FIX = "download the release again (its .zip holds the .npz, decoder.yml, *.vocab.yml, source.spm, target.spm)"
# Marian's per-layer tensor suffix -> MarianMT's name inside ``model.{encoder,decoder}.layers.N``
LAYER_NAMES = {
    "self_Wq": "self_attn.q_proj.weight",
    "self_bq": "self_attn.q_proj.bias",
    "self_Wk": "self_attn.k_proj.weight",
    "self_bk": "self_attn.k_proj.bias",
    "self_Wv": "self_attn.v_proj.weight",
    "self_bv": "self_attn.v_proj.bias",
    "self_Wo": "self_attn.out_proj.weight",
    "self_bo": "self_attn.out_proj.bias",
    "self_Wo_ln_scale": "self_attn_layer_norm.weight",
    "self_Wo_ln_bias": "self_attn_layer_norm.bias",
    "ffn_W1": "fc1.weight",
    "ffn_b1": "fc1.bias",
    "ffn_W2": "fc2.weight",
    "ffn_b2": "fc2.bias",
    "ffn_ffn_ln_scale": "final_layer_norm.weight",
    "ffn_ffn_ln_bias": "final_layer_norm.bias",
    "context_Wq": "encoder_attn.q_proj.weight",
    "context_bq": "encoder_attn.q_proj.bias",
    "context_Wk": "encoder_attn.k_proj.weight",
    "context_bk": "encoder_attn.k_proj.bias",
    "context_Wv": "encoder_attn.v_proj.weight",
    "context_bv": "encoder_attn.v_proj.bias",
    "context_Wo": "encoder_attn.out_proj.weight",
    "context_bo": "encoder_attn.out_proj.bias",
    "context_Wo_ln_scale": "encoder_attn_layer_norm.weight",
    "context_Wo_ln_bias": "encoder_attn_layer_norm.bias",
}
# model.yml settings that must hold for the paper's post-norm Transformer (key -> accepted values)
REQUIRED = {
    "type": ("transformer",),
    "transformer-preprocess": ("",),
    "transformer-postprocess": ("dan",),
    "transformer-postprocess-emb": ("d",),
    "transformer-ffn-depth": (2,),
    "right-left": (False,),
    "transformer-train-position-embeddings": (False,),
    "layer-normalization": (False,),
    "transformer-no-projection": (False,),
    "transformer-decoder-autoreg": ("self-attention",),
    "transformer-tied-layers": ([],),
}
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "swish"}  # Marian's name -> MarianMT's
MAX_POSITIONS = 512  # Marian's sinusoids have no limit; MarianMT's OPUS-MT conversions use 512


def _yaml(text: str, where: str) -> Any:
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # both build plain data only, never objects
    try:
        return yaml.load(text, Loader=loader)
    except yaml.YAMLError as e:
        raise ConfigError(f"{where}: not valid YAML ({str(e).splitlines()[0]})") from None


def read_yaml(path: Path) -> Any:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing (a Marian release needs it: {FIX})")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise BadFileError(f"{path}: not UTF-8 text ({e}): {FIX}") from None
    return _yaml(text, str(path))


def is_native_release(directory: Path) -> bool:
    return (directory / "decoder.yml").is_file() or any(directory.glob("*.npz"))


def _model_yml(arrays: dict[str, np.ndarray], where: str) -> dict[str, Any]:
    raw = arrays.get(CONFIG_KEY)
    if raw is None:
        raise ConfigError(f"{where}: no {CONFIG_KEY!r} entry, so the architecture is unknown (not a Marian model?)")
    text = raw.astype(np.uint8).tobytes().rstrip(b"\x00").decode("utf-8", errors="replace")
    cfg = _yaml(text, f"{where} [{CONFIG_KEY}]")
    if not isinstance(cfg, dict):
        raise ConfigError(f"{where} [{CONFIG_KEY}]: not a YAML mapping")
    return cfg


def marian_config(cfg: dict[str, Any], vocab_sizes: tuple[int, int], pad: int, eos: int, where: str) -> dict[str, Any]:
    """MarianMT's config.json fields for a model.yml; raises naming the first setting transduce cannot run."""
    for key, accepted in REQUIRED.items():
        if key in cfg and cfg[key] not in accepted:
            raise ConfigError(
                f"{where}: key {key!r} is {cfg[key]!r}; transduce imports {accepted[0]!r} only "
                "(the paper's post-norm Transformer)"
            )
    activation = cfg.get("transformer-ffn-activation", "relu")
    if activation not in ACTIVATIONS:
        raise ConfigError(
            f"{where}: key 'transformer-ffn-activation' is {activation!r}; transduce imports "
            f"{' or '.join(map(repr, ACTIVATIONS))}"
        )
    for key in ("dim-emb", "enc-depth", "dec-depth", "transformer-heads", "transformer-dim-ffn"):
        if not isinstance(cfg.get(key), int):
            raise ConfigError(f"{where}: key {key!r} is missing or not an integer")
    tied_all = bool(cfg.get("tied-embeddings-all", False))
    return {
        "model_type": "marian",
        "d_model": cfg["dim-emb"],
        "encoder_layers": cfg["enc-depth"],
        "decoder_layers": cfg["dec-depth"],
        "encoder_attention_heads": cfg["transformer-heads"],
        "decoder_attention_heads": cfg["transformer-heads"],
        "encoder_ffn_dim": cfg["transformer-dim-ffn"],
        "decoder_ffn_dim": cfg["transformer-dim-ffn"],
        "activation_function": ACTIVATIONS[activation],
        "vocab_size": vocab_sizes[0],
        "decoder_vocab_size": vocab_sizes[1],
        "pad_token_id": pad,
        "eos_token_id": eos,
        "decoder_start_token_id": pad,
        "scale_embedding": True,
        "share_encoder_decoder_embeddings": tied_all or bool(cfg.get("tied-embeddings-src", False)),
        "tie_word_embeddings": tied_all or bool(cfg.get("tied-embeddings", False)),
        "dropout": float(cfg.get("transformer-dropout", 0.1)),
        "attention_dropout": float(cfg.get("transformer-dropout-attention", 0.0)),
        "activation_dropout": float(cfg.get("transformer-dropout-ffn", 0.0)),
        "max_position_embeddings": MAX_POSITIONS,
    }


def marian_tensors(arrays: dict[str, np.ndarray], hf_cfg: dict[str, Any], where: str) -> dict[str, torch.Tensor]:
    """Marian's tensors under MarianMT's names: projections transposed, a zero ``<pad>`` row appended."""
    out: dict[str, torch.Tensor] = {}
    left = set(arrays) - {CONFIG_KEY}

    def take(name: str) -> np.ndarray:
        if name not in arrays:
            raise ConfigError(f"{where}: missing tensor {name!r}")
        left.discard(name)
        return np.asarray(arrays[name], dtype=np.float32)

    def with_pad(table: np.ndarray) -> torch.Tensor:  # (V, d) -> (V + 1, d)
        return torch.from_numpy(np.concatenate([table, np.zeros((1, table.shape[1]), np.float32)]))

    for side, depth in (("encoder", hf_cfg["encoder_layers"]), ("decoder", hf_cfg["decoder_layers"])):
        for layer in range(1, depth + 1):
            for suffix, name in LAYER_NAMES.items():
                if side == "encoder" and suffix.startswith("context_"):
                    continue
                value = take(f"{side}_l{layer}_{suffix}")
                if name.endswith(".weight") and "layer_norm" not in name:
                    tensor = torch.from_numpy(value.T.copy())  # (in, out) -> (out, in)
                else:
                    tensor = torch.from_numpy(value.reshape(-1).copy())  # (1, n) -> (n,)
                out[f"model.{side}.layers.{layer - 1}.{name}"] = tensor
    if hf_cfg["share_encoder_decoder_embeddings"]:
        out["model.shared.weight"] = with_pad(take("Wemb"))
    else:
        out["model.encoder.embed_tokens.weight"] = with_pad(take("encoder_Wemb"))
        out["model.decoder.embed_tokens.weight"] = with_pad(take("decoder_Wemb"))
    if not hf_cfg["tie_word_embeddings"]:
        out["lm_head.weight"] = with_pad(take("decoder_ff_logit_out_W").T)  # (d, V) -> (V + 1, d)
    if "decoder_ff_logit_out_b" in arrays:
        bias = take("decoder_ff_logit_out_b").reshape(1, -1)  # (1, V)
        out["final_logits_bias"] = torch.from_numpy(np.concatenate([bias, np.zeros((1, 1), np.float32)], axis=1))
    if left:
        raise ConfigError(
            f"{where}: tensors transduce cannot place: {sorted(left)[:5]} (a Marian architecture "
            "other than the paper's Transformer?)"
        )
    return out


def _vocab(path: Path) -> dict[str, int]:
    vocab = read_yaml(path)
    if not isinstance(vocab, dict) or not all(isinstance(v, int) for v in vocab.values()):
        raise ConfigError(f"{path}: expected a YAML mapping of piece -> integer id")
    vocab = {str(k): v for k, v in vocab.items()}
    if SPECIALS["eos"] not in vocab:
        raise ConfigError(f"{path}: no {SPECIALS['eos']!r} entry")
    if SPECIALS["pad"] not in vocab:
        vocab[SPECIALS["pad"]] = max(vocab.values()) + 1  # Marian has none: its row is the zero start vector
    return vocab


def _decoder_files(directory: Path) -> tuple[Path, list[Path]]:
    """The weights file and the vocabulary files (source, target) that decoder.yml names, else the only ones."""
    decoder = directory / "decoder.yml"
    settings = read_yaml(decoder) if decoder.is_file() else {}
    if not isinstance(settings, dict):
        raise ConfigError(f"{decoder}: not a YAML mapping")
    models = settings.get("models") or sorted(p.name for p in directory.glob("*.npz"))
    if len(models) != 1:
        raise ConfigError(
            f"{decoder if decoder.is_file() else directory}: expected one .npz model, found "
            f"{len(models)} ({', '.join(map(str, models)) or 'none'}); transduce imports one model"
        )
    vocabs = settings.get("vocabs") or sorted(p.name for p in directory.glob("*.vocab.yml"))[:1] * 2
    if len(vocabs) != 2:
        raise ConfigError(f"{decoder}: key 'vocabs' should name two files (source, target), got {vocabs!r}")
    # releases list paths relative to where they were trained: look for their file names in the directory
    return directory / Path(str(models[0])).name, [directory / Path(str(v)).name for v in vocabs]


def read_native_release(directory: str | Path) -> MarianRelease:
    """Read a native Marian release directory into a :class:`~transduce.interop.marian.MarianRelease`."""
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory}: not a directory")
    weights, (src_path, tgt_path) = _decoder_files(directory)
    src_vocab = _vocab(src_path)
    tgt_vocab = src_vocab if tgt_path == src_path else _vocab(tgt_path)
    spm = {}
    for name in ("source.spm", "target.spm"):
        if not (directory / name).is_file():
            raise FileNotFoundError(f"{directory / name}: missing (a Marian release needs it: {FIX})")
        spm[name] = (directory / name).read_bytes()
    arrays = read_npz(weights, FIX)
    cfg = _model_yml(arrays, str(weights))
    if src_vocab[SPECIALS["pad"]] != tgt_vocab[SPECIALS["pad"]]:
        raise ConfigError(
            f"{src_path}, {tgt_path}: source and target vocabularies of different sizes; "
            "transduce imports Marian models whose vocabularies have one size"
        )
    pad, eos = src_vocab[SPECIALS["pad"]], src_vocab[SPECIALS["eos"]]
    if tgt_vocab[SPECIALS["eos"]] != eos:
        raise ConfigError(f"{tgt_path}: '</s>' has id {tgt_vocab[SPECIALS['eos']]}, the source's has {eos}")
    hf_cfg = marian_config(cfg, (pad + 1, pad + 1), pad, eos, f"{weights} [{CONFIG_KEY}]")
    tensors = marian_tensors(arrays, hf_cfg, str(weights))
    where = {
        "config": f"{weights} [{CONFIG_KEY}]",
        "src_vocab": str(src_path),
        "tgt_vocab": str(tgt_path),
        "source.spm": str(directory / "source.spm"),
        "target.spm": str(directory / "target.spm"),
        "weights": str(weights),
    }
    return MarianRelease(directory, hf_cfg, src_vocab, tgt_vocab, spm["source.spm"], spm["target.spm"], tensors, where)
