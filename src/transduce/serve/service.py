"""What both HTTP APIs share: limits, key checks, routing to a model, and running work on its batcher.

Every use of a model goes through its :class:`~transduce.serve.batcher.Batcher` (one per loaded
model), whose worker threads, one per core by default (:func:`worker_count`), decode batches in
parallel on the one copy of the weights; attention recording and HTML translation (alignments) run
alone on the model. A batcher job's key is its options, a :class:`Translate` or an :class:`Attention`;
jobs batch together only when these are equal (HTML is a :class:`Translate` with alignments, so the
sentences of HTML snippets batch like text). A request's search settings are read by
:meth:`SearchOptions.from_request <transduce.decode.search_options.SearchOptions.from_request>` within the
server's limits (:meth:`Service.search`).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..decode.search_options import PAPER, BadSearch, SearchOptions
from ..decode.translator import SourceTooLong
from .alignment import word_alignments
from .batcher import Batcher, Job
from .keys import Access, Denied
from .registry import Loaded, ModelPool, ModelSpec, NoModel, PoolFull
from .replicas import Replica, worker_kind


@dataclass
class Settings:
    """Limits and batching; every field is a command-line option of ``transduce serve``."""

    max_sentences: int = 64  # per request
    max_chars: int = 2000  # per sentence
    max_body: int = 1_000_000  # bytes
    max_beam: int = 16
    timeout: float = 60.0  # seconds per request, queueing included
    wait_ms: float = 0.0  # a worker's wait for more company while others are queued; 0: it takes what is queued
    batch_tokens: int = 4096  # source tokens per batch
    max_batch_requests: int = 64  # 1 = one request at a time
    beam: int = PAPER.beam  # beam of the LibreTranslate API and the page
    alpha: float = PAPER.alpha  # length penalty of the LibreTranslate API and the page
    char_limit: int = 0  # characters per LibreTranslate request, all texts together (0: no limit)
    workers: int = 0  # batches decoded at once (0: cores // threads)
    threads: int = 1  # torch intra-op threads of each worker
    lone_threads: int = 0  # a thread worker's threads for a batch it decodes alone (0: by the model's width)
    # processes with a model each, or threads sharing one (replicas.worker_kind); `transduce serve`: auto
    worker_kind: str = "thread"

    @property
    def search(self) -> SearchOptions:
        """The server's search: that of the LibreTranslate API and the page, and of a request's absent fields."""
        return PAPER.replace(beam=self.beam, alpha=self.alpha)


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity mask, as taskset or a container's cpuset set it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS, Windows
        return os.cpu_count() or 1


def worker_count(settings: Settings) -> int:
    """``settings.workers``, or by default one worker per ``settings.threads`` usable cores."""
    return settings.workers or max(1, usable_cores() // settings.threads)


@dataclass(frozen=True)
class Translate:
    """A translation job's options: the search and the rest of :meth:`Translator.translate`'s keywords."""

    search: SearchOptions = PAPER
    target_lang: str | None = None  # a multilingual model's >>code<< token
    alignments: bool | str = False  # "cover": word alignments for HTML tag placement
    alignment_layer: int | None = None

    @property
    def exclusive(self) -> bool:
        """Alignments record attention on the model's modules: such a batch runs alone on the model."""
        return bool(self.alignments)


@dataclass(frozen=True)
class Attention:
    """A job recording each translation's word-level encoder–decoder attention (for the page)."""

    search: SearchOptions = PAPER
    target_lang: str | None = None
    exclusive = True  # it records attention on the model's modules: it runs alone on the model


class Rejected(Exception):
    """A request the server refuses: HTTP ``status`` and a message naming the field."""

    def __init__(self, status: int, message: str, retry_after: float = 0.0):
        super().__init__(message)
        self.status, self.message, self.retry_after = status, message, retry_after


def run_job(translator, sentences: list[str], sources: list, job: Translate | Attention) -> list:
    """What a batcher worker does with one batch: ``sources`` are the sentences as encoded by
    :meth:`Service.encode`, not encoded again."""
    if isinstance(job, Translate):
        extra = {"alignments": job.alignments, "alignment_layer": job.alignment_layer} if job.alignments else {}
        return translator.translate(
            sentences,
            job.search,
            sources=sources,
            target_lang=job.target_lang,
            return_scores=True,
            truncate=False,
            **extra,
        )
    if isinstance(job, Attention):
        return word_alignments(translator, sentences, job.search, job.target_lang, sources)
    raise ValueError(f"unknown job {job!r}")


