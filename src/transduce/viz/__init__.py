"""Seeing inside the model: attention heatmaps, the paper's arguments as plots, Table 1 measured.

* :mod:`.attention` (+ :mod:`.attention_html`) — ``transduce attention``; ``sentence_attention(translator, text)``
* :mod:`.plots` — ``transduce plot positions|schedule|smoothing|masks|curves|scaling``
* :mod:`.scaling` — the 1/√d_k argument (§3.2.1) measured
* :mod:`.complexity` (+ :mod:`.restricted`, :mod:`.paths`) — ``transduce complexity`` (Table 1)

Figures are drawn with matplotlib's Agg backend (no display needed).
"""
