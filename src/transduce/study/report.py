"""The study's table and plots from a sweep directory's results (``SWEEP/results/*.json``).

The table follows the paper's Table 3: N, d_model, d_ff, h, d_k, d_v, P_drop, ε_ls, train steps, params,
dev perplexity, dev BLEU, then the paper's row. A cell the row shares with the base is left blank, as in the
paper.

**Is a row different from the base?** Each row is tested against every seed of the base on the same dev
sentences with sacreBLEU's paired bootstrap (:mod:`.significance`: tok-lc BLEU, and the perplexity of the
references). A row is "better" or "worse" only when the difference has the same sign and p < 0.05 against
each base seed; otherwise "no significant difference". Testing against every base seed, not one, is what
makes the rule account for training noise as well as for the choice of sentences: the yardstick table shows
how often seeds of the same base differ "significantly" from each other under the one-seed test. The estimate
is the row's mean over its seeds minus the base's mean; the interval is the widest 95% interval of the
paired comparisons.

**The paper's column** has one run per row and no interval. One rule for both: a difference of the paper's
counts when it is larger, relative to its base, than the range of our base's seeds is relative to ours
(what training noise alone moves a row by); otherwise its single runs cannot tell it from noise.
"""

from __future__ import annotations

import json
from pathlib import Path
from statistics import fmean as mean
from typing import Any

from .significance import Paired, bleu_of, paired_bootstrap, ppl_of
from .table3 import GROUPS, PAPER, PAPER_STEPS, rows

COLUMNS = ("N", "d_model", "d_ff", "h", "d_k", "d_v", "P_drop", "eps_ls")
LEVEL = 0.05
NONE = "no significant difference"


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


def verdict(tests: list[Paired], lower_is_better: bool) -> str:
    """ "better" / "worse" when every test is significant with the same sign, else :data:`NONE`."""
    signs = {t.delta > 0 for t in tests}
    if not tests or len(signs) != 1 or any(t.p >= LEVEL or t.low <= 0 <= t.high for t in tests):
        return NONE
    return "better" if (signs.pop() is False) == lower_is_better else "worse"


def compare(row: list[dict[str, Any]], base: list[dict[str, Any]]) -> dict[str, Any]:
    """Every seed of ``row`` against every seed of ``base``: per metric, the estimate, interval and verdict."""
    out = {}
    for metric, stats, score, lower in (("ppl", "nll_stats", ppl_of, True), ("bleu", "bleu_stats", bleu_of, False)):
        tests = [paired_bootstrap(r[stats], b[stats], score) for r in row for b in base]
        values = [score_of(r, metric) for r in row]
        out[metric] = {
            "delta": mean(values) - mean([score_of(b, metric) for b in base]),
            "low": min(t.low for t in tests),
            "high": max(t.high for t in tests),
            "p": max(t.p for t in tests),
            "verdict": verdict(tests, lower),
        }
    return out


def score_of(result: dict[str, Any], metric: str) -> float:
    """The result's dev perplexity or tok-lc BLEU (the metric its statistics test)."""
    return result["dev_ppl"] if metric == "ppl" else result["dev_tok_lc_bleu"]


def yardstick(base: list[dict[str, Any]]) -> list[str]:
    """Markdown lines: each pair of base seeds under the one-seed paired test, and the seeds' ranges."""
    lines = [
        "| base seeds | Δ dev PPL [95% interval], p | Δ dev BLEU [95% interval], p |",
        "|---|---|---|",
    ]
    for i, a in enumerate(base):
        for b in base[i + 1 :]:
            ppl = paired_bootstrap(b["nll_stats"], a["nll_stats"], ppl_of)
            bleu = paired_bootstrap(b["bleu_stats"], a["bleu_stats"], bleu_of)
            lines.append(
                f"| {b['seed']} − {a['seed']} | {_cell(ppl, 2)}, p {ppl.p:.3f} | {_cell(bleu, 2)}, p {bleu.p:.3f} |"
            )
    return lines


def _cell(t: Paired, digits: int) -> str:
    return f"{t.delta:+.{digits}f} [{t.low:+.{digits}f}, {t.high:+.{digits}f}]"


def relative_range(values: list[float]) -> float:
    """The seeds' range over their mean: how far training noise alone moves a row."""
    spread = max(values) - min(values)
    return spread / abs(mean(values)) if spread else 0.0


def paper_direction(name: str, metric: str, noise: float) -> str:
    """The paper's single run against its base: a change only beyond ``noise`` (a relative range)."""
    value, base = PAPER[name][metric], PAPER["base"][metric]
    if abs(value - base) / base <= noise:
        return "within noise"
    return "better" if (value < base) == (metric == "ppl") else "worse"


