"""Translator: text in, text out, in input order, whatever the batching.

Batching keeps translations independent of the batch (see :mod:`~transduce.decode.search`):
each source is padded to a length that depends only on itself (its length + eos rounded up
to a multiple of ``PAD_MULTIPLE``), a batch holds sentences of one padded length only, and
search pads the decoder batch with ghost rows. Batch size, sorting and the order of the
input therefore do not change any output, scores included, bit for bit, with one CPU
thread, in fp32 and in bf16 (tests/test_decode_invariance.py; 1,000 Multi30k test
sentences give byte-identical output at batch size 1 and 4,096 tokens). With several
threads MKL rounds a GEMM row differently depending on its position in the batch, so scores
may differ in the last bits (text was identical in our tests). GPU kernels were not tested.
"""

from __future__ import annotations

import warnings
from collections import defaultdict
from dataclasses import dataclass

import torch

from ..data.vocab import Vocabs, language_tokens
from ..fastpaths import FastPaths
from . import rerank as rerank_
from .align import align, check_model
from .constraints import Constraints
from .hypothesis import Hypothesis
from .mbr import MBRConfig, choose
from .search import search
from .search_options import SearchOptions

PAD_MULTIPLE = 8


@dataclass
class Translation:
    """One output: detokenised ``text``, its target ``tokens``, model ``logprob`` and ranking ``score``;
    ``alignment``: (source word, target word) pairs when asked for (:mod:`~transduce.decode.align`)."""

    text: str
    tokens: list[int]
    logprob: float
    score: float
    alignment: list[tuple[int, int]] | None = None


class SourceTooLong(ValueError):
    """An input line longer than the model allows (``encode_sources(..., truncate=False)``): which line
    (from 0), its source tokens with eos and the target-language token, and the model's limit."""

    def __init__(self, index: int, tokens: int, limit: int):
        super().__init__(f"input line {index + 1}: {tokens} source tokens exceed the model's max_positions={limit}")
        self.index, self.tokens, self.limit = index, tokens, limit


