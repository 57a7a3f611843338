"""The decoding-backend options shared by ``translate``, ``evaluate`` and ``serve``.

Their own module so the command lines can import them without importing torch.
"""

from __future__ import annotations

import argparse

BACKEND_CHOICES = (
    "auto",
    "fp32",
    "fp32-native",
    "bf16",
    "bf16-native",
    "fp16",
    "int8",
    "int8-native",
)  # fastpaths.BACKENDS


def add_backend_arguments(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    p.add_argument(
        "--backend",
        choices=BACKEND_CHOICES,
        default="auto",
        help="decoding arithmetic (docs/performance.md); auto: int8-native where the model's "
        "backends.json shows it within 0.3 BLEU of fp32, else fp32; the choice is logged",
    )
    p.add_argument("--exact", action="store_true", help="exact fp32 (the Python reference step): --backend fp32")
    p.add_argument(
        "--dtype",
        choices=("fp32", "bf16", "fp16", "int8"),
        default=None,
        help="name the backend by dtype (fp16: CUDA only; with --native: the C++ step); "
        "--dtype int8 --native = --backend int8-native",
    )
    p.add_argument(
        "--native", action="store_true", default=None, help="with --dtype: run decoding in C++ (built on first use)"
    )


def backend_from_args(args: argparse.Namespace) -> str:
    """The backend the options name ("auto" when none does); conflicting options are an error."""
    from ..fastpaths import requested_backend

    backend = args.backend
    if args.exact:
        if backend not in ("auto", "fp32") or args.dtype not in (None, "fp32") or args.native:
            raise ValueError("--exact is --backend fp32: it goes with no other backend, --dtype or --native")
        return "fp32"
    return requested_backend(backend, args.dtype, args.native)
