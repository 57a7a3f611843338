"""A search's output and how it is scored: :class:`Hypothesis`, the length penalty and the length limit.

Shared by every search (:mod:`~transduce.decode.search`, :mod:`~transduce.decode.constraints`) and by the
choosers that rerank their n-best lists (:mod:`~transduce.decode.mbr`, :mod:`~transduce.decode.rerank`).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass
class Hypothesis:
    """One output: ``tokens`` without bos/eos, ``logprob`` = Σ log p(y_t | y_<t, x) including eos,
    ``score`` = logprob / lp(|Y|) (the length-normalised score beam search ranks by)."""

    tokens: list[int]
    logprob: float
    score: float


def length_penalty(length: int, alpha: float) -> float:
    """GNMT's lp(Y) = ((5 + |Y|) / 6)^α (Wu et al. 2016); |Y| counts the eos token."""
    return ((5.0 + length) / 6.0) ** alpha


def max_lengths(src: Tensor, pad_id: int, a: float, b: int, limit: int) -> list[int]:
    """Most output tokens (without eos) per sentence: a·|x| + b, |x| without eos, capped at ``limit``."""
    src_len = (src != pad_id).sum(1) - 1  # (B,) tokens without eos
    return limits_of(src_len.tolist(), a, b, limit)


def limits_of(src_len: list[int], a: float, b: int, limit: int) -> list[int]:
    """:func:`max_lengths` from each source's token count without eos."""
    return [min(int(a * n + b), limit) for n in src_len]
