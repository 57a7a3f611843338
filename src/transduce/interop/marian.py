"""HuggingFace MarianMT directories: export a transduce model to one, import one from disk.

A MarianMT model (``transformers.MarianMTModel``, the architecture of the OPUS-MT models)
is the paper's base design: post-norm residuals (§3.1), sinusoidal positions (§3.5),
embeddings × √d_model and tied embeddings (§3.4), ReLU feed-forward (§3.3); OPUS-MT models often add a
bias to the logits (``final_logits_bias``, transduce's ``output_bias``) and some use Swish feed-forwards
(``activation_function: swish``, transduce's ``activation = "swish"``). Three things differ:

* **Position layout.** HF's sinusoid table puts every sine in the first half of the
  dimensions and every cosine in the second half; ours interleaves them (§3.5:
  PE(pos, 2i) = sin, PE(pos, 2i+1) = cos), and HF recomputes its table on load, so it
  cannot be overwritten. Every operation on the residual stream is equivariant under a
  permutation of the d_model dimensions (LayerNorm, residual adds, the projections' input
  columns and output rows), so the export permutes the model dimensions consistently,
  ``hf_dim[k] = our_dim[PERM[k]]`` with PERM = (0, 2, 4, …, 1, 3, 5, …), which maps our
  table onto theirs exactly. Attention heads and the feed-forward hidden units are untouched.
* **Fused projections.** Our self-attention keeps Q, K, V in one (3·d, d) matrix and the
  encoder–decoder attention K, V in one (2·d, d) matrix; Marian keeps them separate.
* **Special tokens.** Marian has no ``<s>``: it starts the decoder from its pad token, whose
  embedding is zero (OPUS-MT: ``</s>`` = 0, ``<unk>`` = 1, ``<pad>`` = V−1). HF reads every
  special id from config.json, so an export keeps our ids (pad 0, unk 1, eos 3) and sets
  ``decoder_start_token_id`` = our bos (2). An import re-orders the vocabulary into our
  layout (pad, unk, bos, eos, then the rest in Marian's order); when the decoder start is the
  pad token, our ``<s>`` gets a copy of the pad row, so the vocabulary grows by one.

The tokenizer files are ``source.spm``/``target.spm`` (SentencePiece models) and
``vocab.json`` (piece -> id; ``target_vocab.json`` too for separate vocabularies). Nothing
here unpickles: weights are safetensors, the rest JSON.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from ..config import ConfigError
from ..data.vocab import SPECIALS, Vocab, Vocabs, language_tokens, reorder_spm
from ..model import ModelConfig, Transformer
from ..safefiles import read_json, read_safetensors

WEIGHTS = "model.safetensors"
FIX = "download or export the MarianMT directory again"
# HF's activation_function -> ModelConfig.activation (HF's "swish" and "silu" are both x·σ(x))
HF_ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "swish", "silu": "swish"}


def offline() -> None:
    """Make sure nothing in transformers / huggingface_hub tries the network."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"


