"""One sentence's attention weights (the paper's Figures 3–5), recorded from a translator's PyTorch model.

The model translates the sentence (beam or greedy); one teacher-forced pass over that
translation then runs every :class:`~transduce.model.attention.MultiHeadAttention` through
the reference path (``mha.record = []``), which records the weights (B, h, T_q, T_k).

Axes: encoder self-attention has the source pieces (plus ``</s>``) on both axes; decoder
self-attention has the decoder input (``<s>`` + output pieces) on both axes; encoder–decoder
attention has the *produced* pieces (output + ``</s>``: row t is the step that emitted it)
against the source. Layers and heads are numbered from 0 in the arrays (from 1 on the command line and in the
drawings, :mod:`~transduce.viz.attention`). No plotting here: the server's attention job imports this module
without matplotlib.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..decode.align import check_model
from ..decode.search_options import SearchOptions
from ..model import Transformer

KINDS = {
    "encoder": "encoder self-attention",
    "decoder": "decoder self-attention (masked)",
    "cross": "encoder–decoder attention",
}


@dataclass
class AttentionMaps:
    """Weights of one sentence. encoder (L_enc, h, S, S); decoder (L_dec, h, T, T); cross (L_dec, h, T, S)."""

    source: list[str]  # S pieces: source + </s>
    target_in: list[str]  # T pieces: <s> + output
    target_out: list[str]  # T pieces: output + </s>
    translation: str
    encoder: np.ndarray
    decoder: np.ndarray
    cross: np.ndarray

    def kind(self, name: str) -> tuple[np.ndarray, list[str], list[str]]:
        """(weights (L, h, rows, cols), row labels, column labels) of one attention kind."""
        if name == "encoder":
            return self.encoder, self.source, self.source
        if name == "decoder":
            return self.decoder, self.target_in, self.target_in
        return self.cross, self.target_out, self.source

    def to_json(self) -> dict:
        return {
            "source": self.source,
            "target_in": self.target_in,
            "target_out": self.target_out,
            "translation": self.translation,
            **{k: np.round(getattr(self, k), 5).tolist() for k in KINDS},
        }

    def save(self, path: str | Path) -> Path:
        """Write the raw weights as .npz (arrays + token lists) or .json."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".npz":
            np.savez_compressed(
                path,
                encoder=self.encoder,
                decoder=self.decoder,
                cross=self.cross,
                source=np.array(self.source),
                target_in=np.array(self.target_in),
                target_out=np.array(self.target_out),
                translation=np.array(self.translation),
            )
        elif path.suffix == ".json":
            path.write_text(json.dumps(self.to_json(), ensure_ascii=False) + "\n")
        else:
            raise ValueError(f"{path}: --save-weights must end in .npz or .json")
        return path


# ----------------------------------------------------------------- weights
@torch.no_grad()
def record_weights(
    model: Transformer, src_ids: list[int], out_ids: list[int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One teacher-forced pass recording every head's weights.

    src_ids: source ids without eos; out_ids: output ids without bos/eos.
    Returns encoder (L, h, S, S), decoder (L, h, T, T), cross (L, h, T, S) with S = len(src)+1,
    T = len(out)+1.
    """
    cfg = model.config
    src = torch.tensor([list(src_ids) + [cfg.eos_id] * cfg.source_eos])  # (1, S)
    tgt_in = torch.tensor([[cfg.bos_id] + list(out_ids)])  # (1, T)
    groups = {
        "encoder": [layer.self_attn for layer in model.encoder.layers],
        "decoder": [layer.self_attn for layer in model.decoder.layers],
        "cross": [layer.cross_attn for layer in model.decoder.layers],
    }
    modules = [m for group in groups.values() for m in group]
    was_training = model.training
    model.eval()
    try:
        for m in modules:
            m.record = []
        model(src, tgt_in)
        stacked = {
            k: torch.stack([m.record[0][0] for m in group]).float().numpy()  # (L, h, T_q, T_k)
            for k, group in groups.items()
        }
    finally:
        for m in modules:
            m.record = None
        model.train(was_training)
    return stacked["encoder"], stacked["decoder"], stacked["cross"]


def sentence_attention(
    translator, sentence: str, search: SearchOptions | None = None, target_lang: str | None = None, **loose
) -> AttentionMaps:
    """Translate ``sentence`` with a :class:`~transduce.decode.translator.Translator` (``transduce.load``)
    and ``search`` (default: the paper's; one translation) and return the attention weights of that
    translation. ``target_lang``: a multilingual model's target language, whose ``>>code<<`` token then leads
    the source pieces. ``beam=`` alone still works, with a DeprecationWarning.

    >>> maps = sentence_attention(transduce.load("model"), "A dog runs.", SearchOptions(beam=4))  # doctest: +SKIP
    >>> maps.cross.shape   # (decoder layers, heads, output pieces + 1, source pieces + 1)  # doctest: +SKIP
    """
    search = SearchOptions.deprecated("sentence_attention", search, loose).check(one="an attention map")
    model, vocabs = check_model(translator.model), translator.vocabs
    src_ids = vocabs.src.encode(sentence)
    if not src_ids:
        raise ValueError("the sentence is empty after subword encoding")
    language = {} if target_lang is None else {"target_lang": target_lang}
    if language:
        src_ids = translator.language_prefix(target_lang) + src_ids  # as translate() encodes it
    result = translator.translate([sentence], search, return_scores=True, truncate=False, **language)[0]
    enc, dec, cross = record_weights(model, src_ids, result.tokens)
    eos = model.config.eos_id
    return AttentionMaps(
        source=vocabs.src.pieces(src_ids + [eos] * model.config.source_eos),
        target_in=vocabs.tgt.pieces([model.config.bos_id] + result.tokens),
        target_out=vocabs.tgt.pieces(result.tokens + [eos]),
        translation=result.text,
        encoder=enc,
        decoder=dec,
        cross=cross,
    )
