"""Attention heatmaps for one sentence (the paper's Figures 3–5): ``transduce attention``.

The weights come from :mod:`~transduce.viz.attention_maps` (one teacher-forced pass over the sentence's
translation); this module draws them as PNG heatmaps (matplotlib) or writes the HTML page
(:mod:`~transduce.viz.attention_html`). Layers and heads are numbered from 1 on the command line and in
titles, from 0 in the saved arrays.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np

from ..backends import AUTO
from ..backends.policy import for_python_model
from ..decode.search_options import SearchOptions, add_search_arguments
from .attention_html import write_html
from .attention_maps import KINDS, AttentionMaps, record_weights, sentence_attention
from .figure import plt, save_png

__all__ = ["AttentionMaps", "KINDS", "check_selection", "draw", "record_weights", "sentence_attention"]


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
    search = parser.add_argument_group("search of the translation (defaults: the paper, §6.1)")
    add_search_arguments(search, modes=())
    search.add_argument("--greedy", dest="beam", action="store_const", const=1, help="greedy search: --beam 1")
    parser.add_argument("--out", required=True, help="FILE.png (heatmaps) or FILE.html (interactive view)")
    parser.add_argument("--save-weights", help="also write the raw weights to FILE.npz or FILE.json")


def run(args) -> int:
    from ..api import load

    out = Path(args.out)
    if out.suffix.lower() not in (".png", ".html"):
        raise ValueError(f"{out}: --out must end in .png or .html")
    search = SearchOptions.from_args(args)
    translator = load(args.model, backend=for_python_model(AUTO))  # it reads one PyTorch model's attention
    cfg = translator.config
    check_selection(args.layer, args.head, cfg.encoder_layers, cfg.decoder_layers, cfg.n_heads)
    maps = sentence_attention(translator, args.sentence, search)
    print(f"translation: {maps.translation}")
    if out.suffix.lower() == ".html":
        write_html(maps, out)
    else:
        draw(maps, args.layer, args.head, out)
    print(f"wrote {out}")
    if args.save_weights:
        print(f"wrote {maps.save(args.save_weights)}")
    return 0
