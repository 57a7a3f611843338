"""Noisy-channel reranking (decode/rerank.py): the choice rule, teacher-forced scores that agree with
reference perplexity and do not depend on the batch, and the Translator / CLI / load paths."""

from __future__ import annotations

import io
import sys

import pytest
import torch
from conftest import read_corpus

from transduce.api import load
from transduce.cli import main
from transduce.decode.rerank import RerankConfig, choose, sequence_logprobs, sweep
from transduce.decode.search import Hypothesis
from transduce.decode.search_options import SearchOptions


def test_choose_golden_values():
    hyps = [Hypothesis([1], -2.0, -1.0), Hypothesis([2], -2.4, -1.2), Hypothesis([3], -3.0, -1.5)]
    assert choose(hyps, [-3.0, -1.0, -0.9], 0.0) == 0  # λ = 0: beam search's first
    assert choose(hyps, [-3.0, -1.0, -0.9], 1.0) == 1  # -4.0, -2.2, -2.4
    assert choose(hyps, [-3.0, -1.0, -0.9], 10.0) == 2  # -31, -11.2, -10.5
    assert choose(hyps[:2], [-1.0, -0.8], 1.0) == 0  # -2.0 against -2.0: the first of equals


@pytest.mark.parametrize(
    "kwargs, key",
    [({"candidates": 0}, "candidates"), ({"weight": -0.5}, "weight"), ({"weight": float("nan")}, "weight")],
)
def test_bad_settings_name_themselves(kwargs, key):
    with pytest.raises(ValueError, match=f"rerank {key}"):
        RerankConfig(**kwargs)


def test_sequence_logprobs_agree_with_reference_perplexity_and_not_with_the_batch(tiny_translator):
    t = tiny_translator
    src, refs = read_corpus("test", "en", 12), read_corpus("test", "fr", 12)
    pairs = [(s[:-1], g) for s, g in zip(t.encode_sources(src), t.vocabs.tgt.encode_batch(refs))]
    together = sequence_logprobs(t.model, pairs)
    nll, _ = t.reference_nll(src, refs)
    assert -sum(together) == pytest.approx(nll, rel=1e-5)
    alone = sequence_logprobs(t.model, pairs, batch_tokens=1)  # one pair per batch
    assert alone == pytest.approx(together, rel=1e-5) and all(lp < 0 for lp in alone)


@pytest.mark.slow
def test_reranking_chooses_from_the_beam_by_the_channel_score(tiny_model_dir):
    torch.set_num_threads(1)
    # the tiny en->de model stands in as its own "channel": the mechanics do not need a good one
    t = load(tiny_model_dir, channel=tiny_model_dir)
    sources = read_corpus("test", "en", 10)
    beam = t.translate(sources, search=SearchOptions(beam=4, max_len_b=10))
    assert t.translate(sources, search=SearchOptions(beam=4, max_len_b=10, rerank=RerankConfig(4, 0.0))) == beam
    nbest = t.translate(sources, search=SearchOptions(beam=4, max_len_b=10, nbest=4), return_scores=True)
    ids = t.encode_sources(sources)
    channel = t.channel_scores(ids, [[Hypothesis(h.tokens, h.logprob, h.score) for h in n] for n in nbest])
    for weight in (0.5, 50.0):  # this stand-in's channel scores differ by hundredths: only a large λ moves it
        expected = [n[choose(n, c, weight)].text for n, c in zip(nbest, channel)]
        got = t.translate(sources, search=SearchOptions(beam=4, max_len_b=10, rerank=RerankConfig(4, weight)))
        assert got == expected
        search = SearchOptions(beam=4, max_len_b=10, rerank=RerankConfig(4))
        assert sweep(t, sources, [0.0, weight], search) == {0.0: beam, weight: got}
    assert any(e != b for e, b in zip([n[choose(n, c, 50.0)].text for n, c in zip(nbest, channel)], beam))
    with pytest.raises(ValueError, match="rerank over 5 candidates needs a beam of at least that, got 4"):
        t.translate(sources, search=SearchOptions(beam=4, rerank=RerankConfig(5)))
    with pytest.raises(ValueError, match="needs a channel model"):
        load(tiny_model_dir).translate(sources, search=SearchOptions(beam=4, rerank=RerankConfig(4)))


def test_load_refuses_a_channel_model_with_other_vocabularies(tiny_model_dir, tmp_path):
    from transduce.data.vocab import Vocab, Vocabs
    from transduce.model import ModelConfig, Transformer
    from transduce.modeldir import save_model_dir

    vocab = Vocab.train(read_corpus("train", "fr", 300), 200)
    other = save_model_dir(
        tmp_path / "other",
        Transformer(ModelConfig.preset("tiny", vocab_size=len(vocab))),
        Vocabs(vocab, vocab),
        {"src_lang": "fr", "tgt_lang": "en"},
    )
    with pytest.raises(ValueError, match="channel model's vocabularies"):
        load(tiny_model_dir, channel=other)


def test_cli_rerank(tiny_model_dir, tmp_path, monkeypatch, capsys):
    src, ref = tmp_path / "in.en", tmp_path / "ref.fr"
    src.write_text("".join(s + "\n" for s in read_corpus("test", "en", 5)))
    ref.write_text("".join(s + "\n" for s in read_corpus("test", "fr", 5)))
    model = str(tiny_model_dir)
    argv = ["--beam", "4", "--rerank", "4", "--channel", model, "--rerank-weight", "0.5", "--max-len-b", "10"]
    assert main(["translate", "--model", model, *argv, str(src)]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 5
    assert main(["evaluate", "--model", model, "--src", str(src), "--ref", str(ref), *argv]) == 0
    assert "tok-lc BLEU" in capsys.readouterr().out
    for extra, message in (
        (["--rerank", "2"], "--rerank needs --channel"),
        (["--rerank", "5", "--channel", model], "needs a beam of at least that, got 4"),
        (["--rerank", "2", "--channel", model, "--nbest", "2"], "--rerank chooses one"),
        (["--rerank", "-1"], "--rerank must be 0"),
    ):
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"a dog\n")))
        code = main(["translate", "--model", model, "--beam", "4", *extra])
        assert code == 2 and message in capsys.readouterr().err
