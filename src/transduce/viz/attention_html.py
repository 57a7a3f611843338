"""A self-contained HTML page to browse one sentence's attention: pick kind, layer and head.

The weights travel as inline JSON; a short script draws the chosen matrix as a table
whose cell shading is the weight (hover shows the value). No network access needed.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

from .attention_maps import KINDS, AttentionMaps

_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>attention: {title}</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; }}
table {{ border-collapse: collapse; font-size: 12px; }}
td {{ width: 26px; height: 22px; text-align: center; border: 1px solid #eee; }}
th {{ font-weight: normal; padding: 2px 4px; white-space: nowrap; }}
thead th {{ writing-mode: vertical-rl; transform: rotate(180deg); text-align: left; }}
label {{ margin-right: 1em; }}
</style></head><body>
<h2>{title}</h2>
<p>Rows are queries, columns keys; a cell's shade is its attention weight (hover for the value).
Decoder rows: self-attention is labelled by the decoder input, encoder–decoder attention by the
piece each step produced.</p>
<label>attention <select id="kind">{kind_options}</select></label>
<label>layer <select id="layer"></select></label>
<label>head <select id="head"></select></label>
<div id="view"></div>
<script id="data" type="application/json">{data}</script>
<script>
const D = JSON.parse(document.getElementById("data").textContent);
const axes = {{encoder: ["source", "source"], decoder: ["target_in", "target_in"], cross: ["target_out", "source"]}};
const $ = (id) => document.getElementById(id);
function options(sel, n, extra) {{
  const keep = sel.value;
  sel.innerHTML = (extra ? '<option value="mean">mean</option>' : "") +
    Array.from({{length: n}}, (_, i) => `<option value="${{i}}">${{i + 1}}</option>`).join("");
  if ([...sel.options].some(o => o.value === keep)) sel.value = keep;
}}
function esc(s) {{ const d = document.createElement("div"); d.textContent = s; return d.innerHTML; }}
function draw() {{
  const W = D[$("kind").value];
  options($("layer"), W.length, false);
  options($("head"), W[0].length, true);
  const L = W[+$("layer").value], h = $("head").value;
  const M = h === "mean" ? L[0].map((r, i) => r.map((_, j) => L.reduce((s, H) => s + H[i][j], 0) / L.length)) : L[+h];
  const [rows, cols] = axes[$("kind").value].map(k => D[k]);
  const top = Math.max(...M.flat()) || 1;
  let t = "<table><thead><tr><th></th>" + cols.map(c => `<th>${{esc(c)}}</th>`).join("") + "</tr></thead><tbody>";
  M.forEach((r, i) => {{
    t += `<tr><th style="text-align:right">${{esc(rows[i])}}</th>` + r.map(w =>
      `<td title="${{w.toFixed(4)}}" style="background:rgba(30,60,160,${{(w / top).toFixed(3)}})"></td>`).join("") + "</tr>";
  }});
  $("view").innerHTML = t + "</tbody></table>";
}}
["kind", "layer", "head"].forEach(id => $(id).addEventListener("change", draw));
draw();
</script></body></html>
"""


def write_html(maps: AttentionMaps, path: str | Path) -> Path:
    """Write the interactive view of ``maps`` to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps(maps.to_json(), ensure_ascii=False).replace("</", "<\\/")  # safe inside <script>
    kinds = "".join(f'<option value="{k}">{html.escape(v)}</option>' for k, v in KINDS.items())
    title = html.escape(f"{' '.join(maps.source)} → {maps.translation}")
    path.write_text(_PAGE.format(title=title, kind_options=kinds, data=data), encoding="utf-8")
    return path
