"""Export a transduce model to CTranslate2 through its own converter and spec API.

CTranslate2's ``TransformerSpec`` describes exactly the paper's model when built with
``pre_norm=False`` (post-norm, §3.1) and ReLU (§3.3): fused Q/K/V projections like ours, a
fused K/V projection for encoder–decoder attention, embeddings × √d_model (§3.4), and an
explicit position table — we hand it our interleaved sinusoids (§3.5), so no dimension
permutation is needed here (unlike the MarianMT export). GELU and Swish feed-forwards take its
``Activation.GELU`` / ``SWISH``; the output projection's bias (zeros without ``output_bias``) is its
``projection.bias``.

The other switches map as follows (:func:`check_ct2_exportable` names every one that does not):

========================  ====================================================================
``norm = "pre"``          ``pre_norm=True``: each sub-layer's LayerNorm is CT2's ``layer_norm`` of that
                          sub-layer, and the stacks' final norms are ``encoder/layer_norm``, ``decoder/layer_norm``
``positions = "learned"`` the learned table is the ``position_encodings`` table (CT2 adds any table)
``scale_embeddings``      ``scale_embeddings`` of the encoder and the decoder
``layer_norm_eps``        the config's ``layer_norm_epsilon``
``source_eos = false``    ``add_source_eos = false``
========================  ====================================================================

The vocabulary is the list of SentencePiece pieces in id order; CTranslate2 appends
``</s>`` to the source (our source is tokens + eos) and starts the decoder from ``<s>``
(our bos). The directory also receives ``source.spm``/``target.spm`` for tokenisation.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..config import ConfigError
from ..data.vocab import SPECIALS, Vocab, Vocabs
from ..model import ModelConfig, Transformer
from ..model.embeddings import sinusoid_table

CT2_ACTIVATIONS = {"relu": "RELU", "gelu": "GELU", "swish": "SWISH"}  # model.activation -> ct2's Activation
# rows of an exported sinusoid table at least: callers such as argostranslate leave CTranslate2's
# max_decoding_length at its default, 256, and CTranslate2 stops with an error past the table's last row
CT2_MIN_POSITIONS = 1024
QUANTIZATIONS = ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16", "float32")


def _require():
    try:
        import ctranslate2
    except ImportError as e:
        raise ValueError(
            "exporting to CTranslate2 needs the ctranslate2 package (pip install 'transduce[interop]')"
        ) from e
    return ctranslate2


def check_ct2_exportable(cfg: ModelConfig) -> None:
    """Raise one :class:`ConfigError` naming every config key that CTranslate2's ``TransformerSpec`` cannot
    represent (the others map as the module docstring says)."""
    unsupported = {
        "attention": (cfg.attention == "scaled_dot", "CTranslate2 has scaled dot-product attention only"),
        "attention_window": (cfg.attention_window is None, "CTranslate2's TransformerSpec has no restricted window"),
        "d_k": (
            cfg.d_k is None or cfg.d_k * cfg.n_heads == cfg.d_model,
            "CTranslate2 gives queries, keys and values one head width",
        ),
    }
    bad = [f"key {key!r} = {getattr(cfg, key)!r}: {why}" for key, (ok, why) in unsupported.items() if not ok]
    if bad:
        raise ConfigError("cannot export to CTranslate2: " + "; ".join(bad))


def build_spec(model: Transformer, vocabs: Vocabs):
    """A filled ``ctranslate2.specs.TransformerSpec`` for ``model``."""
    _require()
    from ctranslate2.specs import common_spec, transformer_spec

    cfg = model.config
    check_ct2_exportable(cfg)
    # copies: CTranslate2's quantisation scales the arrays in place, which would change the model's own weights
    w = {k: v.detach().float().cpu().numpy().copy() for k, v in model.state_dict().items()}
    spec = transformer_spec.TransformerSpec.from_config(
        (cfg.encoder_layers, cfg.decoder_layers),
        cfg.n_heads,
        pre_norm=cfg.norm == "pre",
        activation=getattr(common_spec.Activation, CT2_ACTIVATIONS[cfg.activation]),
    )

    def positions(embed) -> np.ndarray:  # (rows, d_model): our interleaved sinusoids or the learned table
        if cfg.positions == "sinusoidal":  # the same rows, and more: CTranslate2 may decode past max_positions
            return sinusoid_table(max(cfg.max_positions, CT2_MIN_POSITIONS), cfg.d_model).numpy()
        return embed.positions.weight.detach().float().cpu().numpy().copy()

    def linear(target, name: str) -> None:
        target.weight = w[f"{name}.weight"]
        target.bias = w[f"{name}.bias"]

    def norm(target, name: str) -> None:
        target.gamma, target.beta = w[f"{name}.weight"], w[f"{name}.bias"]

    def ffn(target, prefix: str) -> None:
        linear(target.linear_0, f"{prefix}.ff.w1")
        linear(target.linear_1, f"{prefix}.ff.w2")
        norm(target.layer_norm, f"{prefix}.res_ff.norm")

    spec.encoder.embeddings[0].weight = w["src_embed.token.weight"]
    spec.encoder.position_encodings.encodings = positions(model.src_embed)
    spec.encoder.scale_embeddings = cfg.scale_embeddings
    if cfg.norm == "pre":
        norm(spec.encoder.layer_norm, "encoder.final_norm")
    for i, layer in enumerate(spec.encoder.layer):
        p = f"encoder.layers.{i}"
        linear(layer.self_attention.linear[0], f"{p}.self_attn.qkv_proj")
        linear(layer.self_attention.linear[1], f"{p}.self_attn.out_proj")
        norm(layer.self_attention.layer_norm, f"{p}.res_attn.norm")
        ffn(layer.ffn, p)
    spec.decoder.embeddings.weight = w["tgt_embed.token.weight"]
    spec.decoder.position_encodings.encodings = positions(model.tgt_embed)
    spec.decoder.scale_embeddings = cfg.scale_embeddings
    if cfg.norm == "pre":
        norm(spec.decoder.layer_norm, "decoder.final_norm")
    spec.decoder.projection.weight = w["generator.weight"]
    spec.decoder.projection.bias = w.get("generator.bias", np.zeros(cfg.target_vocab_size, dtype=np.float32))
    for i, layer in enumerate(spec.decoder.layer):
        p = f"decoder.layers.{i}"
        linear(layer.self_attention.linear[0], f"{p}.self_attn.qkv_proj")
        linear(layer.self_attention.linear[1], f"{p}.self_attn.out_proj")
        norm(layer.self_attention.layer_norm, f"{p}.res_self.norm")
        linear(layer.attention.linear[0], f"{p}.cross_attn.q_proj")
        linear(layer.attention.linear[1], f"{p}.cross_attn.kv_proj")
        linear(layer.attention.linear[2], f"{p}.cross_attn.out_proj")
        norm(layer.attention.layer_norm, f"{p}.res_cross.norm")
        ffn(layer.ffn, p)

    spec.config.unk_token, spec.config.bos_token = SPECIALS["unk"], SPECIALS["bos"]
    spec.config.eos_token, spec.config.decoder_start_token = SPECIALS["eos"], SPECIALS["bos"]
    spec.config.add_source_eos = cfg.source_eos
    spec.config.layer_norm_epsilon = cfg.layer_norm_eps
    spec.register_source_vocabulary(pieces(vocabs.src))
    spec.register_target_vocabulary(pieces(vocabs.tgt))
    return spec


def pieces(vocab: Vocab) -> list[str]:
    """Tokens in id order, as CTranslate2 vocabularies list them."""
    return [vocab.sp.id_to_piece(i) for i in range(len(vocab))]


def export_ctranslate2(
    model: Transformer, vocabs: Vocabs, out: str | Path, quantization: str | None = None, force: bool = True
) -> Path:
    """Convert and save to ``out`` (``quantization``: None keeps float32, or e.g. ``int8``)."""
    ct2 = _require()
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ValueError(f"--quantization {quantization!r}: choose from {', '.join(QUANTIZATIONS)}")
    spec = build_spec(model, vocabs)

    class _Converter(ct2.converters.Converter):
        def _load(self):
            return spec

    out = Path(out)
    _Converter().convert(str(out), quantization=quantization, force=force)
    vocabs.src.save(out / "source.spm")
    vocabs.tgt.save(out / "target.spm")
    return out
