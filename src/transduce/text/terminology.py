"""Terminology: a glossary, per-sentence term constraints and forced prefixes, decoded with
:func:`~transduce.decode.constraints.constrained_search` (through :meth:`Translator.search`).

A glossary is a TSV file, one ``source term<TAB>target term`` per line (``#`` starts a comment line):
whenever a source term occurs in a sentence (as whole words, case-sensitively; case-insensitively
for a lowercasing vocabulary), its target term becomes a constraint of that sentence.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch

from ..decode.constraints import Constraints
from ..decode.search_options import LOOSE, SearchOptions
from ..decode.translator import Translation


@dataclass
class Glossary:
    entries: list[tuple[str, str]]  # (source term, target term)
    ignore_case: bool = False

    @classmethod
    def load(cls, path: str | Path, ignore_case: bool = False) -> Glossary:
        """Read a TSV glossary; an error names the file and line of a malformed entry."""
        entries = []
        for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip() or line.startswith("#"):
                continue
            fields = line.split("\t")
            if len(fields) != 2 or not fields[0].strip() or not fields[1].strip():
                raise ValueError(f"{path}:{n}: a glossary line is 'source term<TAB>target term', got {line!r}")
            entries.append((fields[0].strip(), fields[1].strip()))
        return cls(entries, ignore_case)

    def terms(self, sentence: str) -> list[str]:
        """Target terms of the entries whose source term occurs in ``sentence`` as whole words."""
        flags = re.IGNORECASE if self.ignore_case else 0
        return [tgt for src, tgt in self.entries if re.search(rf"(?<!\w){re.escape(src)}(?!\w)", sentence, flags)]


def continues_word(vocab, device) -> torch.Tensor:
    """(V,) bool: pieces that continue a word (no leading ``▁``, a letter or digit first)."""
    pieces = vocab.pieces(range(len(vocab)))
    return torch.tensor([not p.startswith("\u2581") and p[:1].isalnum() for p in pieces], device=device)


def translate_with_terms(
    translator,
    sentences: list[str],
    constraints: list[list[str]] | None = None,
    prefixes: list[str | None] | None = None,
    glossary: Glossary | None = None,
    search: SearchOptions | None = None,
    *,
    truncate: bool = True,
    **options,
) -> list:
    """Translate ``sentences`` so that sentence i's output contains every target term of
    ``constraints[i]`` (and of the glossary entries that match it) and starts with ``prefixes[i]``.
    ``search`` sets the beam search (beam, alpha, length limits; constrained search finds one best hypothesis,
    so no n-best, sampling, MBR or reranking); sentences with neither terms nor prefix go through
    :meth:`Translator.translate` (batched) with ``options``, the others through constrained beam search
    (:class:`~transduce.decode.constraints.Constraints`), both with ``options``' ``target_lang``. Returns strings,
    or :class:`Translation` s with ``return_scores=True``; word alignments are not made (``alignments``: an error)."""
    loose = {k: options.pop(k) for k in LOOSE if k in options}
    search = SearchOptions.deprecated("translate_with_terms", search, loose).check(constrained=True)
    if options.get("alignments"):
        raise ValueError("constrained search (terminology) gives no word alignments: translate without terms")
    n = len(sentences)
    constraints = constraints or [[] for _ in range(n)]
    prefixes = prefixes or [None] * n
    if len(constraints) != n or len(prefixes) != n:
        raise ValueError(f"{n} sentences, {len(constraints)} constraint lists, {len(prefixes)} prefixes")
    terms = [list(c) + (glossary.terms(s) if glossary else []) for s, c in zip(sentences, constraints)]
    plain = [i for i in range(n) if not terms[i] and not prefixes[i]]
    plain_set = set(plain)
    scores = options.get("return_scores", False)
    out: list = [None] * n
    if plain:
        texts = [sentences[i] for i in plain]
        for i, r in zip(plain, translator.translate(texts, truncate=truncate, search=search, **options)):
            out[i] = r
    held = [i for i in range(n) if i not in plain_set]
    if not held:
        return out
    tgt = translator.vocabs.tgt
    continues = continues_word(tgt, translator.device)
    wanted_lang = options.get("target_lang")  # a multilingual model's: constrained sentences are encoded with it too
    every = translator.encode_sources(
        [s if i not in plain_set else "" for i, s in enumerate(sentences)], truncate, wanted_lang
    )
    sources = [every[i] for i in held]  # encoded in place, so a warning counts the caller's lines
    wanted = [
        Constraints([tgt.encode(term) for term in terms[i]], tgt.encode(prefixes[i]) if prefixes[i] else [], continues)
        for i in held
    ]
    eos = translator.config.eos_id
    batching = {k: options[k] for k in ("batch_tokens", "batch_size") if k in options}
    found = translator.search([s or [eos] for s in sources], search, constraints=wanted, **batching)
    for i, (hyp,) in zip(held, found):
        text = tgt.decode(hyp.tokens)
        out[i] = Translation(text, hyp.tokens, hyp.logprob, hyp.score) if scores else text
    return out
