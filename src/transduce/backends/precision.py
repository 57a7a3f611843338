"""A model in a decoding precision: the backends whose step is the model's own Python ``decode_step``.

``fp32`` is the model as trained, ``bf16``/``fp16`` its weights and activations cast, ``int8`` torch's
dynamic quantisation of every ``nn.Linear``. The C++ step (:mod:`~transduce.backends.native`) runs the fp32 or
bf16 model given here, or quantises the fp32 model itself (``int8-native``).
"""

from __future__ import annotations

import warnings

import torch

from . import DTYPES


def for_decoding(model: torch.nn.Module, dtype: str, device: torch.device) -> torch.nn.Module:
    """``model`` in a decoding precision.

    * ``fp32``: as trained;
    * ``bf16``: weights and activations in bfloat16 (scores are still accumulated in fp32);
    * ``fp16``: CUDA only; weights and activations in float16 (scores accumulated in fp32);
    * ``int8``: CPU only; every ``nn.Linear`` (projections, feed-forward, pre-softmax) dynamically
      quantised (int8 weights, activations quantised per batch), embeddings and norms in fp32. The
      activation scale is the batch's, so unlike fp32 and bf16 an output may depend on its batch.
    """
    if dtype == "fp32":
        return model
    if dtype == "bf16":
        return model.to(torch.bfloat16)
    if dtype == "fp16":
        if device.type != "cuda":
            raise ValueError(f"dtype 'fp16' decodes on CUDA only, not on {device}: use 'bf16' or 'int8' on a CPU")
        return model.to(torch.float16)
    if dtype == "int8":
        if device.type != "cpu":
            raise ValueError(f"dtype 'int8' (dynamic quantisation) runs on the CPU only, not on {device}")
        with warnings.catch_warnings():  # torch.ao.quantization announces its move to torchao; it still works
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*")
            return torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
