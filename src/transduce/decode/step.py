"""The decoder-step contract: what search (:mod:`~transduce.decode.search`, :mod:`~transduce.decode.constraints`)
asks of the thing it decodes with.

A :class:`~transduce.model.Transformer`, an :class:`~transduce.decode.ensemble.Ensemble` and the C++ step
(:class:`~transduce.backends.native.NativeStep`) all satisfy :class:`DecoderStep`, so search does not know
which one it drives. Shapes: B sentences, S source positions (padded), N = B·beam decoder rows (a sentence's
beams adjacent), V target vocabulary entries.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from torch import Tensor, nn


class StepCache(Protocol):
    """A decoder's state between steps (keys/values of the tokens fed so far, the encoder side)."""

    def reorder(self, rows: Tensor, sentences: Tensor | None = None, beam: int | None = None) -> None:
        """Keep decoder rows ``rows`` (N',) (indices into N) in that order; ``sentences`` (B',) (indices into
        B) drops finished sentences' encoder side, ``rows`` then listing the survivors' beams in that order;
        ``beam`` changes the rows per sentence (1 -> k after the first beam step)."""


@runtime_checkable
class DecoderStep(Protocol):
    """One model's (or several models') next-token distribution, a token at a time.

    ``config`` is the model's :class:`~transduce.model.ModelConfig` (``pad_id``, ``bos_id``, ``eos_id``,
    ``max_positions``). Search calls ``encode`` once per batch, ``init_cache`` once, then ``decode_step``
    once per output position, reordering the cache between steps as beams are kept or sentences finish.

    Optional, found with ``getattr``: ``beam_candidates(logits, scores, forced, k2, want)`` does beam
    search's candidate selection in one call (the same ops as ``search._candidates``), and a decoder with
    ``selects_in_step = True`` has ``step_candidates(tokens, cache, scores, forced, want)``, the step and the
    selection in one call; both return (top_val, top_row, top_tok), each (slots, c). One with
    ``searches_whole = True`` has ``beam_search(src, beam, alpha, max_len_a, max_len_b, nbest)``, the whole of
    ``search.beam_search`` in one call, with the same hypotheses as that loop. A step that runs a
    PyTorch model's arithmetic elsewhere (the C++ step) names that model as ``pytorch_model``, for the jobs
    that read its attention weights.
    """

    config: Any

    def encode(self, src: Tensor) -> Any:
        """src (B, S) source ids + eos, right-padded with ``pad_id`` -> the encoder output (opaque to search)."""

    def init_cache(self, encoded: Any, beam: int = 1) -> StepCache:
        """An empty cache over ``encoded`` with ``beam`` decoder rows per sentence."""

    def decode_step(self, tokens: Tensor, cache: StepCache) -> Tensor:
        """tokens (N,) the previous token of each decoder row -> logits (N, V) of the next token; the cache
        advances one position."""


def pytorch_model(decoder: DecoderStep) -> nn.Module:
    """The PyTorch model whose weights and attention ``decoder`` computes: itself, or for a step that runs
    elsewhere (the C++ step) the model it names as ``pytorch_model``."""
    return getattr(decoder, "pytorch_model", decoder)
