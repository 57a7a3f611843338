"""Word-level encoder–decoder attention of one translation, for the web page's hover view.

From :func:`transduce.viz.attention.sentence_attention`'s cross-attention (L_dec, h, T, S) this keeps
the mean over layers and heads (T, S), then groups SentencePiece pieces into words (a piece starting
with ``▁`` starts a word): the weight of target word j on source word i is the mean, over j's pieces,
of the summed weights of i's pieces. ``</s>`` is dropped on both axes, so a row sums to at most 1;
what is missing went to the source's ``</s>``.
"""

from __future__ import annotations

import numpy as np

WORD_START = "\u2581"


def word_spans(pieces: list[str]) -> list[tuple[str, int, int]]:
    """(word, first piece, end piece) for pieces split at ``▁``."""
    spans: list[tuple[str, int, int]] = []
    for i, piece in enumerate(pieces):
        if piece.startswith(WORD_START) or not spans:
            spans.append((piece.lstrip(WORD_START), i, i + 1))
        else:
            word, start, _ = spans[-1]
            spans[-1] = (word + piece, start, i + 1)
    return [s for s in spans if s[0]]  # a bare "▁" piece is no word


def word_alignment(maps) -> dict:
    """``{"translation", "source_words", "target_words", "weights"}``; weights[j][i]: target word j on source word i."""
    cross = maps.cross.mean(axis=(0, 1))  # (T, S): mean over layers and heads
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
