"""Minimum Bayes-risk selection (decode/mbr.py): golden expected utilities, the choice moving with the
weights, and the Translator / CLI paths."""

from __future__ import annotations

import io
import sys

import pytest
from conftest import read_corpus

from transduce.cli import main
from transduce.decode.mbr import MBRConfig, choose, expected_utilities
from transduce.decode.search_options import SearchOptions


def test_expected_utilities_golden_values():
    # two identical candidates and one sharing no word with them: sentence BLEU is 100 or 0
    texts = ["a dog runs on grass", "a dog runs on grass", "zebras sleep quietly at noon"]
    uniform = expected_utilities(texts, [0.0, 0.0, 0.0], MBRConfig(3, "bleu", "uniform"))
    assert uniform == pytest.approx([2 / 3, 2 / 3, 1 / 3])
    # model weights: p ∝ exp(logprob), renormalised over the list; logprobs far below 0 do not underflow
    model = expected_utilities(texts, [-1000.0, -1000.0 - 2.0, -1000.0], MBRConfig(3, "bleu", "model"))
    z = 1 + 2 * 2.718281828459045**2
    w = [2.718281828459045**2 / z, 1 / z, 2.718281828459045**2 / z]
    assert model == pytest.approx([w[0] + w[1], w[0] + w[1], w[2]])


def test_the_consensus_wins_unless_the_model_is_sure_of_the_outlier():
    # beam n-best lists hold equal texts (other segmentations of the same words)
    texts = ["zebras sleep quietly at noon", "a dog runs on grass", "a dog runs on grass"]
    assert choose(texts, [-1.0, -1.5, -1.6], MBRConfig(3, "bleu", "model")) == 1
    assert choose(texts, [-0.01, -6.0, -6.0], MBRConfig(3, "bleu", "model")) == 0
    assert choose(texts, [-0.01, -6.0, -6.0], MBRConfig(3, "chrf", "uniform")) == 1
    assert choose(texts[:1], [-3.0], MBRConfig(1)) == 0
    assert choose(["b c", "b c"], [-1.0, -1.0], MBRConfig(2, "bleu", "uniform")) == 0  # the first of equals


@pytest.mark.parametrize(
    "kwargs, key",
    [({"candidates": 0}, "candidates"), ({"utility": "ter"}, "utility"), ({"weights": "softmax"}, "weights")],
)
def test_bad_settings_name_themselves(kwargs, key):
    with pytest.raises(ValueError, match=f"MBR {key}"):
        MBRConfig(**kwargs)


@pytest.mark.slow
def test_translator_picks_from_the_beam(tiny_translator):
    sources = read_corpus("test", "en", 8)
    beam = tiny_translator.translate(sources, search=SearchOptions(beam=4, max_len_b=10))
    assert tiny_translator.translate(sources, search=SearchOptions(beam=4, max_len_b=10, mbr=MBRConfig(1))) == beam
    nbest = tiny_translator.translate(sources, search=SearchOptions(beam=4, max_len_b=10, nbest=4))
    mbr = tiny_translator.translate(
        sources, search=SearchOptions(beam=4, max_len_b=10, mbr=MBRConfig(4, "bleu", "uniform"))
    )
    assert len(mbr) == len(sources) and all(m in n for m, n in zip(mbr, nbest))
    expected = [n[choose(n, [0.0] * len(n), MBRConfig(4, "bleu", "uniform"))] for n in nbest]
    assert mbr == expected
    with pytest.raises(ValueError, match="mbr over 5 candidates needs a beam of at least that, got 4"):
        tiny_translator.translate(sources, search=SearchOptions(beam=4, mbr=MBRConfig(5)))


def test_cli_mbr(tiny_model_dir, tmp_path, monkeypatch, capsys):
    src = tmp_path / "in.en"
    src.write_text("".join(s + "\n" for s in read_corpus("test", "en", 5)))
    assert (
        main(["translate", "--model", str(tiny_model_dir), "--beam", "4", "--mbr", "4", "--max-len-b", "10", str(src)])
        == 0
    )
    assert len(capsys.readouterr().out.splitlines()) == 5
    for argv, message in (
        (["--mbr", "5"], "needs a beam of at least that, got 4"),
        (["--mbr", "2", "--nbest", "2"], "--mbr chooses one translation"),
        (["--mbr", "-1"], "--mbr must be 0"),
    ):
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"a dog\n")))
        code = main(["translate", "--model", str(tiny_model_dir), "--beam", "4", *argv])
        assert code == 2 and message in capsys.readouterr().err
