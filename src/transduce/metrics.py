"""Corpus scores of translations against references: sacreBLEU, chrF, tokenised lowercased BLEU (Multi30k's
figure) and tokenised BLEU with compounds split (the paper's WMT14 figure). ``transduce evaluate`` reports
them; the backend measurements (:mod:`transduce.backends.measure`) and the recipe use them too.
"""

from __future__ import annotations

import re

import sacrebleu
from sacremoses import MosesTokenizer


def moses_lower(lines: list[str], lang: str) -> list[str]:
    """Moses-tokenise (no escaping) and lowercase, as Multi30k papers do before multi-bleu."""
    tok = MosesTokenizer(lang=lang)
    return [tok.tokenize(line, escape=False, return_str=True).lower() for line in lines]


COMPOUND = re.compile(r"(\S)-(\S)")


def compound_split(lines: list[str], lang: str) -> list[str]:
    """Moses-tokenise (with escaping) and split compounds as ``get_ende_bleu.sh``: ``a-b`` -> ``a ##AT##-##AT## b``."""
    tok = MosesTokenizer(lang=lang)
    return [COMPOUND.sub(r"\1 ##AT##-##AT## \2", tok.tokenize(line, return_str=True)) for line in lines]


def score_translations(hyps: list[str], refs: list[str], lang: str) -> dict:
    """Corpus scores of ``hyps`` against one reference each; ``lang`` is the target language
    (for the Moses tokeniser). Returns a JSON-ready dict."""
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} references")
    bleu = sacrebleu.metrics.BLEU()
    chrf = sacrebleu.metrics.CHRF()
    tok_bleu = sacrebleu.metrics.BLEU(tokenize="none", force=True)
    b = bleu.corpus_score(hyps, [refs])
    c = chrf.corpus_score(hyps, [refs])
    t = tok_bleu.corpus_score(moses_lower(hyps, lang), [moses_lower(refs, lang)])
    split = tok_bleu.corpus_score(compound_split(hyps, lang), [compound_split(refs, lang)])
    return {
        "sentences": len(hyps),
        "bleu": round(b.score, 2),
        "bleu_signature": str(bleu.get_signature()),
        "bleu_detail": str(b),
        "chrf": round(c.score, 2),
        "chrf_signature": str(chrf.get_signature()),
        "tok_lc_bleu": round(t.score, 2),
        "tok_lc_bleu_detail": str(t),
        "tok_lc_bleu_note": f"sacremoses-tokenised ({lang}), lowercased BLEU-4 (Multi30k papers' figure)",
        "tok_bleu_compound": round(split.score, 2),
        "tok_bleu_compound_detail": str(split),
        "tok_bleu_compound_note": f"sacremoses-tokenised ({lang}), cased, compounds split (##AT##-##AT##), "
        "BLEU-4: the paper's WMT14 figure (tensor2tensor get_ende_bleu.sh)",
    }