def _mean_spread(values: list[float], digits: int) -> str:
    if len(values) < 2:
        return f"{mean(values):.{digits}f}"
    return f"{mean(values):.{digits}f} ± {(max(values) - min(values)) / 2:.{digits}f}"


def table(out: Path) -> tuple[str, list[dict[str, Any]]]:
    """The Markdown table and, per row with results, its summary (for plots and tests)."""
    settings = json.loads((out / "sweep.json").read_text())
    results = read_results(out)
    base = results.get("base", [])
    all_rows = rows(settings["d_model"])
    base_shape = all_rows[0].shape()
    noise = {m: relative_range([score_of(b, m) for b in base]) if base else 0.0 for m in ("ppl", "bleu")}
    head = (
        "| row | N | d_model | d_ff | h | d_k | d_v | P_drop | ε_ls | train steps | params ×10⁶ | dev PPL | "
        "dev BLEU (tok-lc) | seeds | Δ PPL [95%] | Δ BLEU [95%] | vs base: PPL / BLEU | "
        "paper: PPL | paper: BLEU | paper: params ×10⁶ | paper vs base: PPL / BLEU |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    summaries = []
    for row in all_rows:
        rs = results.get(row.name)
        if not rs:
            continue
        shape = row.shape()
        cells = [str(shape[c]) if row.name == "base" or shape[c] != base_shape[c] else "" for c in COLUMNS]
        label = {"": "base", "big": "big"}.get(row.group) or f"({row.group}) {row.name.split(' ', 1)[1]}"
        if shape["positions"] != base_shape["positions"]:
            label += " (learned, not sinusoidal)"
        ppl, bleu = [r["dev_ppl"] for r in rs], [r["dev_tok_lc_bleu"] for r in rs]
        paper = PAPER[row.name]
        test = compare(rs, base) if base and row.name != "base" else None
        ours = f"{test['ppl']['verdict']} / {test['bleu']['verdict']}" if test else ("" if base else "no base")
        theirs = (
            f"{paper_direction(row.name, 'ppl', noise['ppl'])} / {paper_direction(row.name, 'bleu', noise['bleu'])}"
            if row.name != "base"
            else ""
        )
        delta = (
            [f"{test[m]['delta']:+.2f} [{test[m]['low']:+.2f}, {test[m]['high']:+.2f}]" for m in ("ppl", "bleu")]
            if test
            else ["", ""]
        )
        lines.append(
            "| "
            + " | ".join(
                [
                    label,
                    *cells,
                    ", ".join(str(s) for s in sorted({r["steps"] for r in rs})),
                    f"{rs[0]['params'] / 1e6:.2f}",
                    _mean_spread(ppl, 2),
                    _mean_spread(bleu, 1),
                    ", ".join(str(r["seed"]) for r in rs),
                    *delta,
                    ours,
                    f"{paper['ppl']:.2f}",
                    f"{paper['bleu']:.1f}",
                    "" if paper["params"] is None else str(paper["params"]),
                    theirs,
                ]
            )
            + " |"
        )
        summaries.append(
            {"row": row, "ppl": ppl, "bleu": bleu, "test": test, "curves": [r.get("curve", []) for r in rs]}
        )
    return "\n".join(lines), summaries


def write_report(out: Path) -> dict[str, Any]:
    """Write ``out/table3.md`` and ``out/plots/table3-{group}.png`` and ``table3-curves-{group}.png``; return
    their paths and the Markdown."""
    out = Path(out)
    if not (out / "sweep.json").is_file():
        raise FileNotFoundError(f"{out}/sweep.json not found: {out} is not a sweep directory (run the sweep first)")
    markdown, summaries = table(out)
    settings = json.loads((out / "sweep.json").read_text())
    base = read_results(out).get("base", [])
    schedule = settings.get("schedule", "rsqrt")
    text = [
        "# Table 3 in miniature",
        "",
        f"Dev: the data's {settings['valid_split']!r} split. Base d_model {settings['d_model']} (the paper: 512), "
        f"{settings['steps']} updates of up to {settings['max_tokens']} target tokens per row, the big row 3× as "
        f"many (the paper: {PAPER_STEPS:,} and 300,000 of ~25,000); {settings.get('optimizer', 'adam')}, "
        f"{schedule} schedule, warm-up {settings['warmup']}, peak lr {settings['peak_lr']}, weight decay "
        f"{settings.get('weight_decay', 0.0)}; dtype {settings['dtype']}, {settings['threads']} thread(s) per row on "
        f"{settings['device']}. Dev scores: the final model, beam {settings['beam']}, α {settings['alpha']}, no "
        "checkpoint averaging (as the paper's Table 3). ± is half the range over seeds. Δ: the row's mean minus "
        f"the base's, with the widest 95% interval of its paired bootstrap tests against each base seed; a verdict "
        f"needs p < {LEVEL} against every base seed. Paper: Vaswani et al. (2017), Table 3, newstest2013; its "
        "differences count only beyond our base's relative seed range.",
        "",
        markdown,
        "",
    ]
    if len(base) > 1:
        text += ["The yardstick: the base's seeds against each other, one seed against one.", "", *yardstick(base), ""]
    table_path = out / "table3.md"
    table_path.write_text("\n".join(text))
    plots = [plot_group(group, summaries, out / "plots" / f"table3-{group}.png") for group in GROUPS]
    plots += [plot_curves(group, summaries, out / "plots" / f"table3-curves-{group}.png") for group in GROUPS]
    return {"table": table_path, "plots": [p for p in plots if p is not None], "markdown": "\n".join(text[4:])}


def plot_group(group: str, summaries: list[dict[str, Any]], path: Path) -> Path | None:
    """Change of dev PPL and BLEU against the base for one group's rows: ours (estimate and interval, each seed)
    beside the paper's. None when the group or the base has no results."""
    from ..viz.figure import plt, save_png

    base = next((s for s in summaries if s["row"].name == "base"), None)
    members = [s for s in summaries if s["row"].group == group and s["test"]]
    if base is None or not members:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(max(7.0, 3.0 + 2.2 * len(members)), 3.8))
    labels = [_axis_label(s["row"]) for s in members]
    for ax, metric, title in (
        (axes[0], "ppl", "Δ dev perplexity (lower is better)"),
        (axes[1], "bleu", "Δ dev BLEU (higher is better)"),
    ):
        for i, s in enumerate(members):
            first = i == 0 and metric == "ppl"  # one legend entry per series
            t = s["test"][metric]
            ax.bar(
                i - 0.18, t["delta"], width=0.36, color="tab:blue", label="this run (95% interval)" if first else None
            )
            ax.errorbar([i - 0.18] * 2, [t["low"], t["high"]], color="black", linewidth=1)
            paper = PAPER[s["row"].name][metric] - PAPER["base"][metric]
            ax.bar(i + 0.18, paper, width=0.36, color="tab:orange", label="the paper" if first else None)
        ax.axhline(0.0, color="grey", linewidth=0.8)
        ax.set_xticks(range(len(members)), labels, rotation=20)
        ax.set_title(title, fontsize=9)
    fig.legend(loc="lower center", ncol=2, fontsize=8, bbox_to_anchor=(0.5, -0.04))
    fig.suptitle(f"Table 3 ({group}): {GROUPS[group]}, change against the base", fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return save_png(fig, path)


def plot_curves(group: str, summaries: list[dict[str, Any]], path: Path) -> Path | None:
    """Dev perplexity against updates for the base's seeds (grey) and the group's rows: whether a difference
    is about the start of training or its end. None without curves."""
    from ..viz.figure import plt, save_png

    base = next((s for s in summaries if s["row"].name == "base"), None)
    members = [s for s in summaries if s["row"].group == group]
    if base is None or not members or not any(c for s in members for c in s["curves"]):
        return None
    fig, ax = plt.subplots(figsize=(6.5, 4.0))
    for k, curve in enumerate(base["curves"]):
        ax.plot(
            [p["step"] for p in curve], [p["dev_ppl"] for p in curve], color="grey", label="base" if k == 0 else None
        )
    for i, s in enumerate(members):
        for k, curve in enumerate(s["curves"]):
            label = s["row"].name if k == 0 else None
            ax.plot([p["step"] for p in curve], [p["dev_ppl"] for p in curve], color=f"C{i}", label=label)
    ax.set_yscale("log")
    ax.set_xlabel("updates")
    ax.set_ylabel("dev perplexity per piece")
    ax.legend(fontsize=8)
    ax.set_title(f"Table 3 ({group}): {GROUPS[group]}, learning curves", fontsize=10)
    fig.tight_layout()
    return save_png(fig, path)


def _axis_label(row) -> str:
    """The paper's label of the row and, where it names a scaled width, the value here: "d_k=16\n(here 4)"."""
    label = row.name.split(" ", 1)[1] if " " in row.name else row.name
    key, _, value = label.partition("=")
    here = row.shape().get(key)
    return f"{label}\n(here {here})" if here is not None and str(here) != value else label
