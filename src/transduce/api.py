"""The Python entry point: ``transduce.load(model_dir)`` returns a ready :class:`Translator`."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from .decode.ensemble import Ensemble
from .decode.translator import DTYPES, Translator, for_decoding
from .modeldir import load_model_dir


def load(model_dir: str | Path, device: str | torch.device = "cpu", dtype: str = "fp32",
         ensemble: list[str | Path] | tuple = (), native: bool = False) -> Translator:
    """Load a model directory (plus optional ``ensemble`` members) for translation.

    ``dtype`` is ``"fp32"``, ``"bf16"`` (weights and activations; scores are computed in fp32) or
    ``"int8"`` (CPU: dynamically quantised linear layers).
    Ensemble members must have the same vocabularies as the first model.
    ``native`` runs each decoder step as one C++ call (:mod:`transduce.decode.native`; same
    outputs, less per-step overhead, built on first use); where it cannot, a warning says why.

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
    models = [for_decoding(m.eval(), dtype, torch.device(device)) for m in models]
    if native:
        models = [_native(m) for m in models]
    decoder = models[0] if len(models) == 1 else Ensemble(models)
    return Translator(decoder, vocabs, device, meta)


def _native(model):
    """``model`` with the C++ decoder step, or ``model`` itself and a warning saying why not."""
    from .decode import native

    why = native.supports(model)
    fast = native.native_step(model) if why is None else None
    if fast is None:
        warnings.warn(f"native decoder step not used ({why or 'the extension could not be built'}); "
                      "decoding with the Python step", RuntimeWarning, stacklevel=3)
        return model
    return fast
