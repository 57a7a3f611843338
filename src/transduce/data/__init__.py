"""Data: corpora in, vocabulary, token-id cache, token-budget batches (§5.1, §5.2)."""

from .dataset import ParallelIds, PreparedData

__all__ = ["PreparedData", "ParallelIds"]