def interleave_to_halves(d_model: int) -> torch.Tensor:
    """PERM with ``hf[..., k] = ours[..., PERM[k]]``: even dims (sines) first, then odd (cosines)."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def check_exportable(cfg: ModelConfig) -> None:
    """Raise naming every config key that MarianMT cannot represent, all of them at once."""
    unsupported = {
        "d_k": (
            cfg.d_k is None or cfg.d_k * cfg.n_heads == cfg.d_model,
            "MarianMT's queries and keys are d_model / h wide per head, as its values",
        ),
        "norm": (cfg.norm == "post", "MarianMT is post-norm only"),
        "positions": (cfg.positions == "sinusoidal", "MarianMT has sinusoidal positions only"),
        "attention": (cfg.attention == "scaled_dot", "MarianMT has scaled dot-product attention only"),
        "attention_window": (cfg.attention_window is None, "MarianMT has no restricted self-attention"),
        "scale_embeddings": (cfg.scale_embeddings, "exports assume embeddings × √d_model"),
        "layer_norm_eps": (cfg.layer_norm_eps == 1e-5, "MarianMT's LayerNorm epsilon is fixed at 1e-5"),
    }
    problems = [
        f"key {key!r}: cannot export {getattr(cfg, key)!r}: {why}" for key, (ok, why) in unsupported.items() if not ok
    ]
    if problems:
        raise ConfigError("; ".join(problems))


# ----------------------------------------------------------------------------- weight names
def _layer_pairs(prefix_ours: str, prefix_hf: str, decoder: bool) -> list[tuple[str, str, str]]:
    """(our name, HF name, which dims are model dims) for one layer's plain (unfused) tensors.

    The third field says where the residual-stream dimension sits: ``in`` (weight
    columns), ``out`` (weight rows / bias), ``vec`` (LayerNorm).
    """
    o, h = prefix_ours, prefix_hf
    pairs = [
        (f"{o}.self_attn.out_proj.weight", f"{h}.self_attn.out_proj.weight", "out"),
        (f"{o}.self_attn.out_proj.bias", f"{h}.self_attn.out_proj.bias", "out"),
        (f"{o}.ff.w1.weight", f"{h}.fc1.weight", "in"),
        (f"{o}.ff.w1.bias", f"{h}.fc1.bias", "none"),
        (f"{o}.ff.w2.weight", f"{h}.fc2.weight", "out"),
        (f"{o}.ff.w2.bias", f"{h}.fc2.bias", "out"),
    ]
    norms = [("res_self" if decoder else "res_attn", "self_attn_layer_norm"), ("res_ff", "final_layer_norm")]
    if decoder:
        norms.append(("res_cross", "encoder_attn_layer_norm"))
        pairs += [
            (f"{o}.cross_attn.q_proj.weight", f"{h}.encoder_attn.q_proj.weight", "in"),
            (f"{o}.cross_attn.q_proj.bias", f"{h}.encoder_attn.q_proj.bias", "none"),
            (f"{o}.cross_attn.out_proj.weight", f"{h}.encoder_attn.out_proj.weight", "out"),
            (f"{o}.cross_attn.out_proj.bias", f"{h}.encoder_attn.out_proj.bias", "out"),
        ]
    for ours, theirs in norms:
        pairs += [(f"{o}.{ours}.norm.{p}", f"{h}.{theirs}.{p}", "vec") for p in ("weight", "bias")]
    return pairs


def _fused(prefix_ours: str, prefix_hf: str, decoder: bool) -> list[tuple[str, list[str]]]:
    """Fused projections: (our name, HF names of its row blocks in order); input dims are model dims."""
    o, h = prefix_ours, prefix_hf
    out = []
    for p in ("weight", "bias"):
        out.append((f"{o}.self_attn.qkv_proj.{p}", [f"{h}.self_attn.{x}_proj.{p}" for x in "qkv"]))
        if decoder:
            out.append((f"{o}.cross_attn.kv_proj.{p}", [f"{h}.encoder_attn.{x}_proj.{p}" for x in "kv"]))
    return out


def _layers(cfg: ModelConfig):
    for i in range(cfg.encoder_layers):
        yield f"encoder.layers.{i}", f"model.encoder.layers.{i}", False
    for i in range(cfg.decoder_layers):
        yield f"decoder.layers.{i}", f"model.decoder.layers.{i}", True


def _permute(t: torch.Tensor, where: str, perm: torch.Tensor) -> torch.Tensor:
    if where == "in" or (where == "out" and t.dim() == 1) or where == "vec":
        return t.index_select(t.dim() - 1, perm).contiguous()
    if where == "out":
        return t.index_select(0, perm).contiguous()
    return t.contiguous()


# ----------------------------------------------------------------------------- state dicts
def to_marian_state(model: Transformer) -> dict[str, torch.Tensor]:
    """Our state dict -> MarianMTModel's (tied tensors stored once, under HF's canonical names)."""
    cfg = model.config
    check_exportable(cfg)
    ours = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    perm = interleave_to_halves(cfg.d_model)
    hf: dict[str, torch.Tensor] = {}
    for o, h, decoder in _layers(cfg):
        for a, b, where in _layer_pairs(o, h, decoder):
            hf[b] = _permute(ours[a], where, perm)
        for a, names in _fused(o, h, decoder):
            for b, block in zip(names, ours[a].chunk(len(names), dim=0)):
                hf[b] = _permute(block, "in" if block.dim() == 2 else "none", perm)
    src = _permute(ours["src_embed.token.weight"], "in", perm)
    tgt = _permute(ours["tgt_embed.token.weight"], "in", perm)
    if cfg.tie_embeddings == "all":
        hf["model.shared.weight"] = src
    else:
        hf["model.encoder.embed_tokens.weight"] = src
        hf["model.decoder.embed_tokens.weight"] = tgt
    if cfg.tie_embeddings == "none":
        hf["lm_head.weight"] = _permute(ours["generator.weight"], "in", perm)
    bias = ours.get("generator.bias")  # over the vocabulary: no model dimension to permute
    hf["final_logits_bias"] = (bias if bias is not None else torch.zeros(cfg.target_vocab_size)).reshape(1, -1)
    return hf


def from_marian_state(
    hf: dict[str, torch.Tensor], cfg: ModelConfig, rows_src: torch.Tensor, rows_tgt: torch.Tensor, where: str
) -> dict[str, torch.Tensor]:
    """MarianMTModel's state dict -> ours. ``rows_*[i]`` is the Marian id of our token i."""
    perm = interleave_to_halves(cfg.d_model)
    inv = torch.argsort(perm)  # ours[..., j] = hf[..., inv[j]]

    def get(name: str) -> torch.Tensor:
        if name not in hf:
            raise ConfigError(f"{where}: missing tensor {name!r}")
        return hf[name].float()

    ours: dict[str, torch.Tensor] = {}
    for o, h, decoder in _layers(cfg):
        for a, b, kind in _layer_pairs(o, h, decoder):
            ours[a] = _permute(get(b), kind, inv)
        for a, names in _fused(o, h, decoder):
            ours[a] = torch.cat([_permute(get(b), "in" if get(b).dim() == 2 else "none", inv) for b in names])
    shared = "model.shared.weight" in hf
    src = get("model.shared.weight" if shared else "model.encoder.embed_tokens.weight")
    tgt = get("model.shared.weight" if shared else "model.decoder.embed_tokens.weight")
    for side, table, rows in (("source", src, rows_src), ("target", tgt, rows_tgt)):
        if int(rows.max()) >= table.size(0):
            raise ConfigError(
                f"{where}: the {side} vocabulary has id {int(rows.max())} but the embedding "
                f"has {table.size(0)} rows (vocab.json and the weights do not match)"
            )
    ours["src_embed.token.weight"] = _permute(src.index_select(0, rows_src), "in", inv)
    ours["tgt_embed.token.weight"] = _permute(tgt.index_select(0, rows_tgt), "in", inv)
    ours["generator.weight"] = ours["tgt_embed.token.weight"]
    if cfg.tie_embeddings == "none":
        ours["generator.weight"] = _permute(get("lm_head.weight").index_select(0, rows_tgt), "in", inv)
    if cfg.output_bias:
        bias = get("final_logits_bias")
        if bias.numel() != tgt.size(0):
            raise ConfigError(
                f"{where}: final_logits_bias has shape {tuple(bias.shape)}, the target embedding {tgt.size(0)} rows"
            )
        ours["generator.bias"] = bias.reshape(-1).index_select(0, rows_tgt)
    return ours


