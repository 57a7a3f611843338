"""A CTranslate2 ``TransformerSpec`` model (read by ``ct2_model.py``) -> a transduce model and vocabularies.

The mapping is the export's table of names (:mod:`transduce.interop.ctranslate2`) read backwards: fused Q/K/V
(``self_attention/linear_0``), fused encoder–decoder K/V (``attention/linear_1``), one LayerNorm per
sub-layer, and, for pre-norm models, ``encoder/layer_norm`` and ``decoder/layer_norm`` as the stacks' final
norms. The position table is kept as it is: our interleaved sinusoids import as ``positions = "sinusoidal"``,
any other table (OpenNMT-py's sines-then-cosines, a learned one) as ``positions = "learned"`` holding that
table, which adds the same numbers. A linear layer without a bias (OpenNMT-py's attention) gets zeros.

Vocabularies are re-ordered into transduce's layout (pad, unk, bos, eos, then the rest in CTranslate2's
order) with :func:`transduce.data.vocab.reorder_spm`: OpenNMT's ``<blank>`` is the pad token, and a
vocabulary without one gets a pad row of zeros (it is only ever masked).

Everything unsupported is collected and raised as one :class:`ConfigError` that names the file and variable.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import torch

from ..config import ConfigError
from ..data.vocab import SPECIALS, Vocab, Vocabs, reorder_spm
from ..model import ModelConfig, Transformer
from ..model.embeddings import sinusoid_table
from .ct2_model import CT2Model, dequantize
from .ctranslate2 import POSITION_TABLES, SRC_EMBEDDING, VOCABULARY_ROWS, layer_variables

ACTIVATIONS = {0: "relu", 2: "swish", 3: "gelu"}  # CTranslate2's Activation ids (RELU, SWISH, GELU)
PAD_NAMES = ("<pad>", "<blank>")  # transduce's and OpenNMT's padding tokens
CT2_DEFAULT_EPS = 1e-6  # CTranslate2's LayerNorm epsilon when config.json names none


def _layer_count(names: set[str], stack: str) -> int:
    found = {int(m.group(1)) for n in names if (m := re.match(rf"{stack}/layer_(\d+)/", n))}
    return max(found) + 1 if found else 0


def check_transformer_spec(ct2: CT2Model) -> dict[str, Any]:
    """The ModelConfig fields ``ct2`` implies; one ConfigError listing everything transduce cannot represent."""
    where, names, problems = str(ct2.path), ct2.names(), []
    if ct2.spec != "TransformerSpec":
        raise ConfigError(f"{where}: spec {ct2.spec!r}; transduce imports CTranslate2's TransformerSpec only")

    def flag(name: str, default=0):
        return ct2.scalar(name, default)

    enc_layers, dec_layers = _layer_count(names, "encoder"), _layer_count(names, "decoder")
    if not enc_layers or not dec_layers:
        problems.append(f"no encoder/layer_N or decoder/layer_N variables ({enc_layers}/{dec_layers} layers)")
    heads = {flag("encoder/num_heads", None), flag("decoder/num_heads", None)}
    if len(heads) != 1 or None in heads:
        problems.append(
            f"encoder/num_heads and decoder/num_heads must be present and equal, got {sorted(heads, key=str)}"
        )
    pre = {flag("encoder/pre_norm", 1), flag("decoder/pre_norm", 1)}
    if len(pre) != 1:
        problems.append("encoder/pre_norm and decoder/pre_norm differ")
    acts = {flag("encoder/activation"), flag("decoder/activation")}
    if len(acts) != 1 or next(iter(acts)) not in ACTIVATIONS:
        problems.append(f"activation ids {sorted(acts)}: transduce imports {ACTIVATIONS} (CTranslate2's ids)")
    scales = {flag("encoder/scale_embeddings", 1), flag("decoder/scale_embeddings", 1)}
    if len(scales) != 1:
        problems.append("encoder/scale_embeddings and decoder/scale_embeddings differ")
    problems += _unsupported(ct2)
    if problems:
        raise ConfigError(f"{where}: transduce cannot import this model: " + "; ".join(problems))

    emb = ct2.get(SRC_EMBEDDING) or ct2.get("encoder/embeddings/weight")
    ffn = ct2.get("encoder/layer_0/ffn/linear_0/weight")
    missing = [n for n, v in ((SRC_EMBEDDING, emb), ("encoder/layer_0/ffn/linear_0/weight", ffn)) if v is None]
    if missing:
        raise ConfigError(f"{where}: missing variables {missing}")
    cfg = ct2.config
    return dict(
        encoder_layers=enc_layers,
        decoder_layers=dec_layers,
        d_model=emb.shape[1],
        d_ff=ffn.shape[0],
        n_heads=int(next(iter(heads))),
        norm="pre" if next(iter(pre)) else "post",
        activation=ACTIVATIONS[next(iter(acts))],
        scale_embeddings=bool(next(iter(scales))),
        layer_norm_eps=float(cfg.get("layer_norm_epsilon") or CT2_DEFAULT_EPS),
        source_eos=bool(cfg.get("add_source_eos", False)),
    )


# variables of what a TransformerSpec may hold and transduce's model has not
UNSUPPORTED = (
    ("encoder/embeddings_1/weight", "more than one source embedding (source factors)"),
    ("encoder/layernorm_embedding/gamma", "a LayerNorm after the embeddings"),
    ("decoder/layernorm_embedding/gamma", "a LayerNorm after the embeddings"),
    ("decoder/project_in/weight", "project_in/project_out layers"),
    ("encoder/layer_0/self_attention/relative_position_keys", "relative position representations"),
    ("encoder/layer_0/self_attention/relative_attention_bias", "a relative attention bias (T5)"),
    ("encoder/layer_0/self_attention/queries_scale", "a queries scale other than 1/sqrt(d_k)"),
    ("encoder/layer_0/ffn/linear_0_noact/weight", "gated feed-forward units (GLU)"),
    ("encoder/layer_0/input_layer_norm/gamma", "extra pre/post layer norms"),
    ("decoder/layer_0/self_attention/rotary_dim", "rotary position embeddings"),
)


def _unsupported(ct2: CT2Model) -> list[str]:
    """What ``ct2`` holds that transduce's model cannot represent, or lacks (a stored position table)."""
    names, problems = ct2.names(), []
    for name, what in UNSUPPORTED:
        if name in names:
            problems.append(f"{name}: {what}")
    for name in ("encoder/layer_0/self_attention/layer_norm/gamma", "decoder/layer_0/ffn/layer_norm/gamma"):
        if name in names and f"{name[: -len('gamma')]}beta" not in names:
            problems.append(f"{name[: -len('/gamma')]}: RMS normalisation (no beta)")
    for name in ("encoder/multi_query_attention", "decoder/alibi", "decoder/start_from_zero_embedding"):
        if ct2.scalar(name, 0):
            problems.append(f"{name} is set")
    if "decoder/scale_outputs" in names:
        problems.append("decoder/scale_outputs: scaled decoder outputs")
    for _, theirs in POSITION_TABLES:
        if theirs not in names:
            problems.append(f"{theirs}: missing (no stored position table)")
    cfg = ct2.config
    if cfg.get("add_source_bos"):
        problems.append("config.json add_source_bos is true (a source starting with <s>)")
    if cfg.get("multi_query_attention"):
        problems.append("config.json multi_query_attention is true")
    return problems


