"""The study's paired test (transduce.study.significance) is sacreBLEU's: the same p-value and estimate as
``sacrebleu.significance.PairedTest`` on the texts, computed from the per-sentence statistics alone."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from conftest import read_corpus
from sacrebleu.metrics import BLEU
from sacrebleu.significance import PairedTest

from transduce.metrics import moses_lower
from transduce.study.significance import bleu_of, bleu_statistics, paired_bootstrap, ppl_of


def damaged(lines: list[str], rate: float, seed: int) -> list[str]:
    """Each word dropped with probability ``rate``: a worse system, sentence by sentence."""
    rng = random.Random(seed)
    return [" ".join(w for w in line.split() if rng.random() > rate) for line in lines]


@pytest.mark.parametrize("rate", [0.05, 0.3])
def test_bleu_test_is_sacrebleus_paired_bootstrap(rate):
    refs = read_corpus("valid", "fr", 200)
    system, baseline = damaged(refs, rate, 1), damaged(refs, 0.1, 2)
    ours = paired_bootstrap(bleu_statistics(system, refs, "fr"), bleu_statistics(baseline, refs, "fr"), bleu_of)

    tok = lambda lines: moses_lower(lines, "fr")  # noqa: E731 - tok-lc BLEU, as the study scores
    metric = BLEU(tokenize="none", force=True)
    test = PairedTest([("baseline", tok(baseline)), ("system", tok(system))], {"BLEU": metric}, [tok(refs)], "bs", 1000)
    _, results = test()
    theirs = results["BLEU"][1]  # the system's result (the baseline is first)
    assert ours.delta == pytest.approx(theirs.score - results["BLEU"][0].score, abs=1e-9)
    assert ours.p == pytest.approx(theirs.p_value, abs=2e-3)  # float32 sums in sacreBLEU, float64 here
    assert (ours.p < 0.05) == (rate != 0.1)
    assert ours.low <= ours.delta <= ours.high


def test_perplexity_test_finds_a_real_difference_and_not_a_fake_one():
    rng = np.random.default_rng(0)
    tokens = rng.integers(5, 25, 500)
    nll = tokens * rng.uniform(1.5, 2.5, 500)
    base = np.stack([nll, tokens], 1)  # (sentences, 2)
    better = np.stack([nll * 0.95, tokens], 1)
    t = paired_bootstrap(better, base, ppl_of)
    assert t.delta == pytest.approx(math.exp(nll.sum() * 0.95 / tokens.sum()) - math.exp(nll.sum() / tokens.sum()))
    assert t.p < 0.01 and t.high < 0
    noise = np.stack([nll * rng.uniform(0.9, 1.1, 500), tokens], 1)  # no systematic change
    assert paired_bootstrap(noise, base, ppl_of).p > 0.05


def test_sentences_must_pair():
    with pytest.raises(ValueError, match="3 sentences against 2"):
        paired_bootstrap(np.ones((3, 2)), np.ones((2, 2)), ppl_of)
