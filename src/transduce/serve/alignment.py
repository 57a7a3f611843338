"""Word-level encoder–decoder attention of translations, for the web page's hover view.

:func:`word_alignments` translates a batch of sentences and records, in one teacher-forced pass per
decoder layer (:func:`transduce.decode.align.cross_attention`), the encoder–decoder attention of each
translation: the mean over layers and heads, (T, S) per sentence. :func:`word_alignment` then groups
SentencePiece pieces into words as the word alignments do (:func:`transduce.decode.align.word_of_pieces`:
``▁`` starts a word, a piece that is only whitespace belongs to none): the weight of target word j on
source word i is the mean, over j's pieces, of the summed weights of i's pieces. ``</s>`` is dropped on
both axes, so a row sums to at most 1; what is missing went to the source's ``</s>`` or bare ``▁``. Nothing here
imports a plotting library.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..decode.align import WORD_START, check_model, cross_attention, word_of_pieces
from ..decode.search_options import SearchOptions


def word_spans(pieces: list[str]) -> list[tuple[str, int, int]]:
    """(word, first piece, end piece) of each word of ``pieces`` as :func:`~transduce.decode.align.word_of_pieces`
    counts words (a piece that is only whitespace, such as a bare ``▁``, belongs to none)."""
    words = word_of_pieces(pieces)
    spans: list[tuple[str, int, int]] = []
    for i, word in enumerate(words):
        if word is None:
            continue
        if spans and words[spans[-1][1]] == word:
            spans[-1] = (spans[-1][0] + pieces[i], spans[-1][1], i + 1)
        else:
            spans.append((pieces[i], i, i + 1))
    return [(text.replace(WORD_START, " ").strip(), start, end) for text, start, end in spans]


@dataclass
class CrossAttention:
    """One translation's pieces and its attention: ``cross`` (T, S), rows ``target_out``, columns ``source``."""

    source: list[str]  # S pieces: source + </s>
    target_out: list[str]  # T pieces: output + </s>
    translation: str
    cross: np.ndarray


EMPTY = {"translation": "", "source_words": [], "target_words": [], "weights": []}


def word_alignments(
    translator,
    sentences: list[str],
    search: SearchOptions | None = None,
    target_lang: str | None = None,
    sources: list | None = None,
) -> list[dict]:
    """Translate ``sentences`` together (``search``, default the paper's) and give each one's
    :func:`word_alignment` (blank lines: empty); ``sources``: the sentences already encoded
    (:meth:`Translator.encode_sources`), else encoded here once."""
    model, vocabs = check_model(translator.model), translator.vocabs
    if sources is None:
        sources = translator.encode_sources(sentences, truncate=False, target_lang=target_lang)
    results = translator.translate(
        sentences, search, return_scores=True, truncate=False, target_lang=target_lang, sources=sources
    )
    keep = [n for n, ids in enumerate(sources) if ids is not None]
    out = [dict(EMPTY) for _ in sentences]
    if not keep:
        return out
    src, tgt = [sources[n] for n in keep], [results[n].tokens for n in keep]
    layers = len(model.decoder.layers)
    with torch.no_grad():
        per_layer = [cross_attention(model, src, tgt, layer, translator.device) for layer in range(layers)]
    eos = model.config.eos_id
    for k, n in enumerate(keep):
        cross = torch.stack([w[k] for w in per_layer]).mean(dim=0).numpy()  # (T, S): mean over layers (of heads)
        pieces = CrossAttention(vocabs.src.pieces(src[k]), vocabs.tgt.pieces(tgt[k] + [eos]), results[n].text, cross)
        out[n] = word_alignment(pieces)
    return out


def word_alignment(maps: CrossAttention) -> dict:
    """``{"translation", "source_words", "target_words", "weights"}``; weights[j][i]: target word j on source word i."""
    cross = maps.cross  # (T, S)
    src = word_spans(maps.source[:-1])  # without </s>
    tgt = word_spans(maps.target_out[:-1])
    weights = np.zeros((len(tgt), len(src)))
    for j, (_, t0, t1) in enumerate(tgt):
        rows = cross[t0:t1]  # (pieces of word j, S)
        for i, (_, s0, s1) in enumerate(src):
            weights[j, i] = rows[:, s0:s1].sum(axis=1).mean()
    return {
        "translation": maps.translation,
        "source_words": [w for w, _, _ in src],
        "target_words": [w for w, _, _ in tgt],
        "weights": np.round(weights, 4).tolist(),
    }
