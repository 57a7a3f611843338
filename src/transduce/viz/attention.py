"""Attention heatmaps for one sentence (the paper's Figures 3–5): ``transduce attention``.

The model translates the sentence (beam or greedy); one teacher-forced pass over that
translation then runs every :class:`~transduce.model.attention.MultiHeadAttention` through
the reference path (``mha.record = []``), which records the weights (B, h, T_q, T_k).

Axes: encoder self-attention has the source pieces (plus ``</s>``) on both axes; decoder
self-attention has the decoder input (``<s>`` + output pieces) on both axes; encoder–decoder
attention has the *produced* pieces (output + ``</s>``: row t is the step that emitted it)
against the source. Layers and heads are numbered from 1 on the command line and in titles,
from 0 in the saved arrays.
"""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..decode.align import check_model
from ..model import Transformer
from .figure import plt, save_png

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
    src = torch.tensor([list(src_ids) + [cfg.eos_id]])  # (1, S)
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


def sentence_attention(translator, sentence: str, beam: int = 4, target_lang: str | None = None) -> AttentionMaps:
    """Translate ``sentence`` with a :class:`~transduce.decode.translator.Translator` (``transduce.load``)
    and return the attention weights of that translation. ``target_lang``: a multilingual model's target
    language, whose ``>>code<<`` token then leads the source pieces.

    >>> maps = sentence_attention(transduce.load("model"), "A dog runs.", beam=4)  # doctest: +SKIP
    >>> maps.cross.shape   # (decoder layers, heads, output pieces + 1, source pieces + 1)  # doctest: +SKIP
    """
    model, vocabs = check_model(translator.model), translator.vocabs
    src_ids = vocabs.src.encode(sentence)
    if not src_ids:
        raise ValueError("the sentence is empty after subword encoding")
    language = {} if target_lang is None else {"target_lang": target_lang}
    if language:
        src_ids = translator.language_prefix(target_lang) + src_ids  # as translate() encodes it
    result = translator.translate([sentence], beam=beam, return_scores=True, truncate=False, **language)[0]
    enc, dec, cross = record_weights(model, src_ids, result.tokens)
    eos = model.config.eos_id
    return AttentionMaps(
        source=vocabs.src.pieces(src_ids + [eos]),
        target_in=vocabs.tgt.pieces([model.config.bos_id] + result.tokens),
        target_out=vocabs.tgt.pieces(result.tokens + [eos]),
        translation=result.text,
        encoder=enc,
        decoder=dec,
        cross=cross,
    )


