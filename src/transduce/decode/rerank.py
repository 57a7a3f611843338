"""Noisy-channel reranking: beam search's n-best list rescored with a model of the other direction.

Beam search ranks candidates by the direct model alone, ``log p(y | x) / lp(|y|)`` (§6.1's length
penalty). Reranking adds a channel term, how well the candidate explains the source:

    score(y) = log p(y | x) / lp(|y|)  +  λ · log p(x | y) / (|x| + 1)

(Yee et al., EMNLP 2019, without their language model term). ``log p(x | y)`` is the teacher-forced
log-probability of the source (its pieces and eos) given the candidate, from a target→source model with
the same vocabulary. With BiT (``train.bidirectional``) the run's own snapshot at the switch, which
was trained on both directions, is such a model, so it costs no extra training. λ = 0 returns beam
search's own first choice; the recipe chooses λ on the validation split.
"""

from __future__ import annotations

import torch

from .hypothesis import Hypothesis
from .search_options import RerankConfig, SearchOptions  # noqa: F401 (reranking's settings, named here too)


@torch.no_grad()
def sequence_logprobs(
    model, pairs: list[tuple[list[int], list[int]]], batch_tokens: int = 4096, device: str | torch.device = "cpu"
) -> list[float]:
    """Teacher-forced ``log p(target | source)`` under ``model`` for each ``(source, target)`` pair of
    ids without bos/eos; the target's eos counts, as in training. Pairs are scored in batches of similar
    length (at most ``batch_tokens`` padded source tokens); the results come back in input order."""
    cfg = model.config
    order = sorted(range(len(pairs)), key=lambda i: (len(pairs[i][0]), len(pairs[i][1])))
    out = [0.0] * len(pairs)
    start = 0
    while start < len(order):
        end = start + 1
        while end < len(order) and (end - start + 1) * (len(pairs[order[end]][0]) + 1) <= batch_tokens:
            end += 1
        index = order[start:end]
        eos = [cfg.eos_id] if cfg.source_eos else []
        src_len = max(len(pairs[i][0]) for i in index) + len(eos)
        tgt_len = max(len(pairs[i][1]) for i in index) + 2
        src = torch.full((len(index), src_len), cfg.pad_id, dtype=torch.long)  # (B, S)
        tgt = torch.full((len(index), tgt_len), cfg.pad_id, dtype=torch.long)  # (B, T + 1)
        for row, i in enumerate(index):
            s, t = pairs[i]
            src[row, : len(s) + len(eos)] = torch.tensor(s + eos)
            tgt[row, : len(t) + 2] = torch.tensor([cfg.bos_id] + t + [cfg.eos_id])
        src, tgt = src.to(device), tgt.to(device)
        logits = model(src, tgt[:, :-1]).float()  # (B, T, V)
        gold = tgt[:, 1:]  # (B, T)
        lp = torch.log_softmax(logits, dim=-1).gather(-1, gold.unsqueeze(-1)).squeeze(-1)  # (B, T)
        lp = lp.masked_fill(gold == cfg.pad_id, 0.0).sum(dim=1)  # (B,)
        for row, i in enumerate(index):
            out[i] = float(lp[row])
        start = end
    return out


def channel_scores(
    channel,
    sources: list[list[int] | None],
    nbest: list[list[Hypothesis]],
    batch_tokens: int = 4096,
    device: str | torch.device = "cpu",
) -> list[list[float]]:
    """``log p(x | y) / (|x| + 1)`` for every candidate ``y`` of every source ``x`` (ids + eos, or None for
    an empty line, whose one empty candidate gets 0) under the target→source model ``channel``."""
    pairs, where = [], []
    for n, (src, hyps) in enumerate(zip(sources, nbest)):
        if src is None:
            continue
        for k, hyp in enumerate(hyps):
            pairs.append((hyp.tokens, src[:-1]))  # the candidate is the channel model's source
            where.append((n, k))
    logprobs = sequence_logprobs(channel, pairs, batch_tokens, device)
    out = [[0.0] * len(hyps) for hyps in nbest]
    for (n, k), lp in zip(where, logprobs):
        out[n][k] = lp / len(sources[n])  # sources[n] holds x + eos: |x| + 1 scored tokens
    return out


def choose(hyps: list[Hypothesis], channel: list[float], weight: float) -> int:
    """Index of the candidate with the highest ``score + weight · channel`` (the first of equals, i.e.
    beam search's order)."""
    totals = [h.score + weight * c for h, c in zip(hyps, channel)]
    return max(range(len(hyps)), key=lambda i: (totals[i], -i))


def sweep(
    translator, sentences: list[str], weights: list[float], search: SearchOptions, batch_tokens: int = 4096
) -> dict[float, list[str]]:
    """The 1-best text of every sentence for each λ in ``weights``, from one beam search (``search``, whose
    ``rerank`` names the candidates kept; its weight is each of ``weights`` in turn) and one channel scoring:
    what the recipe compares on the validation split."""
    if search.rerank is None:
        raise ValueError("sweep reranks: give search=SearchOptions(rerank=RerankConfig(candidates))")
    sources = translator.encode_sources(sentences)
    nbest = translator.search(sources, search.searched, batch_tokens=batch_tokens)
    channel = translator.channel_scores(sources, nbest, batch_tokens)
    decode = translator.vocabs.tgt.decode
    return {w: [decode(hyps[choose(hyps, c, w)].tokens) for hyps, c in zip(nbest, channel)] for w in weights}
