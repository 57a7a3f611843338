"""The decoding-backend options shared by ``translate``, ``evaluate`` and ``serve``.

Their own module, importing the names only (:mod:`transduce.backends`), so the command lines read them
without importing torch.
"""

from __future__ import annotations

import argparse

from . import AUTO, CHOICES, DTYPES, requested_backend


def add_backend_arguments(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    p.add_argument(
        "--backend",
        choices=CHOICES,
        default=AUTO,
        help="decoding arithmetic (docs/performance.md); auto: int8-native where the model's "
        "backends.json shows it within 0.3 BLEU of fp32, else fp32 arithmetic (fp32-native on a CPU, fp32 "
        "elsewhere); the choice is logged",
    )
    p.add_argument("--exact", action="store_true", help="exact fp32 (the Python reference step): --backend fp32")
    p.add_argument(
        "--dtype",
        choices=DTYPES,
        default=None,
        help="name the backend by dtype (fp16: CUDA only; with --native: the C++ step); "
        "--dtype int8 --native = --backend int8-native",
    )
    p.add_argument(
        "--native", action="store_true", default=None, help="with --dtype: run decoding in C++ (built on first use)"
    )


def backend_from_args(args: argparse.Namespace) -> str:
    """The backend the options name ("auto" when none does); conflicting options are an error."""
    backend = args.backend
    if args.exact:
        if backend not in (AUTO, "fp32") or args.dtype not in (None, "fp32") or args.native:
            raise ValueError("--exact is --backend fp32: it goes with no other backend, --dtype or --native")
        return "fp32"
    return requested_backend(backend, args.dtype, args.native)
