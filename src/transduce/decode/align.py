"""Word alignments from encoder–decoder attention, in the Pharaoh format (``0-0 1-2 ...``).

As fairseq's ``--print-alignment``: after search, one teacher-forced pass over each source and its
translation records the encoder–decoder attention (§3.2.3) of one decoder layer, averaged over its
heads; each target subword is aligned to the source subword it attends to most (argmax, source eos
excluded). Subword pairs are then mapped to word pairs ``i-j`` (source word i, target word j, both
counted from 0 over whitespace-separated words) and deduplicated. A target word's pieces may align
to several source words, so a word may appear in several pairs; a source word may align to none.

The layer is the *last* decoder layer by default, as in fairseq (``--alignment-layer`` defaults to
the last). Garg et al. (2019) found the penultimate layer best for a 6-layer model; on the 2-layer test
model the last layer placed HTML tags on exactly the right words twice as often as the first
(6 of 14 against 3 of 14, ``bench/html_tags.py``), so the default follows fairseq. ``layer`` chooses
another (from 0). A single model is supported, not an ensemble; for a C++ step (``*-native`` backends,
which record no weights) the teacher-forced pass runs the PyTorch model of the same dtype it steps for.
"""

from __future__ import annotations

import torch

from ..model import Transformer
from .step import pytorch_model

Alignment = list[tuple[int, int]]  # (source word, target word) pairs
WORD_START = "\u2581"  # SentencePiece's mark of a space


def default_layer(model: Transformer) -> int:
    """The last decoder layer (0-based)."""
    return len(model.decoder.layers) - 1


def word_of_pieces(pieces: list[str]) -> list[int | None]:
    """The word (0-based, over whitespace-separated words of the decoded text) each SentencePiece piece
    belongs to; ``None`` for a piece that is only whitespace. ``▁`` marks a space."""
    out: list[int | None] = []
    word, prev_space = -1, True
    for piece in pieces:
        first = None
        for ch in piece.replace(WORD_START, " "):
            if ch.isspace():
                prev_space = True
                continue
            if prev_space:
                word += 1
                prev_space = False
            first = word if first is None else first
        out.append(first)
    return out


def pharaoh(pairs: Alignment) -> str:
    """``"0-0 1-2 ..."``: Pharaoh format, source index first."""
    return " ".join(f"{i}-{j}" for i, j in pairs)


def check_model(model) -> Transformer:
    """The PyTorch model whose attention weights a translator's ``model`` gives: itself, or for a C++ step
    (``*-native`` backends, which record no weights) the PyTorch model of the same dtype it steps for."""
    model = pytorch_model(model)
    if not isinstance(model, Transformer):
        raise ValueError("attention weights and alignments need a single model, not an ensemble")
    return model


@torch.no_grad()
def cross_attention(
    model: Transformer, sources: list[list[int]], targets: list[list[int]], layer: int, device: torch.device
) -> list[torch.Tensor]:
    """Head-averaged encoder–decoder attention of decoder ``layer`` for (source ids + eos, target ids without
    bos/eos) pairs, one batch: a list of (T + 1, S) float tensors (rows: target pieces then eos; columns:
    source pieces then eos)."""
    cfg = model.config
    if not 0 <= layer < len(model.decoder.layers):
        raise ValueError(f"alignment layer must be in 0..{len(model.decoder.layers) - 1}, got {layer}")
    S = max(len(s) for s in sources)
    T = max(len(t) for t in targets) + 1
    src = torch.tensor([s + [cfg.pad_id] * (S - len(s)) for s in sources], device=device)  # (B, S)
    tgt = torch.tensor([[cfg.bos_id] + t + [cfg.pad_id] * (T - 1 - len(t)) for t in targets], device=device)  # (B, T)
    attn = model.decoder.layers[layer].cross_attn
    attn.record = []
    try:
        model(src, tgt)
        weights = attn.record[0].float().mean(dim=1)  # (B, h, T, S) -> (B, T, S)
    finally:
        attn.record = None
    return [weights[b, : len(t) + 1, : len(s)].cpu() for b, (s, t) in enumerate(zip(sources, targets))]


def align_pieces(
    weights: torch.Tensor, src_words: list[int | None], tgt_words: list[int | None], cover: bool = False
) -> Alignment:
    """Word pairs from one sentence's (T + 1, S) attention: each target piece's argmax source piece
    (eos excluded), mapped to words, deduplicated, sorted by target word then source word.

    ``cover`` adds, for each source word that no target piece chose, the target piece that attends to
    it most, so every source word is aligned: what HTML tag placement uses (on ``bench/html_tags.py``
    it turned the test model's tags wrapped on the exact words from 6 of 14 to 7 of 14, and its
    misses from 1 to 0)."""
    if weights.size(1) < 2:
        return []
    w = weights[: len(tgt_words), :-1]  # (T, S - 1): target pieces against source pieces, eos excluded
    best = w.argmax(dim=1).tolist()  # (T,) source piece per target piece
    pairs = {
        (src_words[j], tgt_words[t])
        for t, j in enumerate(best)
        if src_words[j] is not None and tgt_words[t] is not None
    }
    if cover:  # each source word no target piece chose: the target piece attending to it most
        chosen = {i for i, _ in pairs}
        for j, t in enumerate(w.argmax(dim=0).tolist()):  # (S - 1,) target piece per source piece
            if src_words[j] is not None and src_words[j] not in chosen and tgt_words[t] is not None:
                pairs.add((src_words[j], tgt_words[t]))
    return sorted(pairs, key=lambda p: (p[1], p[0]))


def align(
    translator,
    sources: list[list[int] | None],
    targets: list[list[int]],
    layer: int | None = None,
    batch_tokens: int = 4096,
    cover: bool = False,
) -> list[Alignment]:
    """Word alignments for each (source ids + eos or None, output ids) pair of ``translator``'s model.
    ``cover``: also align each source word that no target piece chose (:func:`align_pieces`)."""
    model = check_model(translator.model)
    layer = default_layer(model) if layer is None else layer
    out: list[Alignment] = [[] for _ in sources]
    src_vocab, tgt_vocab = translator.vocabs.src, translator.vocabs.tgt
    languages = set(getattr(translator, "target_languages", {}).values())  # >>xx<< tokens: no source word
    for index in translator.batches(sources, batch_tokens, None):
        index = [i for i in index if targets[i]]
        if not index:
            continue
        maps = cross_attention(
            model, [sources[i] for i in index], [targets[i] for i in index], layer, translator.device
        )
        for i, weights in zip(index, maps):
            ids = sources[i][:-1]
            lead = 1 if ids and ids[0] in languages else 0  # a multilingual model's >>code<< before the source
            src_words = [None] * lead + word_of_pieces(src_vocab.pieces(ids[lead:]))
            out[i] = align_pieces(weights, src_words, word_of_pieces(tgt_vocab.pieces(targets[i])), cover)
    return out
