"""Decoding (§6.1): search.py (greedy, beam, sampling), ensemble.py (averaged log-probabilities),
translator.py (text in/out, batch-invariant batching), cli.py (``transduce translate``).
Python users start from ``transduce.load(model_dir)`` (transduce/api.py)."""
