"""Which implementation runs each hot part, chosen in one place from the config and the hardware.

A :class:`FastPaths` is built once at the start of a command: by the trainer from ``[train]``'s kernel keys
(:func:`for_training`), and by ``transduce.load`` (so ``translate``, ``evaluate`` and ``serve``) from the
requested backend and the model directory's accuracy record (:func:`decoder_backend`). It is frozen, each
choice carries the reason for it, and :meth:`FastPaths.line` is the one log line that says what runs.
Nothing here is module-level state: the model and loss read the choice they are given.

Decoding backends (``--backend``, ``transduce.load(..., backend=...)``):

==============  ==============================================================  ==============================
backend         what runs                                                       guarantee
==============  ==============================================================  ==============================
``fp32``        the Python step (``Transformer.decode_step``), fp32              the reference; batch-invariant
``fp32-native`` the same arithmetic, each step one C++ call                      bit-identical to ``fp32``
``bf16``        the Python step in bfloat16                                     batch-invariant
``bf16-native`` as ``bf16``, each step one C++ call                              bit-identical to ``bf16``
``fp16``        the Python step in float16, on CUDA only                        approximates fp32
``int8``        torch's dynamic quantisation of every ``nn.Linear``             depends on the batch
``int8-native`` C++ int8 GEMMs for encoder, step and candidate selection        batch-invariant; BLEU checked
==============  ==============================================================  ==============================

``auto`` (the default) picks ``int8-native`` on a CPU when the model directory's ``backends.json`` records
that it scored within :data:`TOLERANCE` BLEU of ``fp32`` on the model's own validation set (written by
``transduce recipe`` and ``transduce check-backends``), and ``fp32`` otherwise, saying why.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from .config import ConfigError

BACKENDS = ("fp32", "fp32-native", "bf16", "bf16-native", "fp16", "int8", "int8-native")
TOLERANCE = 0.3  # BLEU: how far below fp32 an approximate backend may score and still be chosen by default
FASTEST = "int8-native"  # the fastest CPU backend (docs/performance.md), the one auto may pick
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
    or "malloc"; decoder: one of :data:`BACKENDS`.
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


# ----------------------------------------------------------------------------- decoding
def requested_backend(backend: str = "auto", dtype: str | None = None, native: bool | None = None) -> str:
    """The backend asked for: ``backend``, or the one ``dtype`` and ``native`` name (``--dtype``, ``--native``)."""
    if backend != "auto" and backend not in BACKENDS:
        raise ValueError(f"backend must be 'auto' or one of {', '.join(BACKENDS)}, got {backend!r}")
    if dtype is None and not native:
        return backend
    if backend != "auto":
        raise ValueError(f"give either backend ({backend!r}) or dtype/native, not both")
    name = f"{dtype or 'fp32'}{'-native' if native else ''}"
    if name not in BACKENDS:
        raise ValueError(
            f"dtype must be one of fp32, bf16, fp16, int8, got {dtype!r}"
            if dtype not in ("fp32", "bf16", "fp16", "int8")
            else f"dtype {dtype} has no C++ step (no {name} backend)"
        )
    return name


def decoder_backend(model, model_dir: str | Path, device, backend: str = "auto", ensemble: bool = False) -> Choice:
    """The decoding backend for ``model`` (loaded from ``model_dir``) on ``device``: ``backend`` when one is
    named, else the fastest whose accuracy the directory's record vouches for (module docstring)."""
    if backend != "auto":
        return Choice(backend, "asked for")
    if device.type != "cpu":
        return Choice("fp32", f"auto on {device.type}: the C++ step is for CPUs")
    if ensemble:
        return Choice("fp32", "auto with an ensemble: backends.json vouches for one model")
    from .backends import native
    from .check_backends import read_record

    record, why = read_record(model_dir)
    if record is None:
        return Choice("fp32", f"auto: {why}; exact fp32 until then")
    delta = record["delta"]
    if delta < -TOLERANCE:
        return Choice(
            "fp32", f"auto: {FASTEST} scored {-delta:.2f} BLEU below fp32 in backends.json, more than {TOLERANCE}"
        )
    if (unsupported := native.supports(model)) is not None:
        return Choice("fp32", f"auto: the C++ step does not cover this model ({unsupported})")
    if native.extension() is None:
        return Choice("fp32", "auto: the C++ step could not be built (see the warning above)")
    return Choice(
        FASTEST,
        f"auto: {delta:+.2f} BLEU against fp32 on {record['sentences']} sentences of "
        f"{record['data']} (backends.json; --backend fp32 for exact fp32)",
    )


def decoder_for(model, choice: Choice, device) -> tuple[Any, Choice]:
    """``model`` (fp32, eval mode) ready to decode with ``choice``'s backend, and the choice that runs: a
    native backend that cannot run falls back to the Python step of its dtype, the reason in the choice."""
    from .decode.translator import for_decoding

    dtype, _, how = choice.name.partition("-")
    if not how:
        return for_decoding(model, dtype, device), choice
    from .backends import native

    int8 = dtype == "int8"
    if int8 and device.type != "cpu":
        raise ValueError(f"backend {choice.name!r} runs on the CPU only, not on {device}")
    base = model if int8 else for_decoding(model, dtype, device)  # the int8 step quantises the fp32 model itself
    why = native.supports(base)
    fast = native.native_step(base, int8=int8) if why is None else None
    if fast is None:
        why = why or "the C++ step could not be built"
        warnings.warn(
            f"backend {choice.name} not used ({why}); decoding with the Python step", RuntimeWarning, stacklevel=3
        )
        return for_decoding(model, dtype, device), Choice(dtype, f"{choice.name} asked for, not available: {why}")
    return fast, choice