# ----------------------------------------------------------------- drawing
def _panel(ax, weights: np.ndarray, rows: list[str], cols: list[str], title: str, vmax: float):
    ratio = len(rows) / max(len(cols), 1)  # square cells unless the panel would be over 2:1
    aspect = min(max(ratio, 0.5), 2.0) / ratio
    image = ax.imshow(weights, cmap="viridis", vmin=0.0, vmax=vmax, aspect=aspect, interpolation="nearest")
    ax.set_title(title, fontsize=9)
    size = max(5, min(9, 240 // max(len(rows), len(cols), 1)))
    ax.set_xticks(range(len(cols)), cols, rotation=90, fontsize=size)
    ax.set_yticks(range(len(rows)), rows, fontsize=size)
    ax.set_xlabel("key", fontsize=8)
    ax.set_ylabel("query", fontsize=8)
    ax.tick_params(length=0)
    return image


def check_selection(
    layer: int | None, head: int | None, encoder_layers: int, decoder_layers: int, n_heads: int
) -> None:
    """Raise ValueError unless --layer and --head (from 1) exist in both stacks."""
    if layer is not None and not 1 <= layer <= min(encoder_layers, decoder_layers):
        raise ValueError(
            f"--layer {layer}: the model has {encoder_layers} encoder and "
            f"{decoder_layers} decoder layers (numbered from 1)"
        )
    if head is not None and not 1 <= head <= n_heads:
        raise ValueError(f"--head {head}: the model has {n_heads} heads (numbered from 1)")


def draw(maps: AttentionMaps, layer: int | None, head: int | None, out: str | Path) -> Path:
    """Heatmaps: one head (layer and head given), all heads of a layer, or all layers (one head or head mean).

    One head: the three attention kinds side by side. Otherwise one row per kind.
    """
    n_heads = maps.encoder.shape[1]
    layers = {k: maps.kind(k)[0].shape[0] for k in KINDS}
    check_selection(layer, head, layers["encoder"], layers["decoder"], n_heads)
    single = layer is not None and head is not None
    columns = 1 if single else n_heads if layer else max(layers.values())
    grid = (1, 3) if single else (len(KINDS), columns)
    tokens = max(len(maps.source), len(maps.target_in))
    cell = min(7.0, max(2.6, 0.22 * tokens))  # inches per panel: about 0.2 in per token
    fig, axes = plt.subplots(
        *grid, figsize=((cell + 1.0) * grid[1], cell * grid[0] + 0.8), squeeze=False, layout="constrained"
    )
    for k, (kind, kind_title) in enumerate(KINDS.items()):
        weights, rows, cols = maps.kind(kind)
        if layer is not None:
            panels = [
                (weights[layer - 1, h], f"layer {layer}, head {h + 1}")
                for h in ([head - 1] if head else range(n_heads))
            ]
        elif head is not None:
            panels = [(weights[i, head - 1], f"layer {i + 1}, head {head}") for i in range(weights.shape[0])]
        else:
            panels = [(weights[i].mean(0), f"layer {i + 1}, mean of {n_heads} heads") for i in range(weights.shape[0])]
        vmax = max(float(w.max()) for w, _ in panels) or 1.0
        row_axes = [axes[0, k]] if single else list(axes[k])
        for col, ax in enumerate(row_axes):
            if col >= len(panels):
                ax.axis("off")
                continue
            image = _panel(ax, panels[col][0], rows, cols, f"{kind_title}\n{panels[col][1]}", vmax)
        fig.colorbar(image, ax=row_axes, shrink=0.8, label="attention weight")
    fig.suptitle(
        "\n".join(
            textwrap.wrap(f"{''.join(maps.source[:-1]).replace(chr(0x2581), ' ').strip()}  →  {maps.translation}", 110)
        ),
        fontsize=11,
    )
    return save_png(fig, out)


# ----------------------------------------------------------------- command line
def add_arguments(parser) -> None:
    parser.add_argument("sentence", help="source sentence (raw text)")
    parser.add_argument("--model", required=True, help="model directory")
    parser.add_argument("--layer", type=int, help="layer, from 1 (default: all layers)")
    parser.add_argument("--head", type=int, help="head, from 1 (default: all heads of --layer, else head mean)")
    search = parser.add_mutually_exclusive_group()
    search.add_argument("--beam", type=int, default=4, help="beam size of the translation (default 4, §6.1)")
    search.add_argument("--greedy", action="store_true", help="greedy search (same as --beam 1)")
    parser.add_argument("--out", required=True, help="FILE.png (heatmaps) or FILE.html (interactive view)")
    parser.add_argument("--save-weights", help="also write the raw weights to FILE.npz or FILE.json")


def run(args) -> int:
    from ..api import load
    from .attention_html import write_html

    out = Path(args.out)
    if out.suffix.lower() not in (".png", ".html"):
        raise ValueError(f"{out}: --out must end in .png or .html")
    if args.beam < 1:
        raise ValueError(f"--beam must be at least 1, got {args.beam}")
    translator = load(args.model, backend="fp32")  # attention weights are recorded by the Python step
    cfg = translator.config
    check_selection(args.layer, args.head, cfg.encoder_layers, cfg.decoder_layers, cfg.n_heads)
    maps = sentence_attention(translator, args.sentence, beam=1 if args.greedy else args.beam)
    print(f"translation: {maps.translation}")
    if out.suffix.lower() == ".html":
        write_html(maps, out)
    else:
        draw(maps, args.layer, args.head, out)
    print(f"wrote {out}")
    if args.save_weights:
        print(f"wrote {maps.save(args.save_weights)}")
    return 0
