"""``transduce info``: print a model config and its parameter counts."""

from __future__ import annotations

import argparse

from .config import parse_override
from .model import PRESETS, ModelConfig, Transformer


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "preset",
        nargs="?",
        default="paper-base",
        help=f"a preset ({', '.join(PRESETS)}) or a TOML file with a [model] table",
    )
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a model key")


def run(args: argparse.Namespace) -> int:
    overrides = dict(parse_override(s) for s in args.set)
    if args.preset in PRESETS:
        cfg = ModelConfig.preset(args.preset, **overrides)
    else:
        cfg = ModelConfig.from_dict({**ModelConfig.from_toml(args.preset).to_dict(), **overrides})
    model = Transformer(cfg)
    embeddings = sum(p.numel() for n, p in model.named_parameters() if "token" in n)
    print(cfg.to_toml())
    print(
        f"# parameters: {model.num_parameters():,} ({model.num_parameters() / 1e6:.1f}M), "
        f"of which embeddings {embeddings:,}"
    )
    return 0
