"""Which model serves which language pair, and which models are in memory.

A server holds one or more model directories, each for one ``source -> target`` pair or, for a
multilingual model (one whose source vocabulary has ``>>xx<<`` target-language tokens, as imported
multilingual OPUS-MT models have), for ``source -> xx`` for each of its tokens. They are listed by

* a models TOML::

      [[model]]
      path = "en-de"          # a model directory, relative to this file
      source = "en"           # optional when the directory's [meta] has src_lang / tgt_lang
      target = "de"           # a multilingual model: serve only this one of its >>xx<< targets
      name = "en-de"          # optional (default: the directory's name)
      dtype = "int8"          # optional (default: the server's --backend)

* or a directory whose sub-directories are model directories with ``src_lang`` / ``tgt_lang`` in
  their ``[meta]``.

When two models serve one pair, a one-language model is chosen before a multilingual one, and
otherwise the one listed first (in the TOML, or by directory name); two one-language models for
one pair are an error.

A request's codes are matched as written first, then in their shortest standard form (BCP 47, by
``langcodes``), so a LibreTranslate client asking for ``fr`` reaches a model whose token is ``>>fra<<``
(and ``deu`` a model served as ``de``).

:class:`ModelPool` loads a model on its first request and keeps loaded models within a memory
budget: before loading another it unloads the least recently used models that no request is using.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import langcodes

from ..backends import DTYPES
from ..config import ConfigError, read_toml
from ..data.vocab import language_tokens
from ..modeldir import VOCAB, WEIGHTS, load_vocabs, read_model_config

SPEC_KEYS = {"path", "source", "target", "name", "dtype"}


class NoModel(LookupError):
    """No model serves the requested pair (the message names the pairs that exist)."""


@dataclass(frozen=True)
class ModelSpec:
    """One servable model: where it is and the pair it translates."""

    name: str
    path: Path
    source: str
    target: str
    dtype: str | None = None  # None: the server's --backend
    languages: tuple[str, ...] = ()  # a multilingual model's targets, each chosen by its >>code<< token

    @property
    def pair(self) -> str:
        return f"{self.source}-{self.target}"

    @property
    def pairs(self) -> list[tuple[str, str]]:
        """The (source, target) pairs this model serves."""
        return [(self.source, t) for t in self.languages] if self.languages else [(self.source, self.target)]

    def target_lang(self, target: str | None) -> str | None:
        """The ``>>code<<`` token's code to translate into ``target`` (None: a one-language model)."""
        if not self.languages:
            return None
        if target is None and len(self.languages) == 1:
            return self.languages[0]
        if target not in self.languages:
            raise NoModel(
                f"model {self.name} translates into several languages ({', '.join(self.languages)}): name 'target'"
                if target is None
                else f"no model translates {self.source!r} to {target!r}; model {self.name} has: "
                + ", ".join(f"{self.source}-{t}" for t in self.languages)
            )
        return target