def _order(tokens: list[str], cfg: dict[str, Any], where: str) -> tuple[list[str], list[int]]:
    """Pieces in our id order and, for each, the CTranslate2 row it comes from (-1: a new zero row)."""
    index: dict[str, int] = {}
    for i, t in enumerate(tokens):
        if t in index:
            raise ConfigError(f"{where}: token {t!r} appears twice (ids {index[t]} and {i})")
        index[t] = i
    roles = {
        "unk": cfg.get("unk_token", "<unk>"),
        "bos": cfg.get("decoder_start_token") or cfg.get("bos_token", "<s>"),
        "eos": cfg.get("eos_token", "</s>"),
    }
    absent = [f"{role} token {tok!r}" for role, tok in roles.items() if tok not in index]
    if absent:
        raise ConfigError(f"{where}: the vocabulary has no {', '.join(absent)} (named by config.json)")
    pad = next((p for p in PAD_NAMES if p in index), None)
    rows = [index[pad] if pad else -1, index[roles["unk"]], index[roles["bos"]], index[roles["eos"]]]
    taken = set(rows)
    rest = [(t, i) for i, t in enumerate(tokens) if i not in taken]
    clash = [t for t, _ in rest if t in SPECIALS.values()]
    if clash:
        raise ConfigError(f"{where}: token {clash[0]!r} is not the one config.json gives that role")
    return list(SPECIALS.values()) + [t for t, _ in rest], rows + [i for _, i in rest]


def _rows(table: np.ndarray, rows: list[int]) -> torch.Tensor:
    """table[rows] with -1 as a row of zeros: (len(rows), ...)."""
    out = np.zeros((len(rows), *table.shape[1:]), dtype=np.float32)
    real = np.array(rows) >= 0
    out[real] = table[np.array(rows)[real]]
    return torch.from_numpy(out)