class Translator:
    """Holds a decoder (a model or an :class:`~transduce.decode.ensemble.Ensemble`) and vocabularies."""

    def __init__(
        self,
        model,
        vocabs: Vocabs,
        device: str | torch.device = "cpu",
        meta: dict | None = None,
        channel=None,
        fast_paths: FastPaths | None = None,
    ):
        self.model, self.vocabs, self.device = model.eval(), vocabs, torch.device(device)
        # which decoding backend runs and why (transduce.fastpaths); None: the model as given
        self.fast_paths = fast_paths
        self.origin = None  # transduce.api.Origin when load() made it: how to load it again elsewhere
        self.config = model.config
        self.meta = meta or {}  # the model directory's [meta] (languages, provenance)
        self.channel = channel.eval() if channel is not None else None  # target→source, for reranking

    # ---------------------------------------------------------------- inputs
    @property
    def target_languages(self) -> dict[str, int]:
        """A multilingual model's target languages: code -> id of its ``>>code<<`` token (empty for others)."""
        if not hasattr(self, "_target_languages"):
            self._target_languages = language_tokens(self.vocabs.src)
        return self._target_languages

    def language_prefix(self, target_lang: str | None) -> list[int]:
        """The ids to put before each source: ``[id of >>target_lang<<]``, or none for ``None``."""
        langs = self.target_languages
        if target_lang is None:
            return []
        if target_lang not in langs:
            have = ", ".join(sorted(langs)[:20]) + (", ..." if len(langs) > 20 else "")
            raise ValueError(
                f"target language {target_lang!r}: "
                + (
                    f"this model knows {have}"
                    if langs
                    else "this model has no >>xx<< target-language tokens (it translates into one language)"
                )
            )
        return [langs[target_lang]]

    def encode_sources(
        self, sentences: list[str], truncate: bool = True, target_lang: str | None = None
    ) -> list[list[int] | None]:
        """Source ids + eos (without it for ``source_eos = false``) per sentence; ``None`` for an empty line. Overlong lines are cut
        to ``max_positions`` with one warning that counts them, or raise if ``truncate`` is False.
        ``target_lang``: a multilingual model's target language, as the ``>>code<<`` token before each source."""
        cfg, cut = self.config, []
        prefix = self.language_prefix(target_lang)
        out: list[list[int] | None] = []
        for n, ids in enumerate(self.vocabs.src.encode_batch(sentences)):
            ids = prefix + ids
            if not sentences[n].strip():
                out.append(None)
                continue
            eos = [cfg.eos_id] if cfg.source_eos else []
            if len(ids) + len(eos) > cfg.max_positions:
                if not truncate:
                    raise SourceTooLong(n, len(ids) + len(eos), cfg.max_positions)
                cut.append(n + 1)
                ids = ids[: cfg.max_positions - len(eos)]
            out.append(ids + eos)
        if cut:
            warnings.warn(
                f"truncated {len(cut)} input line(s) longer than max_positions={cfg.max_positions} "
                f"source tokens (lines {', '.join(map(str, cut[:10]))}{', ...' if len(cut) > 10 else ''})",
                stacklevel=3,
            )
        return out

    def batches(
        self, sources: list[list[int] | None], batch_tokens: int, batch_size: int | None, sort: bool = True
    ) -> list[list[int]]:
        """Indices of non-empty sources grouped into batches of one padded length each.

        ``batch_tokens`` bounds padded source tokens per batch, ``batch_size`` sentences.
        ``sort`` orders each group by length (less padding in the decoder's stopping times).
        """
        groups: dict[int, list[int]] = defaultdict(list)
        for i, ids in enumerate(sources):
            if ids is not None:
                groups[self.padded_length(len(ids))].append(i)
        out: list[list[int]] = []
        for width in sorted(groups):
            members = sorted(groups[width], key=lambda i: len(sources[i])) if sort else groups[width]
            per_batch = max(1, batch_tokens // width)
            if batch_size is not None:
                per_batch = min(per_batch, batch_size)
            out += [members[k : k + per_batch] for k in range(0, len(members), per_batch)]
        return out

    def padded_length(self, n: int) -> int:
        return min(-(-n // PAD_MULTIPLE) * PAD_MULTIPLE, self.config.max_positions)

    def tensor(self, rows: list[list[int]]) -> torch.Tensor:
        width = self.padded_length(max(len(r) for r in rows))
        pad = self.config.pad_id
        return torch.tensor([r + [pad] * (width - len(r)) for r in rows], device=self.device)  # (B, width)

    # ---------------------------------------------------------------- translation
    def translate(
        self,
        sentences: list[str],
        search: SearchOptions | None = None,
        *,
        batch_tokens: int = 4096,
        batch_size: int | None = None,
        sort: bool = True,
        truncate: bool = True,
        return_scores: bool = False,
        target_lang: str | None = None,
        alignments: bool | str = False,
        alignment_layer: int | None = None,
        sources: list[list[int] | None] | None = None,
        **loose,
    ) -> list:
        """Translate ``sentences`` (one per item); results come back in input order.

        ``search`` holds how to decode (:class:`~transduce.decode.search_options.SearchOptions`: beam, alpha,
        length limits, n-best, sampling, MBR, reranking; default: the paper's). The same settings given one by
        one (``beam=4, alpha=0.6, mbr=...``) still work, with a DeprecationWarning.

        Returns ``list[str]``; with ``nbest > 1`` a list of n-best lists; with
        ``return_scores`` :class:`Translation` objects instead of strings. ``beam=1`` or
        ``sample`` use single-hypothesis decoding. An empty (or blank) line gives "".
        ``search.mbr`` picks each output from the beam's ``mbr.candidates`` best by minimum Bayes
        risk (:mod:`~transduce.decode.mbr`) instead of taking the first; ``search.rerank`` picks it by the
        direct score plus the channel model's (:mod:`~transduce.decode.rerank`). ``target_lang`` chooses a
        multilingual model's target language (its ``>>code<<`` token; :attr:`target_languages` lists them).
        ``alignments``
        returns :class:`Translation` objects whose ``alignment`` holds word pairs from the
        encoder–decoder attention of decoder layer ``alignment_layer`` (:mod:`~transduce.decode.align`;
        ``alignments="cover"`` also aligns each source word no target word chose); it needs a single model
        (a C++ step aligns with the PyTorch model it stands for), not an ensemble.
        ``sources``: the sentences as :meth:`encode_sources` gave them (same ``target_lang`` and ``truncate``),
        where the caller has encoded them already (a server counting tokens): they are not encoded again.
        """
        options = SearchOptions.deprecated("Translator.translate", search, loose)
        if options.rerank is not None and self.channel is None:
            raise ValueError("reranking needs a channel model (target→source): load(..., channel=DIR)")
        if alignments:
            check_model(self.model)  # before searching: an ensemble has no one attention to align with
        if sources is None:
            sources = self.encode_sources(sentences, truncate, target_lang)
        elif len(sources) != len(sentences):
            raise ValueError(f"{len(sources)} encoded sources for {len(sentences)} sentences")
        results = self.search(sources, options.searched, batch_tokens, batch_size, sort)
        if options.mbr is not None:
            results = [[hyps[self._mbr_pick(hyps, options.mbr)]] for hyps in results]
        if options.rerank is not None:
            channel = self.channel_scores(sources, results, batch_tokens)
            results = [[hyps[rerank_.choose(hyps, c, options.rerank.weight)]] for hyps, c in zip(results, channel)]
        out = [[self._wrap(h, return_scores or alignments) for h in hyps] for hyps in results]
        if alignments:
            flat = [(n, t) for n, hyps in enumerate(out) for t in hyps]
            pairs = align(
                self,
                [sources[n] for n, _ in flat],
                [t.tokens for _, t in flat],
                alignment_layer,
                batch_tokens,
                cover=alignments == "cover",
            )
            for (_, t), a in zip(flat, pairs):
                t.alignment = a
        return [o[0] for o in out] if options.nbest == 1 else out

    def search(
        self,
        sources: list[list[int] | None],
        options: SearchOptions | None = None,
        batch_tokens: int = 4096,
        batch_size: int | None = None,
        sort: bool = True,
        constraints: list[Constraints] | None = None,
    ) -> list[list[Hypothesis]]:
        """The n-best hypotheses (target ids) of each source (ids + eos, or None: an empty hypothesis),
        in input order, by :func:`~transduce.decode.search.search` with ``options`` (default: the paper's);
        ``constraints`` (one per source) searches under them. What :meth:`translate` runs between encoding
        and detokenising."""
        options = SearchOptions() if options is None else options
        results: list[list[Hypothesis]] = [[Hypothesis([], 0.0, 0.0)] for _ in sources]
        for index in self.batches(sources, batch_tokens, batch_size, sort):
            src = self.tensor([sources[i] for i in index])  # (B, width)
            seeds = [options.sample.seed + i for i in index] if options.sample is not None else None
            wanted = [constraints[i] for i in index] if constraints is not None else None
            for i, h in zip(index, search(self.model, src, options, seeds, wanted)):
                results[i] = h
        return results

    def channel_scores(
        self, sources: list[list[int] | None], nbest: list[list[Hypothesis]], batch_tokens: int = 4096
    ) -> list[list[float]]:
        """log p(x | y) / (|x| + 1) under the channel model for each candidate y of each source x."""
        return rerank_.channel_scores(self.channel, sources, nbest, batch_tokens, self.device)

    def _mbr_pick(self, hyps: list[Hypothesis], mbr: MBRConfig) -> int:
        return choose([self.vocabs.tgt.decode(h.tokens) for h in hyps], [h.logprob for h in hyps], mbr)

    def _wrap(self, hyp: Hypothesis, scores: bool):
        text = self.vocabs.tgt.decode(hyp.tokens)
        return Translation(text, hyp.tokens, hyp.logprob, hyp.score) if scores else text

    # ---------------------------------------------------------------- scoring
    def reference_nll(
        self, sources: list[str], references: list[str], batch_tokens: int = 4096, model=None
    ) -> tuple[float, int]:
        """Teacher-forced negative log-likelihood of ``references`` (sum, in nats) and its token
        count (target tokens + eos), for perplexity. Empty source lines are skipped."""
        per_sentence = self.sentence_nll(sources, references, batch_tokens, model)
        return sum(nll for nll, _ in per_sentence), sum(n for _, n in per_sentence)

    def sentence_nll(
        self, sources: list[str], references: list[str], batch_tokens: int = 4096, model=None
    ) -> list[tuple[float, int]]:
        """Per sentence, in input order: the reference's teacher-forced negative log-likelihood (nats) and its
        token count (target tokens + eos); ``(0.0, 0)`` for an empty source line, which is skipped."""
        model = model if model is not None else self.model
        if not hasattr(model, "decode"):
            raise ValueError("reference perplexity needs a single model, not an ensemble")
        cfg = self.config
        src = self.encode_sources(sources)
        tgt = [
            [cfg.bos_id] + ids[: cfg.max_positions - 1] + [cfg.eos_id]
            for ids in self.vocabs.tgt.encode_batch(references)
        ]
        out = [(0.0, 0)] * len(sources)
        for index in self.batches(src, batch_tokens, None):
            s = self.tensor([src[i] for i in index])
            width = max(len(tgt[i]) for i in index)
            t = torch.tensor([tgt[i] + [cfg.pad_id] * (width - len(tgt[i])) for i in index], device=self.device)
            logits = model(s, t[:, :-1]).float()  # (B, T, V)
            nll = torch.nn.functional.cross_entropy(
                logits.transpose(1, 2), t[:, 1:], ignore_index=cfg.pad_id, reduction="none"
            )  # (B, T)
            sums, counts = nll.sum(1).tolist(), (t[:, 1:] != cfg.pad_id).sum(1).tolist()
            for k, i in enumerate(index):
                out[i] = (sums[k], int(counts[k]))
        return out
