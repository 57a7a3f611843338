"""Which kernel runs each hot part of training, chosen from ``[train]``'s kernel keys and the hardware.

:func:`for_training` gives the trainer its :class:`~transduce.fastpaths.FastPaths` (attention, loss, dropout,
residual connection, Muon's dtype, allocator), each choice with its reason, logged in one line at the start of the run.
"""

from __future__ import annotations

import os
from typing import Any

from .. import allocator
from ..config import ConfigError
from ..fastpaths import Choice, FastPaths, simd_choice
from . import dropout as dropout_
from . import native, native_loss


def allocator_choice() -> Choice:
    """Which allocator this process runs (the training commands re-execute themselves with jemalloc first,
    allocator.py; ``TRANSDUCE_JEMALLOC`` is read there because the choice precedes the process)."""
    if allocator.loaded():
        return Choice("jemalloc", f"preloaded, {allocator.options()}")
    return Choice("malloc", allocator.describe().partition("(")[2].rstrip(")"))


def _native_kernel(key: str, asked: str, device, extension, what: str) -> Choice:
    """ "native" or "tensor" for a C++ training kernel: ``asked`` is the config's "auto", "native" or "tensor"."""
    if asked == "tensor":
        return Choice("tensor", f"train.{key} = 'tensor'")
    if device.type != "cpu":
        if asked == "native":
            raise ConfigError(f"key '{key}': 'native' is a CPU kernel; the run is on {device}")
        return Choice("tensor", f"the C++ {what} is for CPU training")
    if extension() is None:
        if asked == "native":
            raise ConfigError(f"key '{key}': the C++ {what} could not be built (see the warning above)")
        return Choice("tensor", f"the C++ {what} could not be built (see the warning above)")
    return Choice(
        "native", f"C++ {what} on CPU" + ("" if asked == "native" else f"; train.{key} = 'tensor' for the tensor ops")
    )


def attention_choice(name: str, device) -> Choice:
    """Training's attention kernel for ``train.attention_kernel`` = ``name`` on ``device``: "auto" is "written" on
    CPU (the formula with fp32 scores, which beats SDPA at short lengths) and PyTorch's SDPA choice elsewhere.
    "native" (the C++ kernel over the packed projections, :mod:`transduce.train.attention`) is asked for by name:
    whole updates ran at the written formula's speed (0.97-1.02x at small, medium and paper-base on an Intel Xeon
    with AMX, 2026-12-06) with 330-440 MB less peak memory at medium and paper-base (docs/performance.md)."""
    if name == "native" and device.type != "cpu":
        raise ConfigError(f"key 'attention_kernel': 'native' is a CPU kernel; the run is on {device}")
    if name == "native" and native.extension() is None:
        raise ConfigError("key 'attention_kernel': the C++ attention could not be built (see the warning above)")
    if name != "auto":
        return Choice(name, f"train.attention_kernel = '{name}'")
    if device.type != "cpu":
        return Choice("default", f"auto on {device.type}: PyTorch's SDPA choice")
    return Choice("written", "auto on CPU: the formula with fp32 scores beats SDPA at short lengths")


def muon_choice(name: str, dtype: str) -> Choice:
    """The dtype of Muon's Newton-Schulz iterations for ``train.muon_dtype`` = ``name`` in a run of ``dtype``
    (resolved: "fp32", "bf16" or "fp16"). "auto": bf16 in a bf16 run, where the device computes it natively
    (on one core of an Intel Xeon with AMX 22 against 36 ms per ``small`` update, bench/optimizer_step.py),
    and fp32 otherwise: a CPU that trains in fp32 may emulate bf16, and fp16's range is too narrow for it."""
    if name != "auto":
        return Choice(name, f"train.muon_dtype = '{name}'")
    if dtype == "bf16":
        return Choice("bf16", "auto in a bf16 run: the Newton-Schulz iterations in bf16, as torch's Muon")
    return Choice("fp32", f"auto in a {dtype} run")


def onednn_cache_choice(device, dtype: str) -> Choice | None:
    """How many primitives oneDNN keeps built, in a run whose matmuls it makes (bf16 on CPU); None elsewhere.
    ``transduce train``, ``recipe`` and ``demo`` set ONEDNN_PRIMITIVE_CACHE_CAPACITY before torch starts
    (``transduce.cli.ONEDNN_CACHE``, where the measurement is), unless the environment names one."""
    if device.type != "cpu" or dtype != "bf16":
        return None
    value = os.environ.get("ONEDNN_PRIMITIVE_CACHE_CAPACITY")
    if value is None:
        return Choice("1024", "oneDNN's default; the transduce command sets more: a new shape is a new build")
    return Choice(value, "ONEDNN_PRIMITIVE_CACHE_CAPACITY: one built matmul per shape, kept")


def residual_choice(asked: str, dropout: Choice) -> Choice:
    """The post-norm sub-layer connection's kernel for ``train.residual_kernel`` = ``asked``: "native" (one C++
    pass each way, :mod:`transduce.train.residual`) where the run's dropout is the C++ one, whose mask it draws,
    else "tensor" (the modules)."""
    if asked == "tensor":
        return Choice("tensor", "train.residual_kernel = 'tensor'")
    if dropout.name != "native":
        if asked == "native":
            raise ConfigError(f"key 'residual_kernel': 'native' needs the C++ dropout; the run's is {dropout}")
        return Choice("tensor", f"the dropout is {dropout.name}, not the C++ one")
    why = "C++ LayerNorm(x + Dropout(y)) on CPU"
    return Choice("native", why + ("" if asked == "native" else "; train.residual_kernel = 'tensor' for the modules"))


def for_training(cfg: Any, device) -> FastPaths:
    """The kernels a training run uses, from ``cfg``'s ``attention_kernel``, ``loss_kernel``,
    ``dropout_kernel``, ``residual_kernel``, ``fast_dropout``, ``optimizer``, ``muon_dtype`` and ``dtype`` (resolved) and the
    device."""
    attention = attention_choice(cfg.attention_kernel, device)
    loss = _native_kernel("loss_kernel", cfg.loss_kernel, device, native_loss.extension, "loss")
    if not cfg.fast_dropout:
        drop = Choice("torch", "train.fast_dropout = false")
    elif device.type != "cpu":
        drop = Choice("torch", f"FastDropout uses F.dropout on {device.type}")
    else:
        drop = _native_kernel("dropout_kernel", cfg.dropout_kernel, device, dropout_.extension, "dropout")
    residual = residual_choice(cfg.residual_kernel, drop)
    simd = simd_choice() if "native" in (loss.name, drop.name) else None
    muon = muon_choice(cfg.muon_dtype, cfg.dtype) if cfg.optimizer == "muon" else None
    return FastPaths(
        attention=attention,
        loss=loss,
        dropout=drop,
        residual=residual,
        muon=muon,
        allocator=allocator_choice(),
        simd=simd,
        onednn_cache=onednn_cache_choice(device, cfg.dtype),
    )