def has_output_bias(hf: dict[str, torch.Tensor]) -> bool:
    """Whether a MarianMT state dict's ``final_logits_bias`` is there and not all zeros (a zero one, as HF
    writes for models without a bias, imports as the paper's bias-free projection)."""
    bias = hf.get("final_logits_bias")
    return bias is not None and bool(bias.abs().max() > 0)


def marian_config(cfg: ModelConfig) -> dict[str, Any]:
    """config.json for MarianMTModel, with our special ids (see the module docstring)."""
    return {
        "architectures": ["MarianMTModel"],
        "model_type": "marian",
        "vocab_size": cfg.vocab_size,
        "decoder_vocab_size": cfg.target_vocab_size,
        "max_position_embeddings": cfg.max_positions,
        "encoder_layers": cfg.encoder_layers,
        "decoder_layers": cfg.decoder_layers,
        "encoder_ffn_dim": cfg.d_ff,
        "decoder_ffn_dim": cfg.d_ff,
        "encoder_attention_heads": cfg.n_heads,
        "decoder_attention_heads": cfg.n_heads,
        "d_model": cfg.d_model,
        "activation_function": cfg.activation,  # HF's "gelu" is the exact erf form, "swish" SiLU, as ours
        "dropout": cfg.dropout,
        "attention_dropout": cfg.attention_dropout,
        "activation_dropout": cfg.activation_dropout,
        "encoder_layerdrop": 0.0,
        "decoder_layerdrop": 0.0,
        "scale_embedding": cfg.scale_embeddings,
        "normalize_before": False,
        "static_position_embeddings": True,
        "share_encoder_decoder_embeddings": cfg.tie_embeddings == "all",
        "tie_word_embeddings": cfg.tie_embeddings != "none",
        "pad_token_id": cfg.pad_id,
        "eos_token_id": cfg.eos_id,
        "forced_eos_token_id": cfg.eos_id,
        "decoder_start_token_id": cfg.bos_id,
        "is_encoder_decoder": True,
        "use_cache": True,
    }