def spec_from_dir(
    path: Path, source: str = "", target: str = "", name: str = "", dtype: str | None = None, where: str = ""
) -> ModelSpec:
    """A spec for a model directory; languages not given come from its ``[meta]``."""
    where = where or str(path)
    _config, meta = read_model_config(path)  # raises naming the file when it is not a model directory
    languages = tuple(sorted(language_tokens(load_vocabs(path / VOCAB).src)))  # as the translator reads them
    if languages and target:
        if target not in languages:
            raise ConfigError(
                f"{where}: target {target!r}: {path} is multilingual and has no >>{target}<< token "
                f"(it has: {', '.join(languages)})"
            )
        languages = (target,)
    source = source or str(meta.get("src_lang", ""))
    target = target or str(meta.get("tgt_lang", "")) or ("mul" if languages else "")
    for key, value in (("source", source), ("target", target)):
        if not value:
            meta_key = "src_lang" if key == "source" else "tgt_lang"
            raise ConfigError(
                f"{where}: no {key} language: give '{key}' or put {meta_key} in {path}/config.toml [meta]"
            )
    if dtype is not None and dtype not in DTYPES:
        raise ConfigError(f"{where}: dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    return ModelSpec(name or path.name, path, source, target, dtype, languages)


def read_models(location: str | Path) -> list[ModelSpec]:
    """The models listed by a TOML file or found in a directory of model directories."""
    location = Path(location)
    if location.is_dir():
        subdirs = sorted(p for p in location.iterdir() if (p / "config.toml").is_file())
        if not subdirs:
            raise ConfigError(f"{location}: no model directories (sub-directories with a config.toml) in it")
        specs = [spec_from_dir(p) for p in subdirs]
    elif location.is_file():
        data = read_toml(location)
        unknown = set(data) - {"model"}
        if unknown:
            raise ConfigError(f"{location}: unknown key(s) {', '.join(sorted(unknown))}; expected [[model]] tables")
        tables = data.get("model")
        if not isinstance(tables, list) or not tables:
            raise ConfigError(f"{location}: no [[model]] tables")
        specs = []
        for i, table in enumerate(tables):
            where = f"{location} [[model]] #{i + 1}"
            unknown = set(table) - SPEC_KEYS
            if unknown:
                raise ConfigError(
                    f"{where}: unknown key(s) {', '.join(sorted(unknown))} (known: {', '.join(sorted(SPEC_KEYS))})"
                )
            if "path" not in table:
                raise ConfigError(f"{where}: missing 'path'")
            path = Path(table["path"])
            path = path if path.is_absolute() else location.parent / path
            specs.append(
                spec_from_dir(
                    path,
                    table.get("source", ""),
                    table.get("target", ""),
                    table.get("name", ""),
                    table.get("dtype"),
                    where,
                )
            )
    else:
        raise FileNotFoundError(f"{location}: no such models file or directory")
    check_unique(specs, str(location))
    return specs


def check_unique(specs: list[ModelSpec], where: str) -> None:
    """Names are unique, and so are the pairs of one-language models (multilingual ones may overlap)."""
    for attr in ("name", "pair"):
        seen: dict[str, ModelSpec] = {}
        for spec in specs:
            if attr == "pair" and spec.languages:
                continue
            value = getattr(spec, attr)
            if value in seen:
                raise ConfigError(f"{where}: two models with {attr} {value!r} ({seen[value].path} and {spec.path})")
            seen[value] = spec


def routes(specs: list[ModelSpec]) -> dict[tuple[str, str], ModelSpec]:
    """Each pair's model: a one-language model before a multilingual one, then the order listed."""
    out: dict[tuple[str, str], ModelSpec] = {}
    for spec in sorted(specs, key=lambda s: bool(s.languages)):  # a stable sort keeps the listed order
        for pair in spec.pairs:
            out.setdefault(pair, spec)
    return out


class PoolFull(RuntimeError):
    """The memory budget cannot hold the model now."""


@dataclass
class Loaded:
    """A model in memory: its translator, its batcher, its size and how many requests use it now."""

    spec: ModelSpec
    translator: object
    batcher: object
    nbytes: int
    users: int = 0
    pinned: bool = False  # never unloaded (a model handed to the server already loaded)
    last_used: float = field(default_factory=time.monotonic)


def model_bytes(translator, fallback: int) -> int:
    """Bytes of the translator's parameters and buffers (``fallback`` when it does not expose them)."""
    model = getattr(translator, "model", None)
    try:
        tensors = list(model.parameters()) + list(model.buffers())
    except (AttributeError, TypeError):
        return fallback
    return sum(t.numel() * t.element_size() for t in tensors) or fallback


@functools.lru_cache(maxsize=4096)  # pure; asked several times on every request
def language_key(code: str) -> str:
    """``code`` in its shortest standard form: "fra" and "fr" -> "fr", "zho_Hans" -> "zh-hans"; a code
    langcodes cannot read is kept as it is (lowercased)."""
    try:
        return langcodes.standardize_tag(code).lower()
    except ValueError:  # langcodes' LanguageTagError
        return code.lower()


def aliases(by_pair: dict[tuple[str, str], ModelSpec]) -> dict[tuple[str, str], tuple[str, str]]:
    """Each served pair under its codes' standard forms; where two pairs share them, the one routes() put first."""
    out: dict[tuple[str, str], tuple[str, str]] = {}
    for source, target in by_pair:
        out.setdefault((language_key(source), language_key(target)), (source, target))
    return out


class ModelPool:
    """Routes pairs to specs and keeps at most ``budget_bytes`` of models loaded (0: no limit).

    ``load(spec) -> translator`` and ``make_batcher(spec, translator) -> Batcher`` are called on a
    worker thread; use :meth:`acquire` / :meth:`release` around every use of a loaded model.
    """

    def __init__(self, specs: list[ModelSpec], load: Callable, make_batcher: Callable, budget_bytes: int = 0):
        check_unique(specs, "models")
        self.specs = {s.name: s for s in specs}
        self.by_pair = routes(specs)
        self.aliases = aliases(self.by_pair)
        self.load, self.make_batcher, self.budget = load, make_batcher, budget_bytes
        self.loaded: OrderedDict[str, Loaded] = OrderedDict()  # least recently used first
        self.loads = self.evictions = 0
        self._lock = threading.Lock()
        self._loading = {name: threading.Lock() for name in self.specs}
        self._reserved = 0

    # ---------------------------------------------------------------- routing
    def resolve(self, source: str, target: str) -> tuple[str, str]:
        """The served pair a request's ``source`` and ``target`` name: as written, else by standard form."""
        if (source, target) in self.by_pair:
            return source, target
        return self.aliases.get((language_key(source), language_key(target)), (source, target))

    def route(self, source: str, target: str) -> ModelSpec:
        spec = self.by_pair.get((source, target))
        if spec is None:
            pairs = ", ".join(sorted(f"{s}-{t}" for s, t in self.by_pair))
            raise NoModel(f"no model translates {source!r} to {target!r}; this server has: {pairs}")
        return spec

    def sources_for(self, target: str) -> list[str]:
        return sorted({s for s, t in self.by_pair if t == target})

    # ---------------------------------------------------------------- loading
    def acquire(self, spec: ModelSpec) -> Loaded:
        """The loaded model of ``spec`` (loading it, which may unload others, if needed), marked in use."""
        with self._loading[spec.name]:  # one load per model at a time; others wait for it
            with self._lock:
                entry = self.loaded.get(spec.name)
                if entry is not None:
                    return self._use(entry)
                need = self._estimate(spec)
                victims = self._make_room(spec, need)
                self._reserved += need
            for victim in victims:
                victim.batcher.stop()
            try:
                translator = self.load(spec)
                entry = Loaded(spec, translator, self.make_batcher(spec, translator), model_bytes(translator, need))
                entry.batcher.start()
            finally:
                with self._lock:
                    self._reserved -= need
            with self._lock:
                self.loaded[spec.name] = entry
                self.loads += 1
                return self._use(entry)

    def acquire_loaded(self, spec: ModelSpec) -> Loaded | None:
        """The model of ``spec`` marked in use if it is in memory, else None (then :meth:`acquire` loads it): no
        wait, so a request for a loaded model needs no thread of its own."""
        with self._lock:
            entry = self.loaded.get(spec.name)
            return self._use(entry) if entry is not None else None

    def release(self, entry: Loaded) -> None:
        with self._lock:
            entry.users -= 1

    def add_loaded(self, spec: ModelSpec, translator) -> Loaded:
        """Register a model that is already in memory; it is never unloaded."""
        entry = Loaded(spec, translator, self.make_batcher(spec, translator), model_bytes(translator, 0), pinned=True)
        entry.batcher.start()
        with self._lock:
            self.loaded[spec.name] = entry
        return entry

    def stop(self) -> None:
        with self._lock:
            entries = list(self.loaded.values())
        for entry in entries:
            entry.batcher.stop()

    @property
    def pending(self) -> int:
        """Requests queued or running, summed over loaded models."""
        with self._lock:
            entries = list(self.loaded.values())
        return sum(e.batcher.pending for e in entries)

    @property
    def used_bytes(self) -> int:
        with self._lock:
            return sum(e.nbytes for e in self.loaded.values())

    def _use(self, entry: Loaded) -> Loaded:
        entry.users += 1
        entry.last_used = time.monotonic()
        self.loaded.move_to_end(entry.spec.name)
        return entry

    def _estimate(self, spec: ModelSpec) -> int:
        return os.path.getsize(spec.path / WEIGHTS) if (spec.path / WEIGHTS).is_file() else 0

    def _make_room(self, spec: ModelSpec, need: int) -> list[Loaded]:
        """Unload idle models, least recently used first, until ``need`` more bytes fit (lock held)."""
        if not self.budget:
            return []
        if need > self.budget:
            raise PoolFull(
                f"model {spec.name} needs about {need / 2**20:.0f} MiB, more than the memory budget "
                f"of {self.budget / 2**20:.0f} MiB (--memory-budget-mb)"
            )
        used = sum(e.nbytes for e in self.loaded.values()) + self._reserved
        victims = []
        for name, entry in list(self.loaded.items()):
            if used + need <= self.budget:
                break
            if entry.users == 0 and not entry.pinned:
                del self.loaded[name]
                used -= entry.nbytes
                victims.append(entry)
                self.evictions += 1
        if used + need > self.budget:
            for victim in victims:  # put them back: nothing was unloaded
                self.loaded[victim.spec.name] = victim
                self.evictions -= 1
            raise PoolFull(
                f"model {spec.name} ({need / 2**20:.0f} MiB) does not fit in the memory budget of "
                f"{self.budget / 2**20:.0f} MiB while the loaded models are in use; retry shortly"
            )
        return victims