class Service:
    def __init__(self, pool: ModelPool, settings: Settings, access: Access, suggestions=None):
        self.pool, self.settings, self.access = pool, settings, access
        self.suggestions = suggestions  # a suggestions.Store, or None when /suggest is off
        self.file_formats: tuple[str, ...] = ()  # what POST /translate_file takes (none: files are off)

    def authorize_chars(self, given: str | None, host: str | None) -> int:
        """:meth:`authorize`, then the character limit of the key given (0: the server's)."""
        self.authorize(given, host)
        return self.access.char_limit(given)

    def authorize(self, given: str | None, host: str | None) -> str:
        try:
            return self.access.check(given, host)
        except Denied as e:
            raise Rejected(e.status, str(e), e.retry_after) from None

    def route(self, source: str | None, target: str | None) -> tuple[ModelSpec, str | None]:
        """The model for a pair, and the code of the ``>>code<<`` token a multilingual model decodes with
        (None for a one-language model); with one model, the pair may be left out."""
        try:
            if not source and not target and len(self.pool.specs) == 1:
                spec = next(iter(self.pool.specs.values()))
                return spec, spec.target_lang(None)
            if not source or not target:
                raise Rejected(400, "name both 'source' and 'target' languages (this server has several models)")
            source, target = self.pool.resolve(source, target)  # "fr" reaches a model served as "fra"
            spec = self.pool.route(source, target)
            return spec, spec.target_lang(target)
        except NoModel as e:
            raise Rejected(400, str(e)) from None

    def check_text(self, spec: ModelSpec, sentences: list[str], field: str, count: bool = True) -> None:
        """Sentences per request (unless not ``count``: the split sentences of whole texts) and characters."""
        s = self.settings
        if count and len(sentences) > s.max_sentences:
            raise Rejected(
                413, f"field '{field}': {len(sentences)} sentences exceed the limit of {s.max_sentences} per request"
            )
        for i, sentence in enumerate(sentences):
            if len(sentence) > s.max_chars:
                raise Rejected(
                    413, f"field '{field}.{i}': {len(sentence)} characters exceed the limit of {s.max_chars}"
                )

    def encode(self, entry: Loaded, sentences: list[str], field: str, target_lang: str | None) -> list:
        """The sentences as the model's source ids (with eos and the >>code<< token; None for a blank one),
        encoded once here and handed to the translator with the job; one over max_positions is a 413."""
        try:
            return entry.translator.encode_sources(sentences, truncate=False, target_lang=target_lang)
        except SourceTooLong as e:
            raise Rejected(
                413, f"field '{field}.{e.index}': {e.tokens} source tokens exceed the model's max_positions={e.limit}"
            ) from None

    def search(self, fields: Mapping[str, Any]) -> SearchOptions:
        """The search a request's fields (``beam``, ``alpha``, ``nbest``) ask for, over the server's
        (:attr:`Settings.search`) and within its limits (``--max-beam``): a field out of them is a 422 naming it."""
        try:
            return SearchOptions.from_request(fields, self.settings.search, self.settings.max_beam)
        except BadSearch as e:
            raise Rejected(422, f"field '{e.key}': {e.reason}") from None

    async def run(self, spec: ModelSpec, sentences: list[str], job: Translate | Attention, field: str = "text") -> list:
        """Queue ``sentences`` on the model's batcher (loading the model if needed) and await the results."""
        try:
            entry = self.pool.acquire_loaded(spec) or await asyncio.to_thread(self.pool.acquire, spec)
        except PoolFull as e:
            raise Rejected(503, str(e), 5.0) from None
        except Exception as e:  # noqa: BLE001 - a broken model directory: say which, keep serving the others
            raise Rejected(500, f"model {spec.name} ({spec.path}) could not be loaded: {e}") from None
        try:
            sources = self.encode(entry, sentences, field, job.target_lang)
            if not sentences:
                return []
            tokens = sum(len(ids) for ids in sources if ids is not None)
            try:
                future = entry.batcher.submit(Job(sentences, job, tokens, sources, exclusive=job.exclusive))
            except RuntimeError as e:
                raise Rejected(503, str(e)) from None
            try:
                return await asyncio.wait_for(asyncio.wrap_future(future), self.settings.timeout)
            except TimeoutError:
                raise Rejected(
                    504, f"translation took longer than the {self.settings.timeout:g} s per-request timeout"
                ) from None
        finally:
            self.pool.release(entry)

    async def translate(
        self,
        spec: ModelSpec,
        sentences: list[str],
        search: SearchOptions,
        field: str = "text",
        target_lang: str | None = None,
        count: bool = True,
    ) -> list:
        """``sentences`` translated by ``spec``'s model with ``search`` (read by :meth:`search`, within the
        server's limits), after the size checks (:meth:`check_text`)."""
        self.check_text(spec, sentences, field, count)
        return await self.run(spec, sentences, Translate(search, target_lang), field)


# A lone batch spread over the workers' cores pays for its threads' hand-offs only where the matrices are wide:
# one sentence at a time on 2 AVX2 cores (bench/serve_options.py --clients 1 --variant one='--lone-threads 1'),
# +15% requests/s at d_model 512 (paper-base) and -17% at 128 (`small`). `--lone-threads` overrides it.
LONE_THREADS_MIN_WIDTH = 512


def lone_threads(settings: Settings, workers: int, translator) -> int:
    """The intra-op threads of a lone batch: ``--lone-threads``, or all the workers' threads for a model at
    least ``LONE_THREADS_MIN_WIDTH`` wide decoded by the C++ step (``*-native``: its output does not depend on
    its threads, so served output still equals offline output), else one worker's."""
    if settings.lone_threads:
        return settings.lone_threads
    # read with getattr: a translator may be wrapped (the tests' slow and failing ones) or made by hand (no fast_paths)
    decoder = getattr(getattr(translator, "fast_paths", None), "decoder", None)
    native = decoder is not None and decoder.name.endswith("-native")
    width = getattr(getattr(translator, "config", None), "d_model", 0)
    return workers * settings.threads if native and width >= LONE_THREADS_MIN_WIDTH else settings.threads


def make_batcher_factory(settings: Settings, metrics):
    import torch

    def make(spec: ModelSpec, translator) -> Batcher:
        def here(sentences, sources, job):
            return run_job(translator, sentences, sources, job)

        workers = worker_count(settings)
        kind, _ = worker_kind(settings.worker_kind, workers, getattr(translator, "origin", None))
        runners = here
        if kind == "process":
            runners = [Replica(translator.origin, settings.threads, run_job, here, i) for i in range(workers)]
        return Batcher(
            runners,
            settings.wait_ms / 1000,
            settings.batch_tokens,
            settings.max_batch_requests,
            on_batch=metrics.on_batch(spec.pair),
            workers=workers,
            threads=settings.threads,
            lone_threads=lone_threads(settings, workers, translator),
            set_threads=torch.set_num_threads,
        )

    return make
