"""Moving models between toolkits.

marian.py        — HuggingFace MarianMT directories: export (dimension-permuted positions) and import (OPUS-MT)
marian_native.py — OPUS-MT's native Marian releases (a ``.npz`` of weights, ``decoder.yml``, vocabulary YAML)
fetch.py         — the files of a model to import: a local directory, a release ``.zip``, a URL, a hub name
argos.py         — Argos Translate packages (``.argosmodel``): import, export
argos_index.py   — an Argos package by language pair (``argos:en-de``) from argostranslate's package index
ctranslate2.py   — CTranslate2 export through its spec API and converter (float32 or quantised)
export.py        — ``transduce export --to ct2|hf``
import_marian.py — ``transduce import HFDIR``
"""
