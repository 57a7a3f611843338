"""Terminology: constrained beam search satisfies every term, glossaries, prefixes; `transduce score`."""

from __future__ import annotations

import re

import pytest

from transduce.cli import main
from transduce.decode.constraints import _State
from transduce.score import score
from transduce.text.terminology import Glossary, translate_with_terms

SENTENCES = [
    "A dog runs in the park.",
    "Two men are sitting on a bench.",
    "A woman is cooking.",
    "A little girl plays with a ball.",
]
TERMS = [["Park"], ["Katze"], ["rotes Auto", "Zeitung"], ["schnell rennt", "Bank"]]


def test_every_required_term_appears(tiny_translator):
    plain = tiny_translator.translate(SENTENCES)
    assert not any(term in out for terms, out in zip(TERMS, plain) for term in terms)  # the model alone: none
    out = translate_with_terms(tiny_translator, SENTENCES, TERMS)
    for terms, text in zip(TERMS, out):
        for term in terms:
            assert re.search(rf"(?<!\w){term}(?!\w)", text), (term, text)  # whole words: not "Katzeiten"


def test_prefix_is_forced_and_unconstrained_sentences_are_unchanged(tiny_translator):
    out = translate_with_terms(tiny_translator, SENTENCES, prefixes=["Die Frau", None, None, "Heute"])
    assert out[0].startswith("Die Frau") and out[3].startswith("Heute")
    assert out[1:3] == tiny_translator.translate(SENTENCES[1:3])


def test_glossary_applies_where_the_source_term_occurs(tiny_translator, tmp_path):
    path = tmp_path / "terms.tsv"
    path.write_text("# source\ttarget\ndog\tKatze\nbench\tSofa\n")
    glossary = Glossary.load(path)
    assert glossary.terms("A dog and a hotdog.") == ["Katze"] and glossary.terms("Dogs.") == []
    out = translate_with_terms(tiny_translator, SENTENCES, glossary=glossary)
    assert "Katze" in out[0] and "Sofa" in out[1] and out[2:] == tiny_translator.translate(SENTENCES[2:])


def test_bad_glossary_line_is_an_error_naming_file_and_line(tmp_path):
    path = tmp_path / "g.tsv"
    path.write_text("a\tb\nno tab here\n")
    with pytest.raises(ValueError, match=r"g\.tsv:2"):
        Glossary.load(path)


def test_constraint_state_tracks_progress_and_restarts():
    terms = [[5, 6, 7], [9]]
    s = _State((False, False))
    s = s.advance(5, terms).advance(6, terms)
    assert s.active == (0, 2) and s.bank(terms) == 2
    assert s.advance(8, terms).active is None  # left the term half-way: progress is lost
    s = s.advance(7, terms).advance(9, terms)
    assert s.done() and s.just_met


def test_constraints_cli(tiny_model_dir, tmp_path, capsys):
    path = tmp_path / "in.txt"
    path.write_text("A dog runs in the park.\tPark\tschnell\nA woman is cooking.\n")
    assert main(["translate", "--model", str(tiny_model_dir), "--constraints", str(path)]) == 0
    first, second = capsys.readouterr().out.splitlines()
    assert "Park" in first and "schnell" in first and second
    for other in (["--native"], ["--ensemble", str(tiny_model_dir)], ["--scores"]):  # the library does these
        assert main(["translate", "--model", str(tiny_model_dir), "--constraints", str(path), *other]) == 0
        out = capsys.readouterr().out.splitlines()
        assert out[-2:] == [first, second] or other == ["--scores"], (other, out)
        assert "Park" in out[0] and "schnell" in out[0]
    for other, message in (
        (["--nbest", "2"], "--nbest is not for constrained search"),
        (["--sample"], "--sample is not for constrained search"),
        (["--alignments"], "constrained search (terminology) gives no word alignments"),
    ):
        assert main(["translate", "--model", str(tiny_model_dir), "--constraints", *other, str(path)]) == 2
        assert message in capsys.readouterr().err


def test_score_matches_the_search_logprob(tiny_translator):
    hyps = tiny_translator.translate(SENTENCES, return_scores=True)
    got = score(tiny_translator, SENTENCES, [h.text for h in hyps])
    assert got == pytest.approx([h.logprob for h in hyps], abs=1e-3)
    per_token = score(tiny_translator, SENTENCES, [h.text for h in hyps], normalize=True)
    assert per_token == pytest.approx([h.logprob / (len(h.tokens) + 1) for h in hyps], abs=1e-3)
    worse = score(tiny_translator, SENTENCES, ["Zeitung Zeitung Zeitung."] * 4)
    assert all(w < g for w, g in zip(worse, got))


def test_score_cli(tiny_model_dir, tmp_path, capsys):
    src, tgt = tmp_path / "s.en", tmp_path / "t.de"
    src.write_text("A dog.\nA cat.\n")
    tgt.write_text("Ein Hund.\nEine Katze.\n")
    assert main(["score", "--model", str(tiny_model_dir), "--source", str(src), "--target", str(tgt)]) == 0
    values = [float(v) for v in capsys.readouterr().out.split()]
    assert len(values) == 2 and all(v < 0 for v in values)
    tgt.write_text("Ein Hund.\n")
    assert main(["score", "--model", str(tiny_model_dir), "--source", str(src), "--target", str(tgt)]) == 2
    assert "2 lines" in capsys.readouterr().err
