"""Scores equal sacreBLEU's own on the same strings; the evaluate command end to end."""

from __future__ import annotations

import json
import math

import pytest
import sacrebleu
from conftest import read_corpus
from sacremoses import MosesTokenizer

from transduce.api import load
from transduce.cli import main
from transduce.decode.search_options import SearchOptions
from transduce.evaluate import evaluate_model, score_translations

HYPS = ["ein Hund läuft über die Wiese.", "Zwei Männer, die Fußball spielen!", "Eine Frau (in Rot) singt."]
REFS = ["Ein brauner Hund rennt über die Wiese.", "Zwei Männer spielen Fußball.", "Eine Frau in Rot singt."]


def test_scores_equal_sacrebleu():
    got = score_translations(HYPS, REFS, "de")
    assert got["bleu"] == round(sacrebleu.corpus_bleu(HYPS, [REFS]).score, 2)
    assert got["chrf"] == round(sacrebleu.corpus_chrf(HYPS, [REFS]).score, 2)
    assert got["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    tok = MosesTokenizer(lang="de")
    lower = [tok.tokenize(s, escape=False, return_str=True).lower() for s in HYPS]
    lower_refs = [tok.tokenize(s, escape=False, return_str=True).lower() for s in REFS]
    assert lower[2] == "eine frau ( in rot ) singt ."
    expected = sacrebleu.corpus_bleu(lower, [lower_refs], tokenize="none", force=True).score
    assert got["tok_lc_bleu"] == round(expected, 2)
    assert got["tok_lc_bleu"] != got["bleu"]  # they are different measures


def test_identical_is_100_and_length_mismatch_is_an_error():
    assert score_translations(REFS, REFS, "de")["bleu"] == 100.0
    with pytest.raises(ValueError, match="2 hypotheses but 3 references"):
        score_translations(HYPS[:2], REFS, "de")


def test_cli_hyp_ref_json(tmp_path, capsys):
    hyp, ref = tmp_path / "hyp.de", tmp_path / "ref.de"
    hyp.write_text("\n".join(HYPS) + "\n", encoding="utf-8")
    ref.write_text("\n".join(REFS) + "\n", encoding="utf-8")
    assert main(["evaluate", "--hyp", str(hyp), "--ref", str(ref), "--lang", "de", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data == score_translations(HYPS, REFS, "de")
    assert main(["evaluate", "--hyp", str(hyp), "--ref", str(ref), "--lang", "de"]) == 0
    out = capsys.readouterr().out
    assert "sacreBLEU" in out and "nrefs:1|case:mixed" in out and "tok-lc BLEU" in out
    ref.write_text("\n".join(REFS[:2]) + "\n", encoding="utf-8")
    assert main(["evaluate", "--hyp", str(hyp), "--ref", str(ref), "--lang", "de"]) == 2
    assert "has 3 lines but" in capsys.readouterr().err


@pytest.mark.slow
def test_model_evaluation_and_perplexity(tiny_model_dir, tmp_path, capsys):
    src = read_corpus("test", "en", 30)
    ref = read_corpus("test", "fr", 30)
    translator = load(tiny_model_dir)
    result = evaluate_model(translator, src, ref, search=SearchOptions(beam=2))
    assert result["hypotheses"] == translator.translate(src, search=SearchOptions(beam=2))
    assert result == {**score_translations(result["hypotheses"], ref, "fr"), **result}
    nll, count = translator.reference_nll(src, ref)
    assert result["ref_perplexity"] == round(math.exp(nll / count), 3)
    assert 1.0 < result["ref_perplexity"] < len(translator.vocabs.tgt)  # better than uniform
    (tmp_path / "s.en").write_text("\n".join(src) + "\n", encoding="utf-8")
    (tmp_path / "r.fr").write_text("\n".join(ref) + "\n", encoding="utf-8")
    assert (
        main(
            [
                "evaluate",
                "--model",
                str(tiny_model_dir),
                "--src",
                str(tmp_path / "s.en"),
                "--ref",
                str(tmp_path / "r.fr"),
                "--beam",
                "2",
                "--json",
            ]
        )
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert data["bleu"] == result["bleu"] and data["ref_perplexity"] == result["ref_perplexity"]


def test_paper_bleu_splits_compounds_as_get_ende_bleu():
    from transduce.evaluate import compound_split

    assert compound_split(['Die EU-Kommission traf sich im Bund-Länder-Ausschuss "heute".', "x-y-z"], "de") == [
        "Die EU ##AT##-##AT## Kommission traf sich im Bund ##AT##-##AT## Länder ##AT##-##AT## Ausschuss "
        "&quot; heute &quot; .",
        "x ##AT##-##AT## y-z",
    ]  # perl's s{(\S)-(\S)}{...}g does not rescan "y"
    hyps, refs = ["Die Kommission tagte heute in Berlin ."], ["Die EU-Kommission tagte heute in Berlin ."]
    got = score_translations(hyps, refs, "de")
    split = ["Die EU ##AT##-##AT## Kommission tagte heute in Berlin ."]
    assert got["tok_bleu_compound"] == round(
        sacrebleu.corpus_bleu(compound_split(hyps, "de"), [split], tokenize="none", force=True).score, 2
    )
    whole = sacrebleu.corpus_bleu(hyps, [refs], tokenize="none", force=True)
    assert whole.precisions[0] < 100 and " 100.0/" in got["tok_bleu_compound_detail"]  # "Kommission" now matches
