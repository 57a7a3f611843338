"""Moving models between toolkits.

marian.py        — HuggingFace MarianMT directories: export (dimension-permuted positions) and import (OPUS-MT)
ctranslate2.py   — CTranslate2 export through its spec API and converter (float32 or quantised)
export.py        — ``transduce export --to ct2|hf``
import_marian.py — ``transduce import HFDIR``
"""
