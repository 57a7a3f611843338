"""What the C++ decoder (``native_step.cpp``) is given: the model as named tensors, checked in one place.

As CTranslate2's converters do, the hand-off from a :class:`~transduce.model.Transformer` to the C++
encoder and decoder is a spec: dataclasses of named weights (one per layer and sub-layer) plus the few
scalars the arithmetic needs. :func:`spec_of` reads a model into one, gathering every part the C++ step
does not cover instead of stopping at the first; :func:`check` validates a spec (every tensor present, in
fp32/bf16, of the shape ``d_model``, ``d_ff`` and the vocabulary imply) and lists all its problems.
:mod:`~transduce.backends.native` then passes the spec to the extension by keyword, so no argument depends on
its position.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from torch import Tensor, nn

FLOATS = (torch.float32, torch.bfloat16)
ACTIVATIONS = ("relu", "gelu", "swish")  # the feed-forward activations native_step.cpp knows, by name


@dataclass(frozen=True)
class LinearSpec:
    """y = x Wᵀ + b: ``weight`` (out, in), ``bias`` (out,) or None."""

    weight: Tensor
    bias: Tensor | None


@dataclass(frozen=True)
class NormSpec:
    """A layer norm's ``weight`` and ``bias``, (d_model,) each."""

    weight: Tensor
    bias: Tensor


@dataclass(frozen=True)
class EncoderLayerSpec:
    """One encoder layer (§3.1): self-attention (fused Q/K/V, W^O), feed-forward, and their two norms."""

    self_qkv: LinearSpec
    self_out: LinearSpec
    ff_in: LinearSpec
    ff_out: LinearSpec
    self_norm: NormSpec
    ff_norm: NormSpec


@dataclass(frozen=True)
class DecoderLayerSpec:
    """One decoder layer (§3.1): masked self-attention, encoder–decoder attention (its query and W^O; its
    keys/values are :attr:`TransformerSpec.cross_kv`), feed-forward, and their three norms."""

    self_qkv: LinearSpec
    self_out: LinearSpec
    cross_q: LinearSpec
    cross_out: LinearSpec
    ff_in: LinearSpec
    ff_out: LinearSpec
    self_norm: NormSpec
    cross_norm: NormSpec
    ff_norm: NormSpec


@dataclass(frozen=True)
class TransformerSpec:
    """The whole model for the C++ encoder and decoder step."""

    encoder: list[EncoderLayerSpec]
    decoder: list[DecoderLayerSpec]
    cross_kv: list[LinearSpec]  # per decoder layer: the encoder output's fused keys/values (2·d_model, d_model)
    src_embedding: Tensor  # (V_src, d_model)
    tgt_embedding: Tensor  # (V_tgt, d_model)
    src_scale: float  # the embeddings' multiplier: √d_model (§3.4) or 1
    tgt_scale: float
    encoder_norm: NormSpec | None  # pre-norm's final layer norms; None in post-norm
    decoder_norm: NormSpec | None
    generator: LinearSpec  # pre-softmax projection (V_tgt, d_model), its bias (V_tgt,) with output_bias
    n_heads: int
    attn_scale: float  # 1/√d_k (scaled dot product) or 1 (dot product)
    pre_norm: bool
    eps: float
    pad_id: int
    activation: str  # the feed-forward's activation, one of ACTIVATIONS


class UnsupportedModel(ValueError):
    """A model the C++ step does not cover; the message lists every reason."""


def _why_not(model: nn.Module) -> list[str]:
    """Every reason the C++ step cannot run ``model`` (empty if it can)."""
    from ..model import Transformer

    if not isinstance(model, Transformer):
        return [f"{type(model).__name__} is not a Transformer"]
    cfg, why = model.config, []
    device = model.tgt_embed.token.weight.device
    if device.type != "cpu":  # on GPU the Python step uses the fused attention kernel instead
        why.append(f"the C++ step runs on the CPU only (the model is on {device})")
    if cfg.attention == "additive":
        why.append("additive attention")
    if cfg.attention_window is not None:
        why.append("restricted self-attention (attention_window)")
    if cfg.d_k is not None and cfg.d_k * cfg.n_heads != cfg.d_model:
        why.append(
            f"queries and keys narrower than values (d_k = {cfg.d_k}, d_model / h = {cfg.d_model // cfg.n_heads})"
        )
    linears = [
        m
        for layer in model.decoder.layers
        for m in (
            layer.self_attn.qkv_proj,
            layer.self_attn.out_proj,
            layer.cross_attn.q_proj,
            layer.cross_attn.out_proj,
            layer.ff.w1,
            layer.ff.w2,
        )
    ]
    odd = sorted({f"{type(m).__module__}.{type(m).__name__}" for m in linears if type(m) is not nn.Linear})
    if odd:
        why.append(f"{', '.join(odd)} layers (int8 dynamic quantisation)")
    if type(model.generator) is not nn.Linear:
        why.append(f"a {type(model.generator).__name__} pre-softmax projection")
    if any(a.record is not None for layer in model.decoder.layers for a in (layer.self_attn, layer.cross_attn)):
        why.append("attention weights are being recorded")
    return why


def _linear(m: nn.Linear) -> LinearSpec:
    return LinearSpec(m.weight.detach(), m.bias.detach() if m.bias is not None else None)


def _norm(m: nn.LayerNorm | None) -> NormSpec | None:
    return None if m is None else NormSpec(m.weight.detach(), m.bias.detach())


