"""transduce: the Transformer of "Attention Is All You Need" (Vaswani et al., 2017).

The public names load lazily, so command-line tools that do not need torch start fast. Importing the package
has no process-wide effect: the settings a command needs (MKL's reproducibility mode, jemalloc for training)
are made by that command (cli.py, api.load).

Rooms (each package's docstring lists its modules), from the bottom up:

config.py         — TOML configs read into validated dataclasses; ConfigError
model/            — the Transformer (§3), one module per concept
data/             — corpora in, vocabularies, token-id cache, token-budget batches (§5.1)
safefiles.py      — weight, JSON and YAML files read without running code
modeldir.py       — model directories: weights, config, vocabularies
interop/          — CTranslate2 and MarianMT export, OPUS-MT import
fastpaths.py      — the one log line that says what runs each hot part, and why
cpp.py            — builds the C++ parts on first use
allocator.py      — jemalloc for CPU training
decode/           — the paper's search (§6.1) and the Translator
backends/         — what runs a decoder step (fp32, bf16, int8, C++) and the one place that chooses it
text/             — documents, the translate stream, HTML markup, terminology
train/            — training (§5)
api.py            — ``transduce.load(model_dir)``: a ready Translator
viz/              — attention maps, the paper's arguments as plots, Table 1 measured
serve/            — the HTTP server
cli.py            — the ``transduce`` command; ``__main__.py`` runs it
translate.py      — ``transduce translate``
score.py          — ``transduce score``
evaluate.py       — ``transduce evaluate``: sacreBLEU, chrF, tokenized BLEU, perplexity
check_backends.py — ``transduce check-backends``: int8 against fp32, recorded in backends.json
info.py           — ``transduce info``
recipe.py         — ``transduce recipe``: prepare, train, average, evaluate from one TOML
demo.py           — ``transduce demo``
"""

from __future__ import annotations

import importlib
from typing import Any

from .config import ConfigError

__version__ = "0.1.0"

_LAZY = {
    "ModelConfig": "transduce.model",
    "Transformer": "transduce.model",
    "load": "transduce.api",
    "SearchOptions": "transduce.decode.search_options",
}

__all__ = ["ConfigError", "ModelConfig", "SearchOptions", "Transformer", "load", "__version__"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'transduce' has no attribute {name!r}")