# ----------------------------------------------------------------------------- export
def export_marian(
    model: Transformer, vocabs: Vocabs, out: str | Path, meta: dict[str, Any] | None = None, *, ids_only: bool = False
) -> Path:
    """Write a MarianMT directory that ``transformers`` loads offline (model + MarianTokenizer).

    ``ids_only=True`` also exports a lowercasing model, for callers that feed token ids to
    ``generate`` themselves (the decoding benchmark); its MarianTokenizer must then not be used on text.
    """
    if vocabs.lowercase and not ids_only:  # MarianTokenizer would feed cased text to a model that never saw any
        raise ValueError(
            "this model's vocabulary lowercases its input (prepare --lowercase), which "
            "MarianTokenizer cannot do: export a model prepared without --lowercase"
        )
    cfg = model.config
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file(to_marian_state(model), str(out / WEIGHTS), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(marian_config(cfg), indent=2) + "\n")
    generation = {
        "decoder_start_token_id": cfg.bos_id,
        "eos_token_id": cfg.eos_id,
        "pad_token_id": cfg.pad_id,
        "forced_eos_token_id": cfg.eos_id,
        "max_length": cfg.max_positions,
        "num_beams": 4,
    }
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    vocabs.src.save(out / "source.spm")
    vocabs.tgt.save(out / "target.spm")
    separate = not vocabs.shared
    _write_json(out / "vocab.json", _piece_ids(vocabs.src))
    if separate:
        _write_json(out / "target_vocab.json", _piece_ids(vocabs.tgt))
    else:
        (out / "target_vocab.json").unlink(missing_ok=True)  # left by an earlier export into ``out``
    meta = meta or {}
    tokenizer = {
        "tokenizer_class": "MarianTokenizer",
        "source_lang": meta.get("src_lang"),
        "target_lang": meta.get("tgt_lang"),
        "unk_token": SPECIALS["unk"],
        "eos_token": SPECIALS["eos"],
        "pad_token": SPECIALS["pad"],
        "model_max_length": cfg.max_positions,
        "separate_vocabs": separate,
    }
    _write_json(out / "tokenizer_config.json", tokenizer)
    _write_json(
        out / "special_tokens_map.json",
        {"unk_token": SPECIALS["unk"], "eos_token": SPECIALS["eos"], "pad_token": SPECIALS["pad"]},
    )
    return out


def _piece_ids(vocab: Vocab) -> dict[str, int]:
    return {vocab.sp.id_to_piece(i): i for i in range(len(vocab))}


def _write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n")


# ----------------------------------------------------------------------------- import
def _read_json(path: Path) -> Any:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing (a MarianMT directory needs it)")
    return read_json(path, FIX)


def config_from_marian(hf: dict[str, Any], where: str) -> tuple[dict[str, Any], str]:
    """Check a MarianMT config.json describes the paper's architecture.

    Returns our ModelConfig fields (without vocabulary sizes) and how Marian ties its
    embeddings: ``all`` (shared), ``target`` (decoder input = output) or ``none``.
    """
    if hf.get("model_type") != "marian":
        raise ConfigError(f"{where}: model_type is {hf.get('model_type')!r}, not 'marian' (not a MarianMT directory)")
    if hf.get("scale_embedding", True) is not True:
        raise ConfigError(
            f"{where}: key 'scale_embedding' is {hf.get('scale_embedding')!r}; transduce imports only True"
        )
    activation = HF_ACTIVATIONS.get(hf.get("activation_function", "relu"))
    if activation is None:
        raise ConfigError(
            f"{where}: key 'activation_function' is {hf.get('activation_function')!r}; transduce imports "
            f"{', '.join(map(repr, HF_ACTIVATIONS))}"
        )
    for key in ("normalize_before", "normalize_embedding", "add_final_layer_norm"):
        if hf.get(key):
            raise ConfigError(f"{where}: key {key!r} is true; transduce imports post-norm Marian models only")
    for key in (
        "d_model",
        "encoder_layers",
        "decoder_layers",
        "encoder_ffn_dim",
        "encoder_attention_heads",
        "vocab_size",
        "pad_token_id",
        "eos_token_id",
    ):
        if not isinstance(hf.get(key), (int, list)):
            raise ConfigError(f"{where}: key {key!r} is missing or not an integer")
    for a, b in (("encoder_attention_heads", "decoder_attention_heads"), ("encoder_ffn_dim", "decoder_ffn_dim")):
        if hf.get(b, hf[a]) != hf[a]:
            raise ConfigError(f"{where}: key {b!r}={hf.get(b)} differs from {a!r}={hf[a]}; transduce needs them equal")
    if hf.get("share_encoder_decoder_embeddings", True):
        tie = "all"
    else:
        tie = "target" if hf.get("tie_word_embeddings", True) else "none"
    fields = dict(
        encoder_layers=hf["encoder_layers"],
        decoder_layers=hf["decoder_layers"],
        d_model=hf["d_model"],
        d_ff=hf["encoder_ffn_dim"],
        n_heads=hf["encoder_attention_heads"],
        dropout=float(hf.get("dropout", 0.1)),
        attention_dropout=float(hf.get("attention_dropout", 0.0)),
        activation_dropout=float(hf.get("activation_dropout", 0.0)),
        activation=activation,
        max_positions=int(hf.get("max_position_embeddings", 1024)),
    )
    return fields, tie


