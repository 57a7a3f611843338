"""The one door to search: SearchOptions checked when made, search() giving what each algorithm gives."""

from __future__ import annotations

import pytest
import torch
from conftest import read_corpus

from transduce.decode.constraints import Constraints, constrained_search
from transduce.decode.search import beam_search, greedy, search
from transduce.decode.search_options import SampleConfig, SearchOptions
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


def test_translate_takes_the_options_whole_or_one_by_one(tiny_translator, sources):
    whole = tiny_translator.translate(sources, search=SearchOptions(beam=3, nbest=2), return_scores=True)
    loose = tiny_translator.translate(sources, beam=3, nbest=2, return_scores=True)
    assert [[(t.tokens, t.score) for t in n] for n in whole] == [[(t.tokens, t.score) for t in n] for n in loose]
    with pytest.raises(ValueError, match="not both"):
        tiny_translator.translate(sources, beam=3, search=SearchOptions())


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