def spec_of(model: nn.Module) -> TransformerSpec:
    """``model``'s weights by name; raises :class:`UnsupportedModel` listing every part the C++ step lacks."""
    why = _why_not(model)
    if why:
        raise UnsupportedModel("; ".join(why))
    cfg = model.config
    encoder = [
        EncoderLayerSpec(
            _linear(x.self_attn.qkv_proj),
            _linear(x.self_attn.out_proj),
            _linear(x.ff.w1),
            _linear(x.ff.w2),
            _norm(x.res_attn.norm),
            _norm(x.res_ff.norm),
        )
        for x in model.encoder.layers
    ]
    decoder = [
        DecoderLayerSpec(
            _linear(x.self_attn.qkv_proj),
            _linear(x.self_attn.out_proj),
            _linear(x.cross_attn.q_proj),
            _linear(x.cross_attn.out_proj),
            _linear(x.ff.w1),
            _linear(x.ff.w2),
            _norm(x.res_self.norm),
            _norm(x.res_cross.norm),
            _norm(x.res_ff.norm),
        )
        for x in model.decoder.layers
    ]
    attn = model.decoder.layers[0].self_attn
    return TransformerSpec(
        encoder=encoder,
        decoder=decoder,
        cross_kv=[_linear(x.cross_attn.kv_proj) for x in model.decoder.layers],
        src_embedding=model.src_embed.token.weight.detach(),
        tgt_embedding=model.tgt_embed.token.weight.detach(),
        src_scale=model.src_embed.scale,
        tgt_scale=model.tgt_embed.scale,
        encoder_norm=_norm(model.encoder.final_norm),
        decoder_norm=_norm(model.decoder.final_norm),
        generator=_linear(model.generator),
        n_heads=attn.n_heads,
        attn_scale=attn.scale,
        pre_norm=cfg.norm == "pre",
        eps=cfg.layer_norm_eps,
        pad_id=cfg.pad_id,
        activation=cfg.activation,
    )


def unsupported(model: nn.Module) -> str | None:
    """Why the C++ step cannot run ``model``, every reason in one sentence (None if it can)."""
    return "; ".join(_why_not(model)) or None


def check(spec: TransformerSpec) -> list[str]:
    """Every problem of ``spec``, by name: a missing or non-float tensor, a shape that does not fit
    ``d_model`` (from the target embedding), the layers' ``d_ff`` or the vocabularies, impossible scalars."""
    problems: list[str] = []
    d = spec.tgt_embedding.size(1) if spec.tgt_embedding.dim() == 2 else -1
    d_ff = spec.decoder[0].ff_in.weight.size(0) if spec.decoder else -1
    vocab = spec.tgt_embedding.size(0)

    def tensor(name: str, t, shape: tuple[int, ...]) -> None:
        if not isinstance(t, Tensor):
            problems.append(f"{name}: missing")
        elif t.dtype not in FLOATS:
            problems.append(f"{name}: dtype {t.dtype}, expected float32 or bfloat16")
        elif tuple(t.shape) != shape:
            problems.append(f"{name}: shape {tuple(t.shape)}, expected {shape}")

    def linear(name: str, lin: LinearSpec, out: int, inp: int) -> None:
        tensor(f"{name}.weight", lin.weight, (out, inp))
        if lin.bias is not None:
            tensor(f"{name}.bias", lin.bias, (out,))

    def norm(name: str, n: NormSpec | None) -> None:
        if n is None:
            problems.append(f"{name}: missing")
            return
        tensor(f"{name}.weight", n.weight, (d,))
        tensor(f"{name}.bias", n.bias, (d,))

    shapes = {
        "self_qkv": (3 * d, d),
        "self_out": (d, d),
        "cross_q": (d, d),
        "cross_out": (d, d),
        "ff_in": (d_ff, d),
        "ff_out": (d, d_ff),
    }
    for kind, layers in (("encoder", spec.encoder), ("decoder", spec.decoder)):
        for i, layer in enumerate(layers):
            for f in fields(layer):
                value, name = getattr(layer, f.name), f"{kind}[{i}].{f.name}"
                if f.name.endswith("_norm"):
                    norm(name, value)
                else:
                    linear(name, value, *shapes[f.name])
    if not spec.decoder:
        problems.append("decoder: no layers")
    if len(spec.cross_kv) != len(spec.decoder):
        problems.append(f"cross_kv: {len(spec.cross_kv)} maps for {len(spec.decoder)} decoder layers")
    for i, kv in enumerate(spec.cross_kv):
        linear(f"cross_kv[{i}]", kv, 2 * d, d)
    tensor("src_embedding", spec.src_embedding, (spec.src_embedding.size(0), d))
    linear("generator", spec.generator, vocab, d)
    for name in ("encoder_norm", "decoder_norm"):
        if spec.pre_norm:
            norm(name, getattr(spec, name))
        elif getattr(spec, name) is not None:
            problems.append(f"{name}: given for a post-norm model, which has no final norm")
    if spec.n_heads < 1 or d % spec.n_heads:
        problems.append(f"n_heads: {spec.n_heads} does not divide d_model {d}")
    if spec.activation not in ACTIVATIONS:
        problems.append(f"activation: {spec.activation!r}, expected one of {', '.join(ACTIVATIONS)}")
    for name in ("src_scale", "tgt_scale", "attn_scale", "eps"):
        if not getattr(spec, name) > 0:
            problems.append(f"{name}: {getattr(spec, name)}, expected > 0")
    return problems


def validated(spec: TransformerSpec) -> TransformerSpec:
    """``spec`` if :func:`check` finds nothing; else one error listing every problem."""
    problems = check(spec)
    if problems:
        raise UnsupportedModel(f"the C++ decoder cannot take this model: {'; '.join(problems)}")
    return spec
