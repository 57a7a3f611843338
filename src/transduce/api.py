"""The Python entry point: ``transduce.load(model_dir)`` returns a ready :class:`Translator`."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from .decode.ensemble import Ensemble
from .decode.translator import DTYPES, Translator, for_decoding
from .modeldir import load_model_dir


def load(
    model_dir: str | Path,
    device: str | torch.device = "cpu",
    dtype: str = "fp32",
    ensemble: list[str | Path] | tuple = (),
    native: bool = False,
    channel: str | Path | None = None,
) -> Translator:
    """Load a model directory (plus optional ``ensemble`` members) for translation.

    ``dtype`` is ``"fp32"``, ``"bf16"`` (weights and activations; scores are computed in fp32) or
    ``"int8"`` (CPU: dynamically quantised linear layers).
    Ensemble members must have the same vocabularies as the first model.
    ``native`` runs each decoder step as one C++ call (:mod:`transduce.decode.native`; less per-step
    overhead, built on first use; fp32 and bf16 give the same outputs as without it; int8 also runs the
    encoder and beam search's candidate selection in C++, in int8 kernels whose output does not depend
    on the batch); where it cannot, a warning says why.
    ``channel`` is a target→source model directory with the same vocabulary, for noisy-channel reranking
    (:mod:`transduce.decode.rerank`; ``translate(..., rerank=RerankConfig(...))``).

    >>> translator = load("runs/multi30k/model")            # doctest: +SKIP
    >>> translator.translate(["A dog runs."], beam=4)        # doctest: +SKIP
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    model, vocabs, meta = load_model_dir(model_dir, device)
    models = [model]
    for other in ensemble:
        m, v, _ = load_model_dir(other, device)
        if v.src.proto != vocabs.src.proto or v.tgt.proto != vocabs.tgt.proto:
            raise ValueError(f"{other}: ensemble member has a different vocabulary from {model_dir}")
        models.append(m)
    if native:
        models = [_native(m.eval(), dtype, torch.device(device)) for m in models]
    else:
        models = [for_decoding(m.eval(), dtype, torch.device(device)) for m in models]
    decoder = models[0] if len(models) == 1 else Ensemble(models)
    reverse = None
    if channel is not None:
        reverse, v, _ = load_model_dir(channel, device)
        if v.src.proto != vocabs.tgt.proto or v.tgt.proto != vocabs.src.proto:
            raise ValueError(f"{channel}: the channel model's vocabularies are not {model_dir}'s, reversed")
        reverse = for_decoding(reverse, "fp32" if dtype == "int8" else dtype, torch.device(device))
    return Translator(decoder, vocabs, device, meta, channel=reverse)


def _native(model, dtype: str, device: torch.device):
    """``model`` in ``dtype`` with the C++ decoder step, or without it and a warning saying why not.

    int8: the C++ step quantises the fp32 model itself (``int8_gemm.h``); the fallback is ``for_decoding``'s.
    """
    from .decode import native

    int8 = dtype == "int8" and device.type == "cpu"
    if not int8:
        model = for_decoding(model, dtype, device)
    why = native.supports(model)
    fast = native.native_step(model, int8=int8) if why is None else None
    if fast is None:
        warnings.warn(
            f"native decoder step not used ({why or 'the extension could not be built'}); "
            "decoding with the Python step",
            RuntimeWarning,
            stacklevel=3,
        )
        return for_decoding(model, dtype, device) if int8 else model
    return fast
