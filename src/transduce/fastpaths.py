"""Which implementation runs each hot part, chosen in one place from the config and the hardware.

A :class:`FastPaths` is built once at the start of a command: by the trainer from ``[train]``'s kernel keys
(:func:`for_training`), and by ``transduce.load`` (so ``translate``, ``evaluate`` and ``serve``) from the
decoding backend that :mod:`transduce.backends.policy` chose. It is frozen, each choice carries the reason
for it, and :meth:`FastPaths.line` is the one log line that says what runs. Nothing here is module-level
state: the model and loss read the choice they are given.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields
from typing import Any

from .config import ConfigError

log = logging.getLogger("transduce")


@dataclass(frozen=True)
class Choice:
    """One choice: the implementation's ``name`` and ``why`` it was chosen."""

    name: str
    why: str

    def __str__(self) -> str:
        return f"{self.name} ({self.why})"


@dataclass(frozen=True)
class FastPaths:
    """The implementations a command runs; a part it does not use is None.

    attention: training's full-sequence attention ("written" = the formula with fp32 scores, or an SDPA
    kernel: "default", "math", "flash", "efficient"); loss: "native" (C++ block kernel) or "tensor";
    dropout: "native", "tensor" (FastDropout's tensor ops) or "torch" (``nn.Dropout``); allocator: "jemalloc"
    or "malloc"; decoder: one of :data:`transduce.backends.BACKENDS`.
    """

    attention: Choice | None = None
    loss: Choice | None = None
    dropout: Choice | None = None
    allocator: Choice | None = None
    decoder: Choice | None = None

    def line(self) -> str:
        """The one log line: ``fast paths: part=name (why); ...``."""
        return "fast paths: " + "; ".join(
            f"{f.name}={getattr(self, f.name)}" for f in fields(self) if getattr(self, f.name) is not None
        )


# ----------------------------------------------------------------------------- training
def allocator_choice() -> Choice:
    """Which allocator this process runs (the training commands re-execute themselves with jemalloc first,
    allocator.py; ``TRANSDUCE_JEMALLOC`` is read there because the choice precedes the process)."""
    from . import allocator

    if allocator.loaded():
        return Choice("jemalloc", "preloaded")
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
    """Training's attention kernel for ``train.attention_kernel`` = ``name`` on ``device``."""
    if name != "auto":
        return Choice(name, f"train.attention_kernel = '{name}'")
    if device.type == "cpu":
        return Choice("written", "auto on CPU: the formula with fp32 scores beats SDPA at short lengths")
    return Choice("default", f"auto on {device.type}: PyTorch's SDPA choice")


def for_training(cfg: Any, device) -> FastPaths:
    """The kernels a training run uses, from ``cfg``'s ``attention_kernel``, ``loss_kernel``,
    ``dropout_kernel`` and ``fast_dropout`` and the device."""
    from .train import dropout as dropout_
    from .train import native_loss

    attention = attention_choice(cfg.attention_kernel, device)
    loss = _native_kernel("loss_kernel", cfg.loss_kernel, device, native_loss.extension, "loss")
    if not cfg.fast_dropout:
        drop = Choice("torch", "train.fast_dropout = false")
    elif device.type != "cpu":
        drop = Choice("torch", f"FastDropout uses F.dropout on {device.type}")
    else:
        drop = _native_kernel("dropout_kernel", cfg.dropout_kernel, device, dropout_.extension, "dropout")
    return FastPaths(attention=attention, loss=loss, dropout=drop, allocator=allocator_choice())
