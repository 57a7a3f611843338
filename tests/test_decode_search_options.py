"""The one door to search: SearchOptions checked when made, search() giving what each algorithm gives."""

from __future__ import annotations

import argparse

import pytest
import torch
from conftest import read_corpus

from transduce.decode.constraints import Constraints, constrained_search
from transduce.decode.search import beam_search, greedy, search
from transduce.decode.search_options import (
    PAPER,
    BadSearch,
    MBRConfig,
    RerankConfig,
    SampleConfig,
    SearchOptions,
    add_search_arguments,
)
from transduce.decode.step import DecoderStep, pytorch_model


@pytest.fixture(scope="module")
def sources():
    return read_corpus("test", "en", 12)


def _src(translator, lines):
    return translator.tensor(translator.encode_sources(lines))


@pytest.mark.parametrize(
    "fields, field",
    [
        ({"beam": 0}, "beam"),
        ({"beam": 2, "nbest": 3}, "nbest"),
        ({"nbest": 0}, "nbest"),
        ({"nbest": 2, "beam": 4, "sample": SampleConfig()}, "nbest"),
    ],
)
def test_a_bad_setting_is_an_error_naming_its_field(fields, field):
    with pytest.raises(ValueError, match=field):
        SearchOptions(**fields)


def test_options_are_frozen_and_loose_keywords_build_them():
    options = SearchOptions(beam=5)
    with pytest.raises(AttributeError):
        options.beam = 4
    assert SearchOptions.of(beam=5, alpha=None) == options
    assert SearchOptions.of(options) is options
    with pytest.raises(ValueError, match="beam"):
        SearchOptions.of(options, beam=4)  # both ways at once
    with pytest.raises(TypeError, match="bogus"):
        SearchOptions.of(bogus=1)


@pytest.mark.slow
def test_the_door_gives_what_each_search_gives(tiny_translator, sources):
    model, src = tiny_translator.model, _src(tiny_translator, sources[:8])
    options = SearchOptions(beam=4, alpha=0.6, max_len_b=12, nbest=2)
    assert search(model, src, options) == beam_search(model, src, 4, 0.6, 1.0, 12, 2)
    one = SearchOptions(beam=1, alpha=0.0)
    assert search(model, src, one) == [[h] for h in greedy(model, src, 0.0)]
    sample = SearchOptions(sample=SampleConfig(temperature=1.3, seed=4))
    seeds = list(range(4, 12))
    assert search(model, src, sample, seeds) == [
        [h] for h in greedy(model, src, 0.6, sample=sample.sample, seeds=seeds)
    ]


def test_translate_takes_the_options_whole_and_one_by_one_with_a_warning(tiny_translator, sources):
    whole = tiny_translator.translate(sources, SearchOptions(beam=3, nbest=2), return_scores=True)
    with pytest.warns(DeprecationWarning, match=r"Translator.translate\(beam=, nbest=\) is deprecated"):
        loose = tiny_translator.translate(sources, beam=3, nbest=2, return_scores=True)
    assert [[(t.tokens, t.score) for t in n] for n in whole] == [[(t.tokens, t.score) for t in n] for n in loose]
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="not both"):
        tiny_translator.translate(sources, beam=3, search=SearchOptions())
    with pytest.raises(TypeError, match="bogus"):
        tiny_translator.translate(sources, bogus=1)
    with pytest.raises(TypeError, match="SearchOptions"):
        tiny_translator.translate(sources, 4)  # the beam where the search goes


def test_constrained_search_through_the_door(tiny_translator, sources):
    tr = tiny_translator
    term = tr.vocabs.tgt.encode("chien")
    src = _src(tr, sources[:1])
    grad = []

    class Watch:  # a DecoderStep that records whether autograd was on at each step
        config = tr.model.config

        def encode(self, src):
            return tr.model.encode(src)

        def init_cache(self, encoded, beam=1):
            return tr.model.init_cache(encoded, beam)

        def decode_step(self, tokens, cache):
            grad.append(torch.is_grad_enabled())
            return tr.model.decode_step(tokens, cache)

    watch = Watch()
    assert isinstance(watch, DecoderStep) and pytorch_model(watch) is watch
    options = SearchOptions(beam=4)
    ((hyp,),) = search(watch, src, options, constraints=[Constraints([term])])
    assert hyp == constrained_search(tr.model, src, Constraints([term]), options)
    text = tr.vocabs.tgt.decode(hyp.tokens)
    assert "chien" in text
    assert grad and not any(grad)  # no autograd graph is built while searching