def _our_order(vocab: dict[str, int], pad: int, eos: int, start: int, where: str) -> tuple[list[str], torch.Tensor]:
    """Pieces in our id order and, for each, the Marian row it takes its embedding from."""
    by_id = {i: p for p, i in vocab.items()}
    if len(by_id) != len(vocab):
        raise ConfigError(f"{where}: two pieces share an id")
    if SPECIALS["unk"] not in vocab:
        raise ConfigError(f"{where}: no {SPECIALS['unk']!r} piece")
    for name, i in (("pad_token_id", pad), ("eos_token_id", eos), ("decoder_start_token_id", start)):
        if i not in by_id:
            raise ConfigError(f"{where}: config.json {name}={i} is not an id of the vocabulary")
    unk = vocab[SPECIALS["unk"]]
    specials = [(SPECIALS["pad"], pad), (SPECIALS["unk"], unk), (SPECIALS["bos"], start), (SPECIALS["eos"], eos)]
    taken = {pad, unk, start, eos}
    rest = [(by_id[i], i) for i in sorted(by_id) if i not in taken]
    clash = [p for p, _ in rest if p in SPECIALS.values()]
    if clash:
        raise ConfigError(f"{where}: piece {clash[0]!r} is not at the id config.json gives its role")
    pieces = specials + rest
    return [p for p, _ in pieces], torch.tensor([i for _, i in pieces])


@dataclass
class MarianRelease:
    """A Marian model in MarianMT's terms (config.json keys, tensor names, piece -> id maps), whichever files
    it came from: a MarianMT directory (:func:`read_marian_dir`) or a native release (``marian_native.py``)."""

    origin: Path
    config: dict[str, Any]
    src_vocab: dict[str, int]
    tgt_vocab: dict[str, int]
    src_spm: bytes
    tgt_spm: bytes
    tensors: dict[str, torch.Tensor]
    where: dict[str, str]  # file names for messages: config, src_vocab, tgt_vocab, source.spm, target.spm, weights
    src_lang: str = ""
    tgt_lang: str = ""


def read_marian_dir(hf_dir: str | Path) -> MarianRelease:
    """The files of a MarianMT directory (config.json, model.safetensors, source/target.spm, vocab.json)."""
    hf_dir = Path(hf_dir)
    if not hf_dir.is_dir():
        raise FileNotFoundError(f"{hf_dir}: not a directory")
    hf_cfg = _read_json(hf_dir / "config.json")
    config_from_marian(hf_cfg, str(hf_dir / "config.json"))  # the architecture first: the clearest error
    tok = _read_json(hf_dir / "tokenizer_config.json") if (hf_dir / "tokenizer_config.json").is_file() else {}
    src_vocab = _read_json(hf_dir / "vocab.json")
    separate = bool(tok.get("separate_vocabs")) or (hf_dir / "target_vocab.json").is_file()
    tgt_name = "target_vocab.json" if separate else "vocab.json"
    tgt_vocab = _read_json(hf_dir / tgt_name) if separate else src_vocab
    spm = {}
    for name in ("source.spm", "target.spm"):
        if not (hf_dir / name).is_file():
            raise FileNotFoundError(f"{hf_dir / name}: missing (a MarianMT directory needs it)")
        spm[name] = (hf_dir / name).read_bytes()
    weights = hf_dir / WEIGHTS
    if not weights.is_file():
        pickled = [p.name for p in hf_dir.glob("*.bin")]
        also = f"; {pickled[0]} is a pickle, which transduce never loads" if pickled else ""
        raise FileNotFoundError(
            f"{weights}: missing (transduce imports safetensors weights only{also}; "
            "download the repository's model.safetensors)"
        )
    where = {
        "config": str(hf_dir / "config.json"),
        "src_vocab": str(hf_dir / "vocab.json"),
        "tgt_vocab": str(hf_dir / tgt_name),
        "source.spm": str(hf_dir / "source.spm"),
        "target.spm": str(hf_dir / "target.spm"),
        "weights": str(weights),
    }
    return MarianRelease(
        hf_dir,
        hf_cfg,
        src_vocab,
        tgt_vocab,
        spm["source.spm"],
        spm["target.spm"],
        read_safetensors(weights, FIX),
        where,
        tok.get("source_lang") or "",
        tok.get("target_lang") or "",
    )


