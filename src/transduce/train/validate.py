"""Validation: loss and perplexity on the dev split, and BLEU on a dev subset when decoding exists.

BLEU goes through ``transduce.decode`` (the translator of ``transduce translate``) and sacreBLEU. If that package
offers no translator yet, :func:`bleu_hook` returns None and training logs loss/perplexity only, and the
best checkpoint is chosen by validation loss.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from .loss import SmoothedLoss
from .step import TrainingLoss


@torch.no_grad()
def valid_loss(
    model: nn.Module, batches, device: torch.device, dtype: str, objective: SmoothedLoss, kernel: str = "auto"
) -> dict[str, float]:
    """Smoothed loss, NLL and perplexity per target token over ``batches`` (model in eval mode)."""
    was_training = model.training
    model.eval()
    compute = TrainingLoss(model, objective, device, dtype, kernel)
    loss_sum = nll_sum = 0.0
    tokens = 0
    for batch in batches:
        loss, nll, n = compute(batch.src.to(device), batch.tgt.to(device), batch.tgt_tokens)
        loss_sum, nll_sum, tokens = loss_sum + float(loss), nll_sum + float(nll), tokens + n
    model.train(was_training)
    nll = nll_sum / max(tokens, 1)
    return {
        "valid_loss": loss_sum / max(tokens, 1),
        "valid_nll": nll,
        "valid_ppl": math.exp(min(nll, 100.0)),
        "valid_tokens": tokens,
    }


def bleu_hook(split, vocabs, sentences: int, beam: int, device: torch.device) -> Callable[[nn.Module], float] | None:
    """A function model -> sacreBLEU of its translations of the first ``sentences`` of ``split``
    (raw NFC text in, detokenised text out), or None when ``transduce.decode`` has no translator.

    The references are normalised as the target vocabulary normalises (lowercased for a lowercasing
    vocabulary, whose outputs are lowercase), so the score measures the model, not the casing."""
    if sentences <= 0:
        return None
    try:
        from ..decode.search_options import SearchOptions
        from ..decode.translator import Translator  # `transduce translate`'s
    except ImportError:
        return None
    import sacrebleu

    n = min(sentences, len(split))
    sources = [split.src_text(i) for i in range(n)]
    references = [vocabs.tgt.normalize(split.tgt_text(i)) for i in range(n)]

    def score(model: nn.Module) -> float:
        was_training = model.training
        try:
            with torch.no_grad():
                hypotheses = Translator(model, vocabs, device).translate(sources, SearchOptions(beam=beam))
        finally:
            model.train(was_training)
        return sacrebleu.corpus_bleu(hypotheses, [references]).score

    return score
