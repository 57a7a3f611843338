"""A decoder step in C++ (``native_step.cpp``): the same arithmetic as ``Transformer.decode_step``.

At batch 1 a beam-search step is a few hundred small tensor ops whose dispatch from Python costs
more than their work. :class:`NativeStep` wraps a :class:`~transduce.model.Transformer` and runs
each step as one C++ call over the same ATen ops, so its outputs equal the Python step's.

The extension is compiled with ``torch.utils.cpp_extension`` on first use (tens of seconds, then
cached under ``TORCH_EXTENSIONS_DIR`` or ``~/.cache/torch_extensions``). :func:`native_step`
returns ``None`` when it cannot apply — no C++ compiler, or a model the C++ step does not cover
(a GPU, int8 dynamic quantisation, additive attention, restricted attention windows, attention
recording) — and callers then use the model itself.
"""

from __future__ import annotations

import functools
import warnings
from pathlib import Path

from torch import Tensor, nn

from ..model import Transformer
from ..model.cache import DecoderCache

SOURCE = Path(__file__).with_name("native_step.cpp")


@functools.cache
def extension():
    """The compiled extension module, or None (with a warning saying why) if it cannot be built."""
    from torch.utils import cpp_extension

    try:
        return cpp_extension.load(name="transduce_native_step", sources=[str(SOURCE)],
                                  extra_cflags=["-O3"], verbose=False)
    except Exception as err:  # no compiler, no headers: the Python step is the fallback
        warnings.warn(f"transduce: the C++ decoder step could not be built ({type(err).__name__}: "
                      f"{str(err).splitlines()[0] if str(err) else ''}); decoding uses the Python step",
                      RuntimeWarning, stacklevel=2)
        return None


def supports(model: nn.Module) -> str | None:
    """Why the C++ step cannot run ``model`` (None if it can)."""
    if not isinstance(model, Transformer):
        return f"{type(model).__name__} is not a Transformer"
    cfg = model.config
    device = model.tgt_embed.token.weight.device
    if device.type != "cpu":  # on GPU the Python step uses the fused attention kernel instead
        return f"the CPU step only (the model is on {device})"
    if cfg.attention == "additive":
        return "additive attention"
    if cfg.attention_window is not None:
        return "restricted self-attention (attention_window)"
    for layer in model.decoder.layers:
        for module in (layer.self_attn.qkv_proj, layer.self_attn.out_proj, layer.cross_attn.q_proj,
                       layer.cross_attn.out_proj, layer.ff.w1, layer.ff.w2):
            if type(module) is not nn.Linear:
                return f"{type(module).__module__}.{type(module).__name__} layers (int8 dynamic quantisation)"
        if layer.self_attn.record is not None or layer.cross_attn.record is not None:
            return "attention weights are being recorded"
    if type(model.generator) is not nn.Linear:
        return f"a {type(model.generator).__name__} pre-softmax projection"
    return None


class NativeStep(nn.Module):
    """The decoder interface of :mod:`~transduce.decode.search` over ``model``, stepping in C++.

    ``encode`` and ``init_cache`` are the model's; ``decode_step`` calls the extension and writes
    the grown self-attention keys/values back into the model's own :class:`DecoderCache`.
    """

    def __init__(self, model: Transformer, ext) -> None:
        super().__init__()
        self.model, self.ext, self.config = model, ext, model.config
        weights = []
        for layer in model.decoder.layers:
            sa, ca, ff = layer.self_attn, layer.cross_attn, layer.ff
            weights += [sa.qkv_proj.weight, sa.qkv_proj.bias, sa.out_proj.weight, sa.out_proj.bias,
                        layer.res_self.norm.weight, layer.res_self.norm.bias,
                        ca.q_proj.weight, ca.q_proj.bias, ca.out_proj.weight, ca.out_proj.bias,
                        layer.res_cross.norm.weight, layer.res_cross.norm.bias,
                        ff.w1.weight, ff.w1.bias, ff.w2.weight, ff.w2.bias,
                        layer.res_ff.norm.weight, layer.res_ff.norm.bias]
        linear = {id(m.weight) for m in model.decoder.modules() if isinstance(m, nn.Linear)}
        # linear weights transposed once, (in, out) contiguous, the layout the GEMM reads fastest
        self.weights = [w.detach().t().contiguous() if id(w) in linear else w for w in weights]
        self.generator_t = model.generator.weight.detach().t().contiguous()  # (d_model, V)
        final = model.decoder.final_norm
        self.final = (final.weight, final.bias) if final is not None else (None, None)
        attn = model.decoder.layers[0].self_attn
        self.n_heads, self.scale = attn.n_heads, attn.scale
        self.eps = model.config.layer_norm_eps

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        """Teacher-forced logits (B, T, V): the model's own pass (reference perplexity)."""
        return self.model(src, tgt)

    def decode(self, tgt: Tensor, encoded) -> Tensor:
        return self.model.decode(tgt, encoded)

    def encode(self, src: Tensor):
        return self.model.encode(src)

    def init_cache(self, encoded, beam: int = 1) -> DecoderCache:
        return self.model.init_cache(encoded, beam)

    def decode_step(self, tokens: Tensor, cache: DecoderCache) -> Tensor:
        """tokens (N,) -> logits (N, V), as ``Transformer.decode_step``; the cache advances one position."""
        m, t, L = self.model, cache.position, len(cache.layers)
        emb = m.tgt_embed
        positions = emb.positions(1, t).to(emb.token.weight.dtype)  # (1, d_model)
        first = cache.layers[0].self_k is None
        out = self.ext.decoder_step(
            tokens, positions, emb.token.weight, emb.scale, self.weights, self.final[0], self.final[1],
            self.generator_t, [] if first else [c.self_k for c in cache.layers],
            [] if first else [c.self_v for c in cache.layers], [c.memory_k for c in cache.layers],
            [c.memory_v for c in cache.layers], cache.memory_mask, cache.beam, self.n_heads, self.scale,
            m.config.norm == "pre", self.eps)
        for i, layer in enumerate(cache.layers):
            layer.self_k, layer.self_v = out[1 + i], out[1 + L + i]
        cache.position += 1
        return out[0]


def native_step(model: nn.Module) -> NativeStep | None:
    """``model`` stepping in C++, or None if the C++ step does not cover it or cannot be built."""
    if supports(model) is not None:
        return None
    ext = extension()
    return NativeStep(model, ext) if ext is not None else None
