"""How to search: :class:`SearchOptions` (beam, length penalty, length limits, n-best, sampling), passed whole.

One frozen value carries the search settings from a command line, an API call or a server request through
:meth:`~transduce.decode.translator.Translator.translate` down to :func:`~transduce.decode.search.search`,
checked once when it is made; an error names the field.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SampleConfig:
    """Sampling instead of search: temperature, then top-k, then nucleus (top-p) filtering."""

    temperature: float = 1.0
    top_k: int = 0  # 0: no top-k filter
    top_p: float = 1.0  # 1.0: no nucleus filter
    seed: int = 1

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"sampling temperature must be > 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top-k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top-p must be in (0, 1], got {self.top_p}")


@dataclass(frozen=True)
class SearchOptions:
    """The search settings (defaults: the paper, §6.1).

    beam: hypotheses kept per step (1: greedy); alpha: GNMT length penalty ((5+|Y|)/6)^α; max_len_a,
    max_len_b: at most a·|x| + b output tokens for a source of |x| tokens (capped by the model's positions);
    nbest: hypotheses returned per sentence (at most ``beam``); sample: sample tokens instead of searching
    (one output per sentence).
    """

    beam: int = 4
    alpha: float = 0.6
    max_len_a: float = 1.0
    max_len_b: int = 50
    nbest: int = 1
    sample: SampleConfig | None = None

    def __post_init__(self) -> None:
        if self.beam < 1:
            raise ValueError(f"beam must be at least 1, got {self.beam}")
        if self.sample is not None and self.nbest != 1:
            raise ValueError("sampling gives one output per line; use nbest=1")
        if self.sample is None and not 1 <= self.nbest <= self.beam:
            raise ValueError(f"nbest must be between 1 and the beam size {self.beam}, got {self.nbest}")

    @property
    def single(self) -> bool:
        """One hypothesis per step (greedy decoding or sampling), not beam search."""
        return self.beam == 1 or self.sample is not None

    def replace(self, **changes: Any) -> SearchOptions:
        """A copy with ``changes`` (checked again)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def of(cls, search: SearchOptions | None = None, **loose: Any) -> SearchOptions:
        """``search``, or one made from the loose keyword arguments that are not None (``beam=4, alpha=0.6``,
        the older way to pass them); giving both is an error naming the loose ones."""
        given = {k: v for k, v in loose.items() if v is not None}
        unknown = set(given) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise TypeError(f"unknown search options: {', '.join(sorted(unknown))}")
        if search is None:
            return cls(**given)
        if given:
            raise ValueError(f"give either search=SearchOptions(...) or {', '.join(sorted(given))}, not both")
        return search