def import_marian(hf_dir: str | Path) -> tuple[Transformer, Vocabs, dict[str, Any]]:
    """Read a MarianMT directory (config.json, model.safetensors, source/target.spm, vocab.json)."""
    return convert_release(read_marian_dir(hf_dir))


def convert_release(release: MarianRelease) -> tuple[Transformer, Vocabs, dict[str, Any]]:
    """A transduce model, vocabularies and meta from a :class:`MarianRelease`."""
    hf_cfg, where = release.config, release.where
    fields, tie = config_from_marian(hf_cfg, where["config"])
    pad = hf_cfg.get("pad_token_id")
    eos = hf_cfg.get("eos_token_id")
    start = hf_cfg.get("decoder_start_token_id", pad)
    if isinstance(eos, list):
        eos = eos[0]
    src_order, src_rows = _our_order(release.src_vocab, pad, eos, start, where["src_vocab"])
    tgt_order, tgt_rows = _our_order(release.tgt_vocab, pad, eos, start, where["tgt_vocab"])
    src_proto, src_dropped = reorder_spm(release.src_spm, src_order, where["source.spm"])
    tgt_proto, tgt_dropped = reorder_spm(release.tgt_spm, tgt_order, where["target.spm"])
    same = src_proto == tgt_proto
    src = Vocab(src_proto)
    vocabs = Vocabs(src, src) if same else Vocabs(src, Vocab(tgt_proto))
    # Marian's shared matrix with two SentencePiece models becomes two equal tables tied on the target side.
    tie_cfg = "all" if tie == "all" and same else ("none" if tie == "none" else "target")
    tensors, weights = release.tensors, where["weights"]
    cfg = ModelConfig(
        **fields,
        vocab_size=len(src_order),
        tie_embeddings=tie_cfg,
        tgt_vocab_size=None if tie_cfg == "all" else len(tgt_order),
        output_bias=has_output_bias(tensors),
    )
    embedding = tensors.get("model.shared.weight", tensors.get("model.encoder.embed_tokens.weight"))
    if embedding is not None and embedding.size(0) != hf_cfg["vocab_size"]:
        raise ConfigError(
            f"{weights}: the embedding has {embedding.size(0)} rows but "
            f"{where['config']} says vocab_size={hf_cfg['vocab_size']}"
        )
    state = from_marian_state(tensors, cfg, src_rows, tgt_rows, weights)
    model = Transformer(cfg)
    expected = set(model.state_dict())
    missing = sorted(expected - set(state))
    if missing:
        raise ConfigError(f"{weights}: cannot fill {missing[:3]} from the file")
    for name, tensor in state.items():
        if name in expected and model.state_dict()[name].shape != tensor.shape:
            raise ConfigError(
                f"{weights}: tensor for {name} has shape {tuple(tensor.shape)}, {where['config']} "
                f"implies {tuple(model.state_dict()[name].shape)}"
            )
    model.load_state_dict(state, strict=False)
    meta = {
        "imported_from": str(release.origin.resolve()),
        "src_lang": release.src_lang,
        "tgt_lang": release.tgt_lang,
        "spm_pieces_without_id": len(src_dropped) + (0 if same else len(tgt_dropped)),
    }
    langs = language_tokens(vocabs.src)
    if langs:
        meta["target_langs"] = sorted(langs)
    return model.eval(), vocabs, meta