def convert_ct2(
    ct2: CT2Model, src_spm: bytes, tgt_spm: bytes, spm_where: str
) -> tuple[Transformer, Vocabs, dict[str, Any]]:
    """A transduce model (eval mode), its vocabularies and meta from a CTranslate2 model and SentencePiece
    model(s) whose pieces are the vocabulary's tokens."""
    where = str(ct2.path)
    fields = check_transformer_spec(ct2)
    src_order, src_rows = _order(ct2.source_vocabulary, ct2.config, f"{where} (source vocabulary)")
    tgt_order, tgt_rows = _order(ct2.target_vocabulary, ct2.config, f"{where} (target vocabulary)")
    src_proto, src_dropped = reorder_spm(src_spm, src_order, spm_where)
    tgt_proto, tgt_dropped = reorder_spm(tgt_spm, tgt_order, spm_where)
    state = _vocabulary_state(ct2, src_rows, tgt_rows)
    tie = _tie(state, same_vocabulary=src_proto == tgt_proto and src_rows == tgt_rows)
    positions, sinusoidal = _positions(ct2)
    cfg = ModelConfig(
        **fields,
        vocab_size=len(src_order),
        tgt_vocab_size=None if tie == "all" else len(tgt_order),
        tie_embeddings=tie,
        positions="sinusoidal" if sinusoidal else "learned",
        max_positions=min(table.size(0) for table in positions.values()),
        output_bias=bool(state["generator.bias"].abs().max() > 0),
    )
    if not cfg.output_bias:
        del state["generator.bias"]
    if not sinusoidal:
        state |= {name: table[: cfg.max_positions] for name, table in positions.items()}
    state |= _layer_state(ct2, cfg)
    model = _load(cfg, state, where)
    src = Vocab(src_proto)
    vocabs = Vocabs(src, src) if tie == "all" else Vocabs(src, Vocab(tgt_proto))
    meta = {"spm_pieces_without_id": len(src_dropped) + (0 if src_proto == tgt_proto else len(tgt_dropped))}
    return model.eval(), vocabs, meta


def _vocabulary_state(ct2: CT2Model, src_rows: list[int], tgt_rows: list[int]) -> dict[str, torch.Tensor]:
    """Our embeddings, output projection and its bias (zeros where the file has none) from
    :data:`~.ctranslate2.VOCABULARY_ROWS`, their rows in our vocabulary's order (``*_rows``, :func:`_order`)."""
    state = {}
    for ours, theirs in VOCABULARY_ROWS:
        rows, tokens = (
            (src_rows, ct2.source_vocabulary) if ours.startswith("src_") else (tgt_rows, ct2.target_vocabulary)
        )
        name = theirs if theirs != SRC_EMBEDDING or ct2.get(theirs) else "encoder/embeddings/weight"  # older specs
        if ct2.get(name) is None and name.endswith("/bias"):
            table = np.zeros(len(tokens), dtype=np.float32)
        else:
            table = dequantize(ct2, name)
        if table.shape[0] != len(tokens):
            raise ConfigError(f"{ct2.path}: {theirs} has {table.shape[0]} rows but the vocabulary {len(tokens)} tokens")
        state[ours] = _rows(table, rows)
    return state


def _tie(state: dict[str, torch.Tensor], same_vocabulary: bool) -> str:
    """``tie_embeddings`` for the tables of :func:`_vocabulary_state`: what repeats another is tied to it."""
    src, tgt, out = state["src_embed.token.weight"], state["tgt_embed.token.weight"], state["generator.weight"]
    if not torch.equal(tgt, out):
        return "none"
    return "all" if same_vocabulary and torch.equal(src, tgt) else "target"


def _positions(ct2: CT2Model) -> tuple[dict[str, torch.Tensor], bool]:
    """The position tables by our names, and whether both are our interleaved sinusoids (``positions =
    "sinusoidal"``; any other table imports as ``"learned"``, which adds the same numbers)."""
    tables = {ours: dequantize(ct2, theirs) for ours, theirs in POSITION_TABLES}
    enc, dec = tables.values()
    sinusoidal = (
        enc.shape == dec.shape
        and np.array_equal(enc, dec)
        and np.abs(enc - sinusoid_table(*enc.shape).numpy()).max() < 1e-6
    )
    return {ours: torch.from_numpy(table) for ours, table in tables.items()}, sinusoidal


def _layer_state(ct2: CT2Model, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Every Linear and LayerNorm of the layers (and a pre-norm model's final norms) by
    :func:`~.ctranslate2.layer_variables`; a Linear without a bias (OpenNMT-py's attention) gets zeros."""
    state: dict[str, torch.Tensor] = {}
    for ours, theirs in layer_variables(cfg):
        if ct2.get(theirs) is None and theirs.endswith("/bias"):
            state[ours] = torch.zeros(state[f"{ours.removesuffix('bias')}weight"].size(0))
        else:
            state[ours] = torch.from_numpy(dequantize(ct2, theirs))
    return state


def _load(cfg: ModelConfig, state: dict[str, torch.Tensor], where: str) -> Transformer:
    """A model of ``cfg`` holding ``state``; one ConfigError naming every variable of the wrong shape, or what
    nothing filled."""
    model = Transformer(cfg)
    expected = model.state_dict()
    wrong = [
        f"{name}: {tuple(t.shape)}, the config implies {tuple(expected[name].shape)}"
        for name, t in state.items()
        if name in expected and expected[name].shape != t.shape
    ]
    if wrong:
        raise ConfigError(f"{where}: variables of unexpected shape: " + "; ".join(wrong))
    model.load_state_dict(state, strict=False)
    missing = sorted(set(expected) - set(state) - _tied(cfg))
    if missing:
        raise ConfigError(f"{where}: nothing in the file fills {missing[:5]}")
    return model


def _tied(cfg: ModelConfig) -> set[str]:
    """State-dict names that repeat another tensor (tied embeddings)."""
    out = set()
    if cfg.tie_embeddings == "all":
        out.add("tgt_embed.token.weight")
    if cfg.tie_embeddings in ("all", "target"):
        out.add("generator.weight")
    return out
