"""The backend choice: ``auto``, the backend a job may run, and a model's decoder for a backend.

``transduce.load`` (so ``translate``, ``evaluate``, ``serve``) asks :func:`decoder_backend` which backend to
run and :func:`decoder_for` for each model's decoder; the choice, with its reason, is the ``decoder`` part of
the :class:`~transduce.fastpaths.FastPaths` log line.

``auto`` picks :data:`FASTEST` (``int8-native``) on a CPU when the model directory's ``backends.json``
(:mod:`~transduce.backends.record`) records that it scored within :data:`TOLERANCE` BLEU of ``fp32`` on the
model's own validation set and that it decoded faster on this machine than what ``auto`` runs otherwise
(``fp32-native``; ``fp32`` in records that did not time it), the C++ step covers the model and builds here.
Otherwise it keeps fp32 arithmetic, saying why (a speed measured on another CPU does not count):
``fp32-native`` (the C++ loop step: fp32 within rounding of the Python step, 2-16x its speed in
docs/performance.md) where the C++ step covers the model and builds, the Python step ``fp32`` where it does
not, on a GPU and for ensembles.
Jobs that read one PyTorch model's attention or steps (word alignments, HTML tag placement, constrained
search on the command line) run ``fp32`` under ``auto`` (:func:`for_python_model`).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from ..fastpaths import Choice
from . import AUTO, dtype_of, is_native
from . import native as native_
from .precision import for_decoding
from .record import machine, read_record, speed_here

TOLERANCE = 0.3  # BLEU: how far below fp32 an approximate backend may score and still be chosen by default
FASTEST = "int8-native"  # the fastest CPU backend (docs/performance.md), the one auto may pick


def decoder_backend(model, model_dir: str | Path, device, backend: str = AUTO, ensemble: bool = False) -> Choice:
    """The decoding backend for ``model`` (loaded from ``model_dir``) on ``device``: ``backend`` when one is
    named, else the fastest whose accuracy the directory's record vouches for (module docstring)."""
    if backend != AUTO:
        return Choice(backend, "asked for")
    if device.type != "cpu":
        return Choice("fp32", f"auto on {device.type}: the C++ step is for CPUs")
    if ensemble:
        return Choice("fp32", "auto with an ensemble: backends.json vouches for one model")
    if (unsupported := native_.supports(model)) is not None:
        return Choice("fp32", f"auto: the C++ step does not cover this model ({unsupported})")
    if native_.extension() is None:
        return Choice("fp32", "auto: the C++ step could not be built (see the warning above)")
    record, why = read_record(model_dir)
    if record is None:
        return _fp32_native(f"auto: {why}")
    delta = record["delta"]
    if delta < -TOLERANCE:
        return _fp32_native(
            f"auto: {FASTEST} scored {-delta:.2f} BLEU below fp32 in backends.json, more than {TOLERANCE}"
        )
    speed = speed_here(record)
    base = baseline(speed or {})
    if speed is None or FASTEST not in speed or base not in speed:
        return _fp32_native(
            f"auto: {FASTEST}'s speed is not measured on this machine ({machine()}); "
            f"`transduce check-backends {model_dir} --src FILE --speed-only` measures it"
        )
    ratio = speed[FASTEST] / max(speed[base], 1e-9)
    if ratio <= 1.0:
        return _fp32_native(f"auto: {FASTEST} measured {ratio:.2f}x {base}'s speed on this machine, not faster")
    return Choice(
        FASTEST,
        f"auto: {delta:+.2f} BLEU against fp32 on {record['sentences']} sentences of {record['data']}, "
        f"{ratio:.1f}x {base}'s speed on this machine (backends.json; --backend fp32 for exact fp32)",
    )


def baseline(speed: dict[str, float]) -> str:
    """The backend :data:`FASTEST` must beat in a record's speeds: ``fp32-native``, what ``auto`` runs
    otherwise; ``fp32`` in records made before fp32-native was timed."""
    return "fp32-native" if "fp32-native" in speed else "fp32"


def _fp32_native(why: str) -> Choice:
    """``auto``'s fp32 on a CPU where the C++ step covers the model and builds: the loop step, fp32 in C++."""
    return Choice("fp32-native", f"{why}; fp32 in C++ (--backend fp32: the Python step, bit for bit)")


def decoder_for(model, choice: Choice, device) -> tuple[Any, Choice]:
    """``model`` (fp32, eval mode) ready to decode with ``choice``'s backend, and the choice that runs: a
    native backend that cannot run falls back to the Python step of its dtype, the reason in the choice."""
    dtype = dtype_of(choice.name)
    if not is_native(choice.name):
        return for_decoding(model, dtype, device), choice
    int8 = dtype == "int8"
    if int8 and device.type != "cpu":
        raise ValueError(f"backend {choice.name!r} runs on the CPU only, not on {device}")
    base = model if int8 else for_decoding(model, dtype, device)  # the int8 step quantises the fp32 model itself
    why = native_.supports(base)
    fast = native_.native_step(base, "int8" if int8 else None) if why is None else None
    if fast is None:
        why = why or "the C++ step could not be built"
        warnings.warn(
            f"backend {choice.name} not used ({why}); decoding with the Python step", RuntimeWarning, stacklevel=3
        )
        return for_decoding(model, dtype, device), Choice(dtype, f"{choice.name} asked for, not available: {why}")
    return fast, choice


def channel_for(model, ran: Choice, device):
    """The channel model of noisy-channel reranking in the precision of the backend that runs (``ran``): it
    scores teacher-forced with the Python step; int8 backends rerank with the fp32 channel."""
    dtype = dtype_of(ran.name)
    return for_decoding(model, "fp32" if dtype == "int8" else dtype, device)


def for_python_model(asked: str) -> str:
    """The backend for a command-line job that reads one PyTorch model's attention or steps (word alignments,
    HTML tag placement, constrained search): ``auto`` is ``fp32``; a named backend stays as asked."""
    return "fp32" if asked == AUTO else asked
