"""Decoding backends: the arithmetic that runs a decoder step, and the one place that chooses it.

==============  ==============================================================  =====================================
backend         what runs                                                       guarantee
==============  ==============================================================  =====================================
``fp32``        the Python step (``Transformer.decode_step``), fp32              the reference; batch-invariant
``fp32-native`` C++ fp32 GEMMs and loops for encoder, step and search           fp32 within rounding; batch-invariant
``bf16``        the Python step in bfloat16                                     batch-invariant
``bf16-native`` as ``bf16``, each step one C++ call                              bit-identical to ``bf16``
``fp16``        the Python step in float16, on CUDA only                        approximates fp32
``int8``        torch's dynamic quantisation of every ``nn.Linear``             depends on the batch
``int8-native`` C++ int8 GEMMs and loops for encoder, step and search           batch-invariant; BLEU checked
==============  ==============================================================  =====================================

The two loop steps (``fp32-native``, ``int8-native``) return the same bits on every SIMD level and thread
count. ``bf16-native`` runs the Python step's ATen ops from C++ (so does ``native.native_step(model, "aten")``
in fp32: the bit-identical C++ step the tests hold to the Python one).

``auto`` (the default) is decided by :mod:`~transduce.backends.policy` from the model directory's accuracy
record: ``int8-native`` where the record vouches for it, else fp32 arithmetic (``fp32-native`` on a CPU).
The names are defined here, once, without importing torch (the command lines read them).

Modules:

- ``__init__.py``: the backend names (:data:`BACKENDS`, :data:`DTYPES`) and :func:`requested_backend`
- ``options.py``: the ``--backend``/``--exact``/``--dtype``/``--native`` options of the decoding commands
- ``policy.py``: ``auto``, the backend a job may run, and building a model's decoder for a backend
- ``record.py``: ``backends.json``, the accuracy record ``auto`` reads (read, write, weights digest)
- ``precision.py``: a model in a decoding precision (fp32, bf16, fp16, int8): the Python step's backends
- ``native.py``: the C++ step (``native_step.cpp``, ``fp32_gemm.h``, ``int8_gemm.h``, ``int8_step.h``, ``vecmath.h``)
- ``spec.py``: the weights and settings the C++ step reads from a model, and what it does not cover
"""

from __future__ import annotations

AUTO = "auto"
DTYPES = ("fp32", "bf16", "fp16", "int8")  # decoding precisions (precision.for_decoding)
NATIVE = "-native"  # the suffix of a backend that steps in C++ (native.py)
BACKENDS = ("fp32", "fp32-native", "bf16", "bf16-native", "fp16", "int8", "int8-native")
CHOICES = (AUTO, *BACKENDS)  # what --backend and backend= accept


def is_native(backend: str) -> bool:
    """Whether ``backend`` steps in C++."""
    return backend.endswith(NATIVE)


def dtype_of(backend: str) -> str:
    """The precision of ``backend``'s arithmetic: ``"int8-native"`` -> ``"int8"``."""
    return backend.removesuffix(NATIVE)


def requested_backend(backend: str = AUTO, dtype: str | None = None, native: bool | None = None) -> str:
    """The backend asked for: ``backend``, or the one ``dtype`` and ``native`` name (``--dtype``, ``--native``)."""
    if backend != AUTO and backend not in BACKENDS:
        raise ValueError(f"backend must be 'auto' or one of {', '.join(BACKENDS)}, got {backend!r}")
    if dtype is None and not native:
        return backend
    if backend != AUTO:
        raise ValueError(f"give either backend ({backend!r}) or dtype/native, not both")
    name = f"{dtype or 'fp32'}{NATIVE if native else ''}"
    if name not in BACKENDS:
        raise ValueError(
            f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}"
            if dtype not in DTYPES
            else f"dtype {dtype} has no C++ step (no {name} backend)"
        )
    return name
