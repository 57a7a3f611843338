"""The study's table and plots from a sweep directory's results (``SWEEP/results/*.json``).

The table follows the paper's Table 3: N, d_model, d_ff, h, d_k, d_v, P_drop, ε_ls, train steps, params,
dev perplexity, dev BLEU, then the paper's own row and the direction of each change against the base, ours
and the paper's. A cell the row shares with the base is left blank, as in the paper.

Direction of effect: a row's mean over seeds against the base's mean. The difference counts as a change
only when it is larger than the seed spread, the larger of the two rows' ranges (max − min over seeds);
otherwise "no change". With one seed there is no spread, and no direction ("1 seed"). The paper reports
one run per row, so any difference in its figures is its direction.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .table3 import GROUPS, PAPER, PAPER_STEPS, rows

COLUMNS = ("N", "d_model", "d_ff", "h", "d_k", "d_v", "P_drop", "eps_ls")


def read_results(out: Path) -> dict[str, list[dict[str, Any]]]:
    """Row name -> its results, one per seed, in seed order."""
    by_row: dict[str, list[dict[str, Any]]] = {}
    for path in sorted((out / "results").glob("*.json")):
        try:
            result = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not a JSON result ({e})") from None
        by_row.setdefault(result["row"], []).append(result)
    return {name: sorted(rs, key=lambda r: r["seed"]) for name, rs in by_row.items()}


def bleu_key(settings: dict[str, Any]) -> str:
    """tok-lc BLEU for lowercased data (the cased sacreBLEU of lowercased output means little), else sacreBLEU."""
    manifest = Path(settings["data"]) / "manifest.json"
    try:
        lowercase = json.loads(manifest.read_text())["settings"]["lowercase"]
    except (OSError, KeyError, json.JSONDecodeError):
        lowercase = False
    return "dev_tok_lc_bleu" if lowercase else "dev_bleu"


def direction(values: list[float], base: list[float], lower_is_better: bool) -> str:
    """ "better", "worse" or "no change" of ``values`` against ``base`` (module docstring); "1 seed" without a spread."""
    if len(values) < 2 or len(base) < 2:
        return "1 seed"
    spread = max(max(values) - min(values), max(base) - min(base))
    diff = sum(values) / len(values) - sum(base) / len(base)
    if abs(diff) <= spread:
        return "no change"
    return "better" if (diff < 0) == lower_is_better else "worse"


def paper_direction(name: str, metric: str) -> str:
    value, base = PAPER[name][metric], PAPER["base"][metric]
    if value == base:
        return "no change"
    return "better" if (value < base) == (metric == "ppl") else "worse"


def _mean_spread(values: list[float], digits: int) -> str:
    mean = sum(values) / len(values)
    if len(values) < 2:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {(max(values) - min(values)) / 2:.{digits}f}"


def table(out: Path) -> tuple[str, list[dict[str, Any]]]:
    """The Markdown table and, per row with results, its summary (for plots and tests)."""
    settings = json.loads((out / "sweep.json").read_text())
    metric = bleu_key(settings)
    results = read_results(out)
    base_results = results.get("base", [])
    base_ppl = [r["dev_ppl"] for r in base_results]
    base_bleu = [r[metric] for r in base_results]
    all_rows = rows(settings["d_model"])
    base_shape = all_rows[0].shape()
    bleu_name = "tok-lc BLEU" if metric == "dev_tok_lc_bleu" else "sacreBLEU"
    head = (
        f"| row | N | d_model | d_ff | h | d_k | d_v | P_drop | ε_ls | train steps | params ×10⁶ | dev PPL | "
        f"dev BLEU ({bleu_name}) | seeds | paper: PPL | paper: BLEU | paper: params ×10⁶ | "
        "vs base, PPL / BLEU | paper vs base, PPL / BLEU |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    summaries = []
    for row in all_rows:
        rs = results.get(row.name)
        if not rs:
            continue
        shape = row.shape()
        cells = [str(shape[c]) if row.name == "base" or shape[c] != base_shape[c] else "" for c in COLUMNS]
        label = f"({row.group}) {row.name.split(' ', 1)[1]}" if row.group else "base"
        if shape["positions"] != base_shape["positions"]:
            label += " (learned, not sinusoidal)"
        ppl = [r["dev_ppl"] for r in rs]
        bleu = [r[metric] for r in rs]
        steps = sorted({r["steps"] for r in rs})
        params = rs[0]["params"] / 1e6
        paper = PAPER[row.name]
        ours_dir = paper_dir = ""
        if row.name != "base":
            ours_dir = (
                f"{direction(ppl, base_ppl, True)} / {direction(bleu, base_bleu, False)}" if base_results else "no base"
            )
            paper_dir = f"{paper_direction(row.name, 'ppl')} / {paper_direction(row.name, 'bleu')}"
        lines.append(
            "| "
            + " | ".join(
                [
                    label,
                    *cells,
                    ", ".join(str(s) for s in steps),
                    f"{params:.2f}",
                    _mean_spread(ppl, 2),
                    _mean_spread(bleu, 1),
                    ", ".join(str(r["seed"]) for r in rs),
                    f"{paper['ppl']:.2f}",
                    f"{paper['bleu']:.1f}",
                    "" if paper["params"] is None else str(paper["params"]),
                    ours_dir,
                    paper_dir,
                ]
            )
            + " |"
        )
        summaries.append({"row": row, "ppl": ppl, "bleu": bleu, "params": params, "steps": steps})
    return "\n".join(lines), summaries


def write_report(out: Path) -> dict[str, Any]:
    """Write ``out/table3.md`` and ``out/plots/table3-{A..E}.png``; return their paths and the Markdown."""
    out = Path(out)
    if not (out / "sweep.json").is_file():
        raise FileNotFoundError(f"{out}/sweep.json not found: {out} is not a sweep directory (run the sweep first)")
    markdown, summaries = table(out)
    settings = json.loads((out / "sweep.json").read_text())
    text = "\n".join(
        [
            "# Table 3 in miniature",
            "",
            f"Data: {settings['data']} (dev: its {settings['valid_split']!r} split). Base d_model {settings['d_model']} "
            f"(the paper: 512), {settings['steps']} updates of up to {settings['max_tokens']} target tokens per row "
            f"(the paper: {PAPER_STEPS:,} of ~25,000), rsqrt schedule with warm-up {settings['warmup']} and the base "
            f"row peaking at lr {settings['peak_lr']}; dtype {settings['dtype']}, {settings['threads']} thread(s) "
            f"per row on {settings['device']}. Dev scores: the final model, beam {settings['beam']}, "
            f"α {settings['alpha']}, no checkpoint averaging (as the paper's Table 3). ± is half the range over "
            "seeds. Paper: Vaswani et al. (2017), Table 3, newstest2013 dev.",
            "",
            markdown,
            "",
        ]
    )
    table_path = out / "table3.md"
    table_path.write_text(text)
    plots = [plot_group(group, summaries, out / "plots" / f"table3-{group}.png") for group in GROUPS]
    return {"table": table_path, "plots": [p for p in plots if p is not None], "markdown": markdown}


def plot_group(group: str, summaries: list[dict[str, Any]], path: Path) -> Path | None:
    """Change of dev PPL and BLEU against the base for one group's rows: ours (mean, seed range, each seed)
    beside the paper's. None when the group or the base has no results."""
    from ..viz.figure import plt, save_png

    base = next((s for s in summaries if s["row"].name == "base"), None)
    members = [s for s in summaries if s["row"].group == group]
    if base is None or not members:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(max(7.0, 3.0 + 2.2 * len(members)), 3.8))
    labels = [_axis_label(s["row"]) for s in members]
    for ax, metric, paper_key, title in (
        (axes[0], "ppl", "ppl", "Δ dev perplexity (lower is better)"),
        (axes[1], "bleu", "bleu", "Δ dev BLEU (higher is better)"),
    ):
        base_mean = sum(base[metric]) / len(base[metric])
        for i, s in enumerate(members):
            first = i == 0 and metric == "ppl"  # one legend entry per series
            deltas = [v - base_mean for v in s[metric]]
            mean = sum(deltas) / len(deltas)
            ax.bar(i - 0.18, mean, width=0.36, color="tab:blue", label="this run (mean of seeds)" if first else None)
            ax.errorbar([i - 0.18] * 2, [min(deltas), max(deltas)], color="black", linewidth=1)
            ax.plot([i - 0.18] * len(deltas), deltas, "k.", markersize=4)
            paper = PAPER[s["row"].name][paper_key] - PAPER["base"][paper_key]
            ax.bar(i + 0.18, paper, width=0.36, color="tab:orange", label="the paper" if first else None)
        ax.axhline(0.0, color="grey", linewidth=0.8)
        ax.set_xticks(range(len(members)), labels, rotation=20)
        ax.set_title(title, fontsize=9)
    fig.legend(loc="lower center", ncol=2, fontsize=8, bbox_to_anchor=(0.5, -0.04))
    fig.suptitle(f"Table 3 ({group}): {GROUPS[group]}, change against the base", fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return save_png(fig, path)


def _axis_label(row) -> str:
    """The paper's label of the row and, where it names a scaled width, the value here: "d_k=16\n(here 4)"."""
    label = row.name.split(" ", 1)[1]
    key, _, value = label.partition("=")
    here = row.shape().get(key)
    return f"{label}\n(here {here})" if here is not None and str(here) != value else label
