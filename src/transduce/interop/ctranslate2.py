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

Which of CTranslate2's variables holds which of our tensors is one table (:data:`VOCABULARY_ROWS`,
:data:`POSITION_TABLES`, :func:`layer_variables`), which this export writes by and the import
(``ct2_import.py``) reads by.

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


# ----------------------------------------------------------------------------- the names, both ways
# CTranslate2 names a variable by its place in the spec, a list's items as ``name_i``:
# ``encoder/layer_0/self_attention/linear_0/weight`` is ``spec.encoder.layer[0].self_attention.linear[0].weight``.
# The export (build_spec) writes each of our tensors under its name, the import (ct2_import.py) reads it back.
LINEAR = {"weight": "weight", "bias": "bias"}  # our parameter -> CTranslate2's variable, a Linear
NORM = {"weight": "gamma", "bias": "beta"}  # ... and a LayerNorm
# (our module, CTranslate2 scope, which parameters) of one layer
ENCODER_LAYER = (
    ("self_attn.qkv_proj", "self_attention/linear_0", LINEAR),  # Q, K, V fused, as ours
    ("self_attn.out_proj", "self_attention/linear_1", LINEAR),
    ("res_attn.norm", "self_attention/layer_norm", NORM),
    ("ff.w1", "ffn/linear_0", LINEAR),
    ("ff.w2", "ffn/linear_1", LINEAR),
    ("res_ff.norm", "ffn/layer_norm", NORM),
)
DECODER_LAYER = (
    ("self_attn.qkv_proj", "self_attention/linear_0", LINEAR),
    ("self_attn.out_proj", "self_attention/linear_1", LINEAR),
    ("res_self.norm", "self_attention/layer_norm", NORM),
    ("cross_attn.q_proj", "attention/linear_0", LINEAR),
    ("cross_attn.kv_proj", "attention/linear_1", LINEAR),  # K, V fused, as ours
    ("cross_attn.out_proj", "attention/linear_2", LINEAR),
    ("res_cross.norm", "attention/layer_norm", NORM),
    ("ff.w1", "ffn/linear_0", LINEAR),
    ("ff.w2", "ffn/linear_1", LINEAR),
    ("res_ff.norm", "ffn/layer_norm", NORM),
)
FINAL_NORMS = (("encoder.final_norm", "encoder/layer_norm", NORM), ("decoder.final_norm", "decoder/layer_norm", NORM))
# one row per vocabulary entry: the import re-orders the rows into transduce's vocabulary layout
SRC_EMBEDDING = "encoder/embeddings_0/weight"
VOCABULARY_ROWS = (
    ("src_embed.token.weight", SRC_EMBEDDING),
    ("tgt_embed.token.weight", "decoder/embeddings/weight"),
    ("generator.weight", "decoder/projection/weight"),
    ("generator.bias", "decoder/projection/bias"),  # zeros without output_bias
)
# one row per position: our sinusoids (or more rows of them) or the learned table
POSITION_TABLES = (
    ("src_embed.positions.weight", "encoder/position_encodings/encodings"),
    ("tgt_embed.positions.weight", "decoder/position_encodings/encodings"),
)


def layer_variables(cfg: ModelConfig) -> list[tuple[str, str]]:
    """(our parameter, CTranslate2 variable) of every Linear and LayerNorm of a model of ``cfg``, each
    Linear's weight before its bias."""
    modules = [
        (f"{stack}.layers.{i}.{ours}", f"{stack}/layer_{i}/{theirs}", params)
        for stack, count, layer in (
            ("encoder", cfg.encoder_layers, ENCODER_LAYER),
            ("decoder", cfg.decoder_layers, DECODER_LAYER),
        )
        for i in range(count)
        for ours, theirs, params in layer
    ]
    if cfg.norm == "pre":
        modules += FINAL_NORMS
    return [
        (f"{module}.{ours}", f"{scope}/{theirs}")
        for module, scope, params in modules
        for ours, theirs in params.items()
    ]


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
    """A filled ``ctranslate2.specs.TransformerSpec`` for ``model``: every variable of :data:`VOCABULARY_ROWS`,
    :data:`POSITION_TABLES` and :func:`layer_variables` set from our tensor of the same row."""
    _require()
    from ctranslate2.specs import common_spec, transformer_spec

    cfg = model.config
    check_ct2_exportable(cfg)
    # copies: CTranslate2's quantisation scales the arrays in place, which would change the model's own weights
    w = {k: v.detach().float().cpu().numpy().copy() for k, v in model.state_dict().items()}
    w.setdefault("generator.bias", np.zeros(cfg.target_vocab_size, dtype=np.float32))  # without output_bias
    if cfg.positions == "sinusoidal":  # the same rows, and more: CTranslate2 may decode past max_positions
        rows = max(cfg.max_positions, CT2_MIN_POSITIONS)
        w.update((ours, sinusoid_table(rows, cfg.d_model).numpy()) for ours, _ in POSITION_TABLES)
    spec = transformer_spec.TransformerSpec.from_config(
        (cfg.encoder_layers, cfg.decoder_layers),
        cfg.n_heads,
        pre_norm=cfg.norm == "pre",
        activation=getattr(common_spec.Activation, CT2_ACTIVATIONS[cfg.activation]),
    )
    for ours, theirs in (*VOCABULARY_ROWS, *POSITION_TABLES, *layer_variables(cfg)):
        _assign(spec, theirs, w[ours])
    spec.encoder.scale_embeddings = spec.decoder.scale_embeddings = cfg.scale_embeddings
    spec.config.unk_token, spec.config.bos_token = SPECIALS["unk"], SPECIALS["bos"]
    spec.config.eos_token, spec.config.decoder_start_token = SPECIALS["eos"], SPECIALS["bos"]
    spec.config.add_source_eos = cfg.source_eos
    spec.config.layer_norm_epsilon = cfg.layer_norm_eps
    spec.register_source_vocabulary(pieces(vocabs.src))
    spec.register_target_vocabulary(pieces(vocabs.tgt))
    return spec


def _assign(spec, name: str, value: np.ndarray) -> None:
    """Set the variable CTranslate2 calls ``name`` (``encoder/layer_0/ffn/linear_0/weight``) in ``spec``."""
    from ctranslate2.specs.model_spec import index_spec  # what CTranslate2 resolves its own names with

    scope, attribute = name.rsplit("/", 1)
    setattr(index_spec(spec, scope), attribute, value)


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
