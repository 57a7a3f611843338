"""Minimum Bayes-risk (MBR) selection from beam search's n-best list.

Beam search returns the hypothesis the model scores highest. MBR instead returns the one
the other candidates agree with most: the candidate y maximising the expected utility

    E[u(y)] = Σ_j w_j · u(y, y_j)

over the n-best list {y_1 … y_n}, each y_j standing in as a pseudo-reference (Kumar & Byrne,
2004; Eikema & Aziz, 2020). The weights are the model's sequence probabilities renormalised
over the list (``weights="model"``) or equal (``"uniform"``); a candidate counts as its own
pseudo-reference. ``u`` is sacreBLEU's sentence BLEU (effective order, so short sentences
are not zero) or sentence chrF. Ties go to the earlier candidate, i.e. beam search's order.

This is a decision rule, not a search: the candidates are exactly beam search's, so with
``candidates=1`` the output is beam search's. Costs n² utility calls per sentence.
"""

from __future__ import annotations

import math

import sacrebleu

from .search_options import UTILITIES, WEIGHTS, MBRConfig  # noqa: F401 (MBR's settings, named here too)


def _metric(utility: str):
    if utility == "bleu":
        return sacrebleu.metrics.BLEU(effective_order=True)
    return sacrebleu.metrics.CHRF()


def expected_utilities(texts: list[str], logprobs: list[float], config: MBRConfig) -> list[float]:
    """E[u(y_i)] for each candidate text; ``logprobs`` are the candidates' log p(y | x)."""
    if len(texts) != len(logprobs):
        raise ValueError(f"{len(texts)} candidates but {len(logprobs)} log-probabilities")
    n = len(texts)
    if config.weights == "model":
        top = max(logprobs)
        raw = [math.exp(lp - top) for lp in logprobs]  # shifted: exp never underflows to all-zero
        total = sum(raw)
        weights = [r / total for r in raw]
    else:
        weights = [1.0 / n] * n
    metric = _metric(config.utility)
    out = []
    for i in range(n):
        out.append(
            sum(
                w * (100.0 if i == j and texts[i] else metric.sentence_score(texts[i], [texts[j]]).score)
                for j, w in enumerate(weights)
            )
            / 100.0
        )
    return out


def choose(texts: list[str], logprobs: list[float], config: MBRConfig) -> int:
    """Index of the candidate with the highest expected utility (the first of equals)."""
    if len(texts) == 1:
        return 0
    gains = expected_utilities(texts, logprobs, config)
    return max(range(len(texts)), key=lambda i: (gains[i], -i))
