"""The rows of the paper's Table 3 ("Variations on the Transformer architecture"), scaled down, and the paper's
published figures beside them.

Every row changes one thing against the base model, as in the paper. Widths scale with ``base_d_model`` by
the paper's ratios (factor f = base_d_model / 512): d_ff = 4·d_model, d_k = d_v = d_model / h, row B's d_k of
16 and 32 become 16·f and 32·f, row C's d_model of 256 and 1024 become d_model / 2 and 2·d_model and its d_ff
of 1024 and 4096 become 2·d_model and 8·d_model. Layer counts, head counts, dropout and label smoothing are
the paper's own values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Vaswani et al. (2017), "Attention Is All You Need", Table 3: English-to-German, newstest2013 dev set,
# per-wordpiece perplexity and BLEU, beam search without checkpoint averaging. params: millions.
# Keys: the rows' names below. The base and every variation were trained for 100K steps.
PAPER: dict[str, dict[str, float | None]] = {
    "base": {"ppl": 4.92, "bleu": 25.8, "params": 65},
    "A h=1": {"ppl": 5.29, "bleu": 24.9, "params": None},
    "A h=4": {"ppl": 5.00, "bleu": 25.5, "params": None},
    "A h=16": {"ppl": 4.91, "bleu": 25.8, "params": None},
    "A h=32": {"ppl": 5.01, "bleu": 25.4, "params": None},
    "B d_k=16": {"ppl": 5.16, "bleu": 25.1, "params": 58},
    "B d_k=32": {"ppl": 5.01, "bleu": 25.4, "params": 60},
    "C N=2": {"ppl": 6.11, "bleu": 23.7, "params": 36},
    "C N=4": {"ppl": 5.19, "bleu": 25.3, "params": 50},
    "C N=8": {"ppl": 4.88, "bleu": 25.5, "params": 80},
    "C d_model=256": {"ppl": 5.75, "bleu": 24.5, "params": 28},
    "C d_model=1024": {"ppl": 4.66, "bleu": 26.0, "params": 168},
    "C d_ff=1024": {"ppl": 5.12, "bleu": 25.4, "params": 53},
    "C d_ff=4096": {"ppl": 4.75, "bleu": 26.2, "params": 90},
    "D P_drop=0.0": {"ppl": 5.77, "bleu": 24.6, "params": None},
    "D P_drop=0.2": {"ppl": 4.95, "bleu": 25.5, "params": None},
    "D eps_ls=0.0": {"ppl": 4.67, "bleu": 25.3, "params": None},
    "D eps_ls=0.2": {"ppl": 5.47, "bleu": 25.7, "params": None},
    "E learned positions": {"ppl": 4.92, "bleu": 25.7, "params": None},
    "big": {"ppl": 4.33, "bleu": 26.4, "params": 213},
}
PAPER_STEPS = 100_000  # the big model: 300,000 (Row.steps_scale 3)
GROUPS = {
    "A": "heads at constant computation",
    "B": "smaller d_k",
    "C": "model size",
    "D": "dropout and label smoothing",
    "E": "learned positions",
    "big": "the big model",
}


@dataclass(frozen=True)
class Row:
    """One line of the table: its name (a key of :data:`PAPER`), group ("" for the base), model keys, and
    its updates as a multiple of the base's (the paper trained the big model 3× longer)."""

    name: str
    group: str
    model: dict[str, Any] = field(default_factory=dict)
    steps_scale: int = 1

    @property
    def slug(self) -> str:
        """The row's directory name in a sweep: ``A-h-16``, ``C-d_model-256``, ``E-learned-positions``."""
        return self.name.replace("=", "-").replace(" ", "-").replace(".", "p")

    def cost(self, vocab: int = 8000) -> float:
        """Multiply-adds per target token of training, times the row's updates: the order the sweep starts
        rows in (longest first, so the last row to finish is a short one)."""
        m = self.model
        d, ff = m["d_model"], m["d_ff"]
        inner = (m.get("d_k") or d // m["n_heads"]) * m["n_heads"]  # query/key width
        encoder = m["encoder_layers"] * (2 * d * inner + 2 * d * d + 2 * d * ff)
        decoder = m["decoder_layers"] * (4 * d * inner + 4 * d * d + 2 * d * ff)
        return (encoder + decoder + d * vocab) * self.steps_scale

    def shape(self) -> dict[str, Any]:
        """The table's columns for this row: N, d_model, d_ff, h, d_k, d_v, P_drop, eps_ls, positions."""
        m = self.model
        h = m["n_heads"]
        d_v = m["d_model"] // h
        return {
            "N": m["encoder_layers"],
            "d_model": m["d_model"],
            "d_ff": m["d_ff"],
            "h": h,
            "d_k": m.get("d_k") or d_v,
            "d_v": d_v,
            "P_drop": m["dropout"],
            "eps_ls": m["label_smoothing"],
            "positions": m["positions"],
        }


def check_base(base_d_model: int) -> None:
    """The scaled rows need whole head widths down to d_model / 32 (row A's 32 heads, row B's d_k of 16) and
    for row C's d_model / 2 with 8 heads: a multiple of 32, at least 64."""
    if base_d_model < 64 or base_d_model % 32:
        raise ValueError(f"--d-model: the base width must be a multiple of 32 (at least 64), got {base_d_model}")


def rows(base_d_model: int = 128) -> list[Row]:
    """The base, the 18 variations and the big model of Table 3 at base width ``base_d_model`` (the paper: 512)."""
    check_base(base_d_model)
    d = base_d_model
    base = dict(
        encoder_layers=6,
        decoder_layers=6,
        d_model=d,
        d_ff=4 * d,
        n_heads=8,
        d_k=None,
        dropout=0.1,
        label_smoothing=0.1,
        positions="sinusoidal",
    )

    def row(name: str, steps_scale: int = 1, **change: Any) -> Row:
        group = {"base": "", "big": "big"}.get(name, name.split(" ")[0])
        return Row(name, group, {**base, **change}, steps_scale)

    return [
        row("base"),
        *(row(f"A h={h}", n_heads=h) for h in (1, 4, 16, 32)),
        row("B d_k=16", d_k=d // 32),  # the paper's 16 and 32 of d_k = 64 at d_model 512
        row("B d_k=32", d_k=d // 16),
        *(row(f"C N={n}", encoder_layers=n, decoder_layers=n) for n in (2, 4, 8)),
        row("C d_model=256", d_model=d // 2, d_ff=4 * d),  # d_k = d_v = (d/2)/8, d_ff kept at the base's
        row("C d_model=1024", d_model=2 * d, d_ff=4 * d),
        row("C d_ff=1024", d_ff=2 * d),
        row("C d_ff=4096", d_ff=8 * d),
        row("D P_drop=0.0", dropout=0.0),
        row("D P_drop=0.2", dropout=0.2),
        row("D eps_ls=0.0", label_smoothing=0.0),
        row("D eps_ls=0.2", label_smoothing=0.2),
        row("E learned positions", positions="learned"),
        row("big", 3, d_model=2 * d, d_ff=8 * d, n_heads=16, dropout=0.3),  # 1024, 4096, 16 heads at d 512
    ]


def select(all_rows: list[Row], names: list[str] | None) -> list[Row]:
    """The rows named (by name or directory name), in the table's order; every name must exist."""
    if not names:
        return all_rows
    known = {r.name: r for r in all_rows} | {r.slug: r for r in all_rows}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(
            f"--rows: unknown row(s) {', '.join(unknown)}; rows are: {', '.join(r.slug for r in all_rows)}"
        )
    wanted = {known[n].name for n in names}
    return [r for r in all_rows if r.name in wanted]