@pytest.mark.parametrize(
    "fields, key",
    [
        ({"mbr": MBRConfig(2), "nbest": 2}, "mbr"),
        ({"rerank": RerankConfig(2), "sample": SampleConfig()}, "rerank"),
        ({"mbr": MBRConfig(2), "rerank": RerankConfig(2)}, "rerank"),
        ({"mbr": MBRConfig(5)}, "mbr"),
        ({"rerank": RerankConfig(5), "beam": 4}, "rerank"),
    ],
)
def test_the_mode_rules_name_the_offending_key(fields, key):
    with pytest.raises(BadSearch) as e:
        SearchOptions(**fields)
    assert e.value.key == key and str(e.value).startswith(f"{key} ")


def test_one_translation_per_sentence_and_constrained_search_are_rules_of_the_options():
    options = SearchOptions(beam=4, nbest=2)
    with pytest.raises(BadSearch, match="nbest must be 1: a document gets one translation per sentence, got 2"):
        options.check(one="a document")
    assert SearchOptions().check(one="a document", constrained=True) == SearchOptions()
    for fields, key in (
        ({"nbest": 2}, "nbest"),
        ({"sample": SampleConfig()}, "sample"),
        ({"mbr": MBRConfig(2)}, "mbr"),
    ):
        with pytest.raises(BadSearch, match=f"^{key} is not for constrained search"):
            SearchOptions(**fields).check(constrained=True)
    chooser = SearchOptions(beam=5, mbr=MBRConfig(3))
    assert chooser.searched == SearchOptions(beam=5, nbest=3) and SearchOptions().searched == SearchOptions()


def test_one_set_of_command_line_options_with_the_papers_defaults():
    parser = argparse.ArgumentParser()
    add_search_arguments(parser)
    assert SearchOptions.from_args(parser.parse_args([])) == SearchOptions() == PAPER
    args = parser.parse_args("--beam 5 --alpha 1 --max-len-b 9 --mbr 3 --mbr-utility chrf".split())
    assert SearchOptions.from_args(args) == SearchOptions(5, 1.0, 1.0, 9, mbr=MBRConfig(3, "chrf"))
    sampled = SearchOptions.from_args(parser.parse_args("--sample --top-k 5 --seed 3".split()))
    assert sampled.sample == SampleConfig(top_k=5, seed=3)
    for argv, message in (
        ("--nbest 5 --beam 2", "--nbest must be between 1 and the beam size 2, got 5"),
        ("--mbr 2 --nbest 2", "--mbr chooses one translation from the beam"),
        ("--rerank 2", "--rerank needs --channel"),
        ("--max-len-b 5 --beam 0", "--beam must be at least 1, got 0"),
    ):
        with pytest.raises(ValueError, match=message):
            SearchOptions.from_args(parser.parse_args(argv.split()))
    few = argparse.ArgumentParser()
    add_search_arguments(few, modes=(), lengths=False)
    assert vars(few.parse_args([])) == {"beam": 4, "alpha": 0.6}
    assert SearchOptions.from_args(few.parse_args(["--beam", "2"])) == SearchOptions(beam=2)


def test_a_request_asks_within_the_servers_limits():
    server = SearchOptions(beam=5, alpha=1.5)
    assert SearchOptions.from_request({}, server, max_beam=8) == server
    assert SearchOptions.from_request({"beam": "2", "nbest": 2}, server, 8) == server.replace(beam=2, nbest=2)
    assert SearchOptions.from_request({"alternatives": "6"}, server, 8) == server.replace(beam=7, nbest=7)
    for fields, message in (
        ({"beam": 9}, "beam must be between 1 and 8, got 9"),
        ({"beam": "wide"}, "beam must be an integer, got 'wide'"),
        ({"beam": 2, "nbest": 3}, "nbest must be between 1 and beam=2, got 3"),
        ({"alpha": -1.0}, "alpha must be between 0 and 10, got -1.0"),
        ({"alternatives": 8}, "alternatives must be between 0 and 7, got 8"),
    ):
        with pytest.raises(BadSearch) as e:
            SearchOptions.from_request(fields, server, 8)
        assert str(e.value) == message and e.value.key == message.split()[0]
