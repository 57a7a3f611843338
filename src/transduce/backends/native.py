"""A decoder step in C++ (``native_step.cpp``), in one of two forms (:data:`MAPS`).

At batch 1 a beam-search step is a few hundred small tensor ops whose dispatch from Python costs
more than their work. :class:`NativeStep` wraps a :class:`~transduce.model.Transformer` and runs
each step as one C++ call:

- ``maps="aten"`` (bf16-native; fp32 when exactness is asked for): the same ATen ops as
  ``Transformer.decode_step``, so its outputs equal the Python step's bit for bit;
- the loop step, ``maps="int8"`` (int8-native) or ``maps="fp32"`` (fp32-native): decoding leaves ATen
  for plain C++. Every linear map runs ``int8_gemm.h``'s kernel (weights quantised once per output
  channel from the fp32 model, activations per call and row, exact int32 sums; AVX-512 VNNI where the CPU
  has it: an approximation of fp32, like ``--dtype int8``) or ``fp32_gemm.h``'s (fp32, each output one
  chain of fused multiply-adds: fp32 within rounding); the rest of the step, the encoder and beam
  search's candidate selection run ``int8_step.h``'s loops, and beam search itself runs whole in one C++
  call (:meth:`NativeStep.beam_search`). Each row is computed on its own in a fixed order, so the output
  depends neither on the batch nor on the threads nor on the SIMD level.

The extension is compiled with ``torch.utils.cpp_extension`` on first use (tens of seconds, then
cached under ``TORCH_EXTENSIONS_DIR`` or ``~/.cache/torch_extensions``). :func:`native_step`
returns ``None`` when it cannot apply — no C++ compiler, or a model the C++ step does not cover
(a GPU, an already quantised model, additive attention, restricted attention windows, attention
recording) — and callers then use the model itself.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn

from ..cpp import Isa, build
from ..decode.hypothesis import Hypothesis, limits_of
from ..decode.search import TOPK_BLOCK, ids_tensor
from ..model import Transformer
from ..model.cache import DecoderCache, LayerCache
from ..model.transformer import Encoded
from .spec import LinearSpec, NormSpec, TransformerSpec, spec_of, unsupported, validated

SOURCE = Path(__file__).with_name("native_step.cpp")
HEADERS = tuple(SOURCE.with_name(name) for name in ("fp32_gemm.h", "int8_gemm.h", "int8_step.h", "vecmath.h"))
MAPS = ("aten", "fp32", "int8")  # the C++ step's linear maps: ATen's GEMM (op for op), or the loop step's kernels
# -ffp-contract=off: the compiler fuses no multiply-add of its own, so every level computes the same bits
# (vecmath.h); no -ffast-math, which would reorder sums and assume no infinities (the step masks with -inf).
NUMERICS_FLAGS = ("-O3", "-ffp-contract=off")
# and hidden symbols: builds of two levels loaded in one process (tests) never call into each other.
STEP_FLAGS = (*NUMERICS_FLAGS, "-fopenmp", "-fvisibility=hidden", "-fvisibility-inlines-hidden")


@functools.cache
def extension(isa: str | Isa | None = None):
    """The compiled extension module for the SIMD level ``isa`` (:func:`cpp.isa_named`), or None (with a
    warning saying why) if it cannot be built, with :data:`STEP_FLAGS`."""
    return build(
        "transduce_native_step",
        SOURCE,
        "the C++ decoder step",
        "decoding uses the Python step",
        headers=HEADERS,
        flags=STEP_FLAGS,
        ldflags=("-fopenmp",),
        isa=isa,
    )


def supports(model: nn.Module) -> str | None:
    """Why the C++ step cannot run ``model``, every reason (None if it can): :func:`spec.unsupported`."""
    return unsupported(model)


@dataclass
class DeferredCache(DecoderCache):
    """The C++ step's cache: reordering the self-attention keys/values waits for the next step.

    :meth:`reorder` only records the kept rows (``pending``, composed if it is called twice); the next
    C++ step gathers them and appends the new position in one copy per tensor, where ``index_select``
    and then ``cat`` made two. The encoder side is reordered at once. Between a reorder and the next
    step, ``layers[i].self_k``/``self_v`` still hold the old rows.
    """

    pending: Tensor | None = None

    @classmethod
    def of(cls, cache: DecoderCache) -> DeferredCache:
        return cls(layers=cache.layers, memory_mask=cache.memory_mask, beam=cache.beam, position=cache.position)

    def reorder(self, rows: Tensor, sentences: Tensor | None = None, beam: int | None = None) -> None:
        if self.layers[0].self_k is not None:
            self.pending = rows if self.pending is None else self.pending.index_select(0, rows)
        self.reorder_encoder_side(sentences, beam)


@dataclass
class HistoryCache(DecoderCache):
    """The loop step's cache: the self-attention keys/values live in ``history`` (``int8_step.h``:
    ``History``), each step's rows where that step wrote them, with the row each current row continues at
    every step. :meth:`reorder` records the kept rows (``pending``, composed if called twice) and the next
    step rewrites those row indices, where a cache of (N, h, t, d_k) tensors copies every key and value.
    The encoder side is reordered at once; ``layers[i].self_k``/``self_v`` stay None.
    """

    history: object = None
    pending: Tensor | None = None

    def reorder(self, rows: Tensor, sentences: Tensor | None = None, beam: int | None = None) -> None:
        if self.history.steps > 0:
            self.pending = rows if self.pending is None else self.pending.index_select(0, rows)
        self.reorder_encoder_side(sentences, beam)


def _float(ext, lin: LinearSpec):
    """A float map over the model's own weight tensor: the C++ GEMM gets the operands ``F.linear`` gives it,
    strides included (a contiguous transposed copy rounds differently on some CPUs; see native_step.cpp)."""
    return ext.Linear.floating(lin.weight, lin.bias)


def _int8(ext, lin: LinearSpec):
    """An int8 map (``int8_gemm.h``): the weight quantised per output channel and packed once."""
    return ext.Linear.int8(lin.weight.float(), lin.bias.float() if lin.bias is not None else None)


def _fp32(ext, lin: LinearSpec):
    """An fp32 map of the loop step (``fp32_gemm.h``): the weight packed once."""
    return ext.Linear.fp32(lin.weight.float(), lin.bias.float() if lin.bias is not None else None)


LINEAR = {"aten": _float, "fp32": _fp32, "int8": _int8}  # MAPS -> the map maker


def _norms(norms: list[NormSpec]) -> list[Tensor]:
    return [t for n in norms for t in (n.weight, n.bias)]


def _final(norm: NormSpec | None) -> dict:
    return {"final_w": norm.weight if norm is not None else None, "final_b": norm.bias if norm is not None else None}


def _shared(spec: TransformerSpec) -> dict:
    """The scalars both C++ halves take, by name."""
    return {
        "n_heads": spec.n_heads,
        "attn_scale": spec.attn_scale,
        "pre_norm": spec.pre_norm,
        "eps": spec.eps,
        "activation": spec.activation,
    }


def decoder_of(ext, spec: TransformerSpec, linear) -> object:
    """``native_step.cpp``'s Decoder from ``spec``, each linear map made by ``linear`` (a :data:`LINEAR` maker).
    Per layer: 6 maps (self-attention qkv and out, cross-attention q and out, feed-forward in and out) and the
    weight and bias of its 3 norms, in that order."""
    maps = [
        linear(ext, m)
        for x in spec.decoder
        for m in (x.self_qkv, x.self_out, x.cross_q, x.cross_out, x.ff_in, x.ff_out)
    ]
    norms = _norms([n for x in spec.decoder for n in (x.self_norm, x.cross_norm, x.ff_norm)])
    return ext.Decoder(
        linears=maps,
        norms=norms,
        generator=linear(ext, spec.generator),
        token_weight=spec.tgt_embedding,
        embed_scale=spec.tgt_scale,
        **_final(spec.decoder_norm),
        **_shared(spec),
    )


def encoder_of(ext, spec: TransformerSpec, linear) -> object:
    """``native_step.cpp``'s loop Encoder from ``spec``, with each decoder layer's key/value map, each map made
    by ``linear`` (``_int8`` or ``_fp32``). Per layer: 4 maps (self-attention qkv and out, feed-forward in and
    out) and the weight and bias of its 2 norms."""
    maps = [linear(ext, m) for x in spec.encoder for m in (x.self_qkv, x.self_out, x.ff_in, x.ff_out)]
    norms = _norms([n for x in spec.encoder for n in (x.self_norm, x.ff_norm)])
    return ext.Encoder(
        linears=maps,
        norms=norms,
        kv=[linear(ext, m) for m in spec.cross_kv],
        token_weight=spec.src_embedding,
        embed_scale=spec.src_scale,
        **_final(spec.encoder_norm),
        pad_id=spec.pad_id,
        **_shared(spec),
    )


@dataclass
class EncodedKV(Encoded):
    """:class:`Encoded` plus each decoder layer's encoder–decoder keys and values (B, h, S, d_k)."""

    keys: list[Tensor] = field(default_factory=list)
    values: list[Tensor] = field(default_factory=list)


