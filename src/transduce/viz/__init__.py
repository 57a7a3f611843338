"""Seeing inside the model: attention heatmaps, the paper's arguments as plots, Table 1 measured.

attention_maps.py — one sentence's attention weights, recorded from a translator (no plotting)
attention.py      — ``transduce attention``: those weights drawn as PNG heatmaps, or the HTML page
attention_html.py — the self-contained HTML page to browse them by kind, layer and head
plots.py          — ``transduce plot positions|schedule|smoothing|masks|curves|scaling``
scaling.py        — the 1/√d_k argument (§3.2.1) measured
complexity.py     — ``transduce complexity``: Table 1 measured
restricted.py     — restricted (banded) self-attention for Table 1's last row
paths.py          — maximum path lengths and sequential operations of Table 1, counted
figure.py         — matplotlib's Agg backend and the PNG writer the figures share
"""
