"""Decoding (§6.1): search.py (greedy, beam, sampling), ensemble.py (averaged log-probabilities),
translator.py (text in/out, batch-invariant batching), cli.py (``transduce translate``).
Python users start from ``transduce.load(model_dir)`` (transduce/api.py)."""

DTYPES = ("fp32", "bf16", "fp16", "int8")  # decoding precisions (translator.for_decoding); no torch import here