class NativeStep(nn.Module):
    """A :class:`~transduce.decode.step.DecoderStep` over ``model``, stepping in C++.

    ``maps="aten"``: ``encode`` and ``init_cache`` are the model's; ``decode_step`` calls the extension and
    writes the grown self-attention keys/values back into the cache (a :class:`DeferredCache`).

    The loop step (``maps`` "int8" or "fp32"): the encoder, the encoder–decoder keys/values, the step and the
    candidate selection run in C++ (``int8_gemm.h`` or ``fp32_gemm.h``, ``int8_step.h``) with weights packed
    (int8: quantised) once from ``model``'s fp32 weights. int8 outputs approximate fp32, as ``--dtype int8``;
    ``self.model``, the fp32 model itself (no second, torch-quantised copy to make at load: a second at base
    size), only serves teacher-forced passes (reference perplexity) and the jobs that read a PyTorch model's
    attention.
    """

    def __init__(self, model: Transformer, ext, maps: str = "aten") -> None:
        super().__init__()
        if maps not in MAPS:
            raise ValueError(f"maps must be one of {', '.join(MAPS)}, got {maps!r}")
        spec = validated(spec_of(model))
        self.ext, self.config, self.maps = ext, model.config, maps
        self.vocab = spec.generator.weight.size(0)
        loops = maps != "aten"
        self.selects_in_step = loops  # beam search calls step_candidates (search._candidates)
        self.searches_whole = loops  # search.beam_search hands the whole loop to beam_search below
        self._no_rows = torch.empty(0, dtype=torch.long)
        self.decoder = decoder_of(ext, spec, LINEAR[maps])
        self.encoder = encoder_of(ext, spec, LINEAR[maps]) if loops else None
        self.model = model
        emb = model.tgt_embed
        # every step's position encoding, (max_positions, d_model): a row per step instead of a module call
        self._positions = emb.positions(self.config.max_positions, 0).detach().to(emb.token.weight.dtype)
        src = model.src_embed  # the encoder's, (max_positions, d_model) fp32: sliced per batch, not made again
        self._src_positions = src.positions(self.config.max_positions, 0).detach().float().contiguous()

    @property
    def pytorch_model(self) -> nn.Module:
        """The PyTorch model this step stands for (:func:`transduce.decode.step.pytorch_model`): what reads
        attention weights (alignments, HTML tag placement, attention pages)."""
        return self.model

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        """Teacher-forced logits (B, T, V): the model's own pass (reference perplexity)."""
        return self.model(src, tgt)

    def decode(self, tgt: Tensor, encoded) -> Tensor:
        return self.model.decode(tgt, encoded)

    def encode(self, src: Tensor):
        """src (B, S) -> Encoded; the loop step encodes in C++ and keeps the encoder–decoder keys/values."""
        if self.encoder is None:
            return self.model.encode(src)
        out = self.encoder.encode(src, self._src_positions[: src.size(1)])
        L = len(self.model.decoder.layers)
        return EncodedKV(out[0], self.model.source_mask(src), out[1 : 1 + L], out[1 + L :])

    def init_cache(self, encoded, beam: int = 1) -> DecoderCache:
        if isinstance(encoded, EncodedKV):
            layers = [LayerCache(k, v) for k, v in zip(encoded.keys, encoded.values)]
            history = self.ext.History(len(layers), encoded.memory.size(-1))
            return HistoryCache(layers=layers, memory_mask=encoded.mask, beam=beam, history=history)
        return DeferredCache.of(self.model.init_cache(encoded, beam))

    def beam_candidates(self, logits: Tensor, scores: Tensor, forced: list[int], k2: int, want: int):
        """Beam search's candidate selection in one C++ call, the same ops as ``search._candidates``."""
        rows = ids_tensor(forced, torch.device("cpu")) if forced else self._no_rows
        if self.encoder is not None:  # the loop step: loops with their own fp32 rounding
            return self.ext.beam_candidates_fast(logits, scores, rows, k2, want, self.config.eos_id)
        return self.ext.beam_candidates(logits, scores, rows, k2, want, self.config.eos_id, TOPK_BLOCK)

    def beam_search(
        self, src: Tensor, beam: int, alpha: float, max_len_a: float, max_len_b: int, nbest: int
    ) -> list[list[Hypothesis]]:
        """``search.beam_search`` for the loop step in one C++ call (``native_step.cpp``: ``Decoder::beam_search``):
        that loop over ``step_candidates``, with no Python between steps and the GIL released throughout, so
        the same hypotheses. src (B, S) -> the ``nbest`` best hypotheses per sentence, best first."""
        if self.encoder is None:
            raise ValueError("the whole beam search in C++ runs the loop step (maps int8 or fp32)")
        cfg = self.config
        # from the ids as a list: a torch op releases the GIL, and a worker thread then waits to take it back
        lengths = [len(row) - row.count(cfg.pad_id) - 1 for row in src.tolist()]  # without eos
        limits = limits_of(lengths, max_len_a, max_len_b, cfg.max_positions - 1)
        enc = self.encode(src)
        found = self.decoder.beam_search(
            enc.keys, enc.values, enc.mask, self._positions, limits, beam, alpha, nbest, cfg.bos_id, cfg.eos_id
        )
        return [[Hypothesis(tokens, logprob, score) for tokens, logprob, score in hyps[:nbest]] for hyps in found]

    def decode_step(self, tokens: Tensor, cache: DecoderCache) -> Tensor:
        """tokens (N,) -> logits (N, V), as ``Transformer.decode_step``; the cache advances one position
        (and takes the rows a reorder left pending)."""
        return self._step(self.decoder.step, tokens, cache)[0]

    def step_candidates(self, tokens: Tensor, cache: DecoderCache, scores: Tensor, forced: list[int], want: int):
        """``decode_step`` then ``beam_candidates`` in one C++ call (the loop step only): the step's logits go straight
        into each row's log Σ exp and best tokens as they are made, never written out (``int8_step.h``:
        ``best_of_projection``). Returns (top_val, top_row, top_tok), each (slots, c)."""
        rows = ids_tensor(forced, torch.device("cpu")) if forced else self._no_rows
        k2, eos = min(want, self.vocab), self.config.eos_id
        out = self._step(lambda *a: self.decoder.step_candidates(*a, scores, rows, k2, want, eos), tokens, cache)
        return out[0], out[1], out[2]

    def _step(self, run, tokens: Tensor, cache: DecoderCache) -> list[Tensor]:
        """``run`` (``Decoder.step`` or ``step_candidates``) on the cache: returns its results before the new
        keys/values, which go into the cache (it advances one position and takes a pending reorder). A
        :class:`HistoryCache` keeps them in C++."""
        t, L = cache.position, len(cache.layers)
        if t >= self._positions.size(0):
            raise ValueError(f"position {t} exceeds max_positions={self._positions.size(0)}")
        positions = self._positions[t : t + 1]  # (1, d_model)
        history = cache.history if isinstance(cache, HistoryCache) else None
        first = history is not None or cache.layers[0].self_k is None
        pending = getattr(cache, "pending", None)  # a plain DecoderCache reorders at once
        out = run(
            tokens,
            positions,
            [] if first else [c.self_k for c in cache.layers],
            [] if first else [c.self_v for c in cache.layers],
            [c.memory_k for c in cache.layers],
            [c.memory_v for c in cache.layers],
            cache.memory_mask,
            cache.beam,
            pending,
            history,
        )
        if pending is not None:
            cache.pending = None
        head = len(out) - (0 if history is not None else 2 * L)
        if history is None:
            for i, layer in enumerate(cache.layers):
                layer.self_k, layer.self_v = out[head + i], out[head + L + i]
        cache.position += 1
        return out[:head]


def native_step(model: nn.Module, maps: str | None = None, isa: str | None = None) -> NativeStep | None:
    """``model`` stepping in C++, or None if the C++ step does not cover it or cannot be built.

    ``maps`` (:data:`MAPS`): "int8" or "fp32", the loop step over an fp32 model; "aten", ATen's ops, bit for
    bit the Python step; None: "fp32" for an fp32 model (fp32-native), "aten" for another dtype (bf16-native).
    ``isa``: the SIMD level of the build (None: the CPU's, :func:`transduce.cpp.chosen_isa`); every level
    gives the same bits.
    """
    dtype = model.tgt_embed.token.weight.dtype
    maps = maps or ("fp32" if dtype == torch.float32 else "aten")
    if maps not in MAPS:
        raise ValueError(f"maps must be one of {', '.join(MAPS)}, got {maps!r}")
    if supports(model) is not None:
        return None
    if maps != "aten" and dtype != torch.float32:
        raise ValueError(f"the {maps} C++ loop step packs an fp32 model, got {dtype}")
    ext = extension(isa)
    return NativeStep(model, ext, maps) if ext is not None else None
