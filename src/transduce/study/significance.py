"""Paired tests of one row against another on the same dev sentences: sacreBLEU's paired bootstrap resampling.

A row's result keeps, per dev sentence, the sufficient statistics of its BLEU (hypothesis and reference
lengths, matched and total n-grams, as sacreBLEU extracts them) and of its perplexity (the reference's
negative log-likelihood and token count). From them alone, without the references, the test is sacreBLEU's
(``sacrebleu.significance``, as Koehn 2004 and Moses' ``bootstrap-hypothesis-difference-significance.pl``):
draw ``n`` resamples of the sentences with replacement, the same draws for both systems, score each
resample from its summed statistics, and take as p-value the share of resampled absolute differences, centred,
that exceed the real one. The interval is the 2.5-97.5 percentile range of the resampled differences.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import sacrebleu
from sacrebleu.significance import _compute_p_value

from ..metrics import moses_lower

SAMPLES = 1000
SEED = 12345  # sacreBLEU's default (SACREBLEU_SEED): every comparison draws the same resamples
_BLEU = sacrebleu.metrics.BLEU(tokenize="none", force=True)  # on Moses-tokenised, lowercased text: tok-lc BLEU


def bleu_statistics(hyps: list[str], refs: list[str], lang: str) -> list[list[int]]:
    """Per sentence: tok-lc BLEU's sufficient statistics (sacreBLEU's 10 numbers: lengths, n-gram matches, totals)."""
    return [
        [int(v) for v in s]
        for s in _BLEU._extract_corpus_statistics(moses_lower(hyps, lang), [moses_lower(refs, lang)])
    ]


def bleu_of(stats: np.ndarray) -> float:
    """tok-lc BLEU of summed statistics ``stats`` (10,)."""
    return _BLEU._compute_score_from_stats(stats.tolist()).score


def ppl_of(stats: np.ndarray) -> float:
    """Perplexity of summed ``[nll, tokens]`` (2,)."""
    return math.exp(stats[0] / max(stats[1], 1.0))


@dataclass(frozen=True)
class Paired:
    """``system`` − ``baseline`` on the same sentences: the difference, its 95% interval, and the p-value."""

    delta: float
    low: float
    high: float
    p: float


def paired_bootstrap(system, baseline, score, samples: int = SAMPLES, seed: int = SEED) -> Paired:
    """The paired bootstrap test of ``system`` against ``baseline``, each (sentences, k) per-sentence statistics
    scored by ``score`` (:func:`bleu_of` or :func:`ppl_of`) from their sum over the sentences."""
    a, b = np.asarray(system, dtype=np.float64), np.asarray(baseline, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(
            f"paired test: {a.shape[0]} sentences against {b.shape[0]}; the rows were scored on other dev sets"
        )
    rng = np.random.default_rng(seed)
    draws = rng.choice(len(a), size=(samples, len(a)), replace=True)  # (samples, sentences), as sacreBLEU draws
    counts = np.stack([np.bincount(d, minlength=len(a)) for d in draws]).astype(np.float64)  # (samples, sentences)
    sums_a, sums_b = counts @ a, counts @ b  # (samples, k): each resample's summed statistics
    real = score(a.sum(0)) - score(b.sum(0))
    diffs = np.array([score(x) - score(y) for x, y in zip(sums_a, sums_b)])  # (samples,)
    centred = np.abs(diffs) - np.abs(diffs).mean()
    p = _compute_p_value(centred, abs(real))
    low, high = np.percentile(diffs, [2.5, 97.5])
    return Paired(real, float(low), float(high), p)
