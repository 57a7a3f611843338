"""The Python entry point: ``transduce.load(model_dir)`` returns a ready :class:`Translator`."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from .backends import AUTO, requested_backend
from .backends.policy import channel_for, decoder_backend, decoder_for
from .decode.ensemble import Ensemble
from .decode.translator import Translator
from .fastpaths import FastPaths, log, simd_choice
from .modeldir import load_model_dir


@dataclass(frozen=True)
class Origin:
    """What :func:`load` needs to make the same translator again, in another process: the model directory and
    the backend it runs (``auto`` resolved, so every copy decodes alike)."""

    model_dir: Path
    backend: str
    device: str = "cpu"


def load(
    model_dir: str | Path,
    device: str | torch.device = "cpu",
    dtype: str | None = None,
    ensemble: list[str | Path] | tuple = (),
    native: bool | None = None,
    channel: str | Path | None = None,
    backend: str = AUTO,
) -> Translator:
    """Load a model directory (plus optional ``ensemble`` members) for translation.

    ``backend`` (:data:`transduce.backends.BACKENDS`) chooses the decoding arithmetic; ``"auto"`` takes the
    fastest one that the hardware and the model support and that the model directory's ``backends.json``
    shows within 0.3 BLEU of fp32, else exact fp32 (:mod:`transduce.backends.policy`; ``translator.fast_paths``
    says which and why, also logged once on the ``transduce`` logger). ``backend="fp32"`` is exact fp32.
    ``dtype`` ("fp32", "bf16", "int8") and ``native`` (the C++ step) are the older way to name a backend:
    ``dtype="int8", native=True`` is ``backend="int8-native"``.
    Ensemble members must have the same vocabularies as the first model.
    ``channel`` is a target→source model directory with the same vocabulary, for noisy-channel reranking
    (:mod:`transduce.decode.rerank`; ``translate(..., SearchOptions(rerank=RerankConfig(...)))``).

    >>> translator = load("runs/multi30k/model")            # doctest: +SKIP
    >>> translator.translate(["A dog runs."], transduce.SearchOptions(beam=4))  # doctest: +SKIP
    """
    # batch-invariant GEMMs: MKL's strict reproducibility mode, read at MKL's first call (docs/performance.md)
    os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")
    device = torch.device(device)
    asked = requested_backend(backend, dtype, native)
    model, vocabs, meta = load_model_dir(model_dir, device)
    models = [model.eval()]
    for other in ensemble:
        m, v, _ = load_model_dir(other, device)
        if v.src.proto != vocabs.src.proto or v.tgt.proto != vocabs.tgt.proto:
            raise ValueError(f"{other}: ensemble member has a different vocabulary from {model_dir}")
        models.append(m.eval())
    choice = decoder_backend(model, model_dir, device, asked, ensemble=bool(ensemble))
    decoders = []
    for m in models:
        decoder, ran = decoder_for(m, choice, device)
        decoders.append(decoder)
    fast = FastPaths(decoder=ran, simd=simd_choice() if ran.name.endswith("-native") else None)
    log.info(fast.line())
    reverse = None
    if channel is not None:
        reverse, v, _ = load_model_dir(channel, device)
        if v.src.proto != vocabs.tgt.proto or v.tgt.proto != vocabs.src.proto:
            raise ValueError(f"{channel}: the channel model's vocabularies are not {model_dir}'s, reversed")
        reverse = channel_for(reverse, ran, device)
    decoder = decoders[0] if len(decoders) == 1 else Ensemble(decoders)
    translator = Translator(decoder, vocabs, device, meta, channel=reverse, fast_paths=fast)
    if not ensemble and channel is None:  # what loads the same translator in another process (serve's workers)
        translator.origin = Origin(Path(model_dir), ran.name, str(device))
    return translator
