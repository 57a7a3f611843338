"""Shared figure plumbing for transduce.viz: the Agg backend (no display), saving, argument parsing."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)

__all__ = ["plt", "save_png", "parse_ints", "png_path"]


def png_path(path: str | Path) -> Path:
    """Check that ``path`` names a .png file; create its parent directory."""
    path = Path(path)
    if path.suffix.lower() != ".png":
        raise ValueError(f"{path}: the figure is written as PNG, so --out must end in .png")
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def save_png(fig, path: str | Path, dpi: int = 130) -> Path:
    """Write ``fig`` to ``path`` (PNG) and close it."""
    path = png_path(path)
    fig.savefig(path, dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return path


def parse_ints(text: str, option: str) -> list[int]:
    """``"16,32,64"`` -> [16, 32, 64]; a clear error naming ``option`` otherwise."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"{option}: expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise ValueError(f"{option}: expected positive integers, got {text!r}")
    return values
