"""The C++ decoder step: with ATen's maps the Python step's outputs bit for bit, as the loop step (int8, fp32)
within its arithmetic's rounding; and it steps aside where it cannot run."""

from __future__ import annotations

import shutil
import warnings

import pytest
import torch
from conftest import read_corpus

from transduce import cpp
from transduce.api import load
from transduce.backends import native
from transduce.backends.policy import decoder_for
from transduce.decode.hypothesis import max_lengths
from transduce.decode.search import beam_search, greedy
from transduce.fastpaths import Choice
from transduce.model import ModelConfig, Transformer
from transduce.model.cache import DecoderCache, LayerCache

pytestmark = pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler to build the extension")


def _random_model(**overrides) -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig.preset("tiny", vocab_size=60, dropout=0.0, **overrides)
    model = Transformer(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():  # far from initialisation: sharp, varied distributions
            p.normal_(0.0, 0.3)
    return model


def _sources() -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, 60, (6, 9), generator=g)
    src[:, -1] = 3
    src[2, 4], src[2, 5:] = 3, 0  # one short sentence, right-padded
    return src


@pytest.mark.slow
@pytest.mark.parametrize(
    "overrides",
    [
        dict(),
        dict(norm="pre"),
        dict(positions="learned", tie_embeddings="none"),
        dict(attention="dot"),
        dict(activation="gelu"),
        dict(activation="swish", output_bias=True),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_step_equals_python_step(overrides, dtype):
    model = _random_model(**overrides).to(dtype)
    fast = native.native_step(model, "aten")
    assert fast is not None
    src = _sources()
    for beam in (1, 4, 5):
        want = beam_search(model, src, beam=beam, nbest=beam)
        got = beam_search(fast, src, beam=beam, nbest=beam)
        assert [[(h.tokens, h.logprob, h.score) for h in hs] for hs in got] == [
            [(h.tokens, h.logprob, h.score) for h in hs] for hs in want
        ], beam
    assert [(h.tokens, h.logprob) for h in greedy(fast, src)] == [(h.tokens, h.logprob) for h in greedy(model, src)]


def test_native_step_logits_and_cache(tiny_model_dir):
    """One step at a time on a trained model: the same logits and the same grown cache."""
    model = load(tiny_model_dir, backend="fp32").model
    fast = native.native_step(model, "aten")
    src = torch.tensor([[5, 6, 7, 8, 3, 0, 0, 0], [9, 10, 11, 12, 13, 14, 15, 3]])
    ref_cache, cache = (model.init_cache(model.encode(src), 2) for _ in range(2))
    tokens = torch.tensor([2, 2, 2, 2])
    for _ in range(4):
        want, got = model.decode_step(tokens, ref_cache), fast.decode_step(tokens, cache)
        assert torch.equal(got, want)
        assert cache.position == ref_cache.position
        for a, b in zip(cache.layers, ref_cache.layers):
            assert torch.equal(a.self_k, b.self_k) and torch.equal(a.self_v, b.self_v)
        tokens = want.argmax(-1)


def test_deferred_reorders_compose(tiny_model_dir):
    """Two reorders before a step (the C++ cache defers them) give the plain cache's logits and keys."""
    model = load(tiny_model_dir, backend="fp32").model
    fast = native.native_step(model, "aten")
    src = torch.tensor([[5, 6, 7, 8, 3, 0, 0, 0], [9, 10, 11, 12, 13, 14, 15, 3]])
    ref_cache, cache = model.init_cache(model.encode(src), 2), fast.init_cache(fast.encode(src), 2)
    tokens = torch.tensor([4, 5, 6, 7])  # a different token per row, so every row's cache differs
    for rows in ([1, 0, 3, 2], [0, 0, 2, 3]):
        assert torch.equal(fast.decode_step(tokens, cache), model.decode_step(tokens, ref_cache))
        for c in (cache, ref_cache):
            c.reorder(torch.tensor(rows))
            c.reorder(torch.tensor([1, 0, 2, 2]))
    assert torch.equal(fast.decode_step(tokens, cache), model.decode_step(tokens, ref_cache))
    assert cache.pending is None
    for a, b in zip(cache.layers, ref_cache.layers):
        assert torch.equal(a.self_k, b.self_k) and torch.equal(a.self_v, b.self_v)


@pytest.mark.slow
def test_translator_native_flag_same_output(tiny_model_dir):
    """--native is the fp32 loop step: fp32 with its own summation order, so the same translations and their
    scores within rounding."""
    lines = read_corpus("test", "en", 24)
    plain, fast = load(tiny_model_dir), load(tiny_model_dir, native=True)
    assert isinstance(fast.model, native.NativeStep) and fast.model.maps == "fp32"
    run = lambda t: t.translate(lines, batch_size=5, return_scores=True)
    ours, ref = run(fast), run(plain)
    assert [x.tokens for x in ours] == [x.tokens for x in ref]
    assert max(abs(a.score - b.score) for a, b in zip(ours, ref)) < 1e-4


def test_cli_native_flag(tiny_model_dir, tmp_path, capsys):
    from transduce.cli import main

    src = tmp_path / "in.en"
    src.write_text("\n".join(read_corpus("test", "en", 6)) + "\n", encoding="utf-8")
    outputs = []
    for extra in ([], ["--native"]):
        assert main(["translate", "--model", str(tiny_model_dir), "--beam", "4", *extra, str(src)]) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[1] == outputs[0] and outputs[0].count("\n") == 6


@pytest.mark.parametrize(
    "overrides, reason",
    [
        (dict(attention="additive"), "additive"),
        (dict(attention_window=3), "attention_window"),
        (dict(d_k=4), "narrower than values"),
    ],
)
def test_unsupported_configs_are_named(overrides, reason):
    model = _random_model(**overrides)
    assert reason in native.supports(model)
    assert native.native_step(model) is None


def test_quantised_models_and_recording_are_not_covered(tiny_model_dir):
    assert "quantis" in native.supports(load(tiny_model_dir, dtype="int8").model)
    model = load(tiny_model_dir, backend="fp32").model
    model.decoder.layers[0].cross_attn.record = []
    assert "recorded" in native.supports(model)
    assert native.native_step(model) is None
    with pytest.warns(RuntimeWarning, match="recorded"):  # asked for, not available: the user is told why
        decoder, ran = decoder_for(model, Choice("int8-native", "asked for"), torch.device("cpu"))
    assert decoder is not None and ran.name == "int8" and "recorded" in ran.why
    with pytest.raises(ValueError, match="fp32"):
        native.native_step(load(tiny_model_dir, dtype="bf16").model, "int8")


def _step_log_probs(decoder, src: torch.Tensor, steps: int, feed=None) -> list[torch.Tensor]:
    """Log-probabilities (B, V) of ``steps`` steps, fed ``feed[t]`` after step t (default: the argmax)."""
    cache = decoder.init_cache(decoder.encode(src), 1)
    tokens, out = torch.full((src.size(0),), 2), []
    for t in range(steps):
        out.append(torch.log_softmax(decoder.decode_step(tokens, cache), -1))
        tokens = out[-1].argmax(-1) if feed is None else feed[t]
    return out


def test_int8_step_approximates_fp32_as_closely_as_python_int8(tiny_model_dir):
    """The int8 C++ step is int8 arithmetic (not fp32) and no further from fp32 than ``--dtype int8``."""
    model = load(tiny_model_dir, backend="fp32").model
    fast = native.native_step(model, "int8")
    assert fast.maps == "int8"
    src = torch.tensor(
        [
            [5, 6, 7, 8, 3, 0, 0, 0],
            [9, 10, 11, 12, 13, 14, 15, 3],
            [20, 21, 22, 3, 0, 0, 0, 0],
            [30, 31, 32, 33, 34, 35, 3, 0],
        ]
    )
    steps = 10  # 40 positions: the near-tie count depends on the CPU the tiny model trained on
    ref = _step_log_probs(model, src, steps)
    feed = [lp.argmax(-1) for lp in ref]  # every decoder is fed fp32's greedy tokens
    ours = _step_log_probs(fast, src, steps, feed)
    python_int8 = _step_log_probs(load(tiny_model_dir, dtype="int8").model, src, steps, feed)
    ours_err = max((a - b).abs().max().item() for a, b in zip(ours, ref))
    python_err = max((a - b).abs().max().item() for a, b in zip(python_int8, ref))
    assert 0 < ours_err <= max(python_err, 0.05), (ours_err, python_err)
    fp32_caches = [model.init_cache(model.encode(src), 1) for _ in range(2)]  # the step alone is int8
    bos = torch.full((src.size(0),), 2)
    assert not torch.equal(fast.decode_step(bos, fp32_caches[0]), model.decode_step(bos, fp32_caches[1]))
    # Greedy agreement with fp32 where fp32's choice is clear: a near-tie (top-2 margin within twice the
    # error both are allowed) may go either way for either int8 path, as the weights' last bits decide.
    bound = 2 * max(ours_err, python_err)
    clear = [lp.topk(2, dim=-1).values.diff(dim=-1).abs().squeeze(-1) > bound for lp in ref]  # (B,) per step
    assert sum(int(c.sum()) for c in clear) >= 10  # of 40 (24 on an AMD EPYC): the check is not vacuous
    agree = lambda lps: sum(a.argmax(-1).eq(b.argmax(-1))[c].sum().item() for a, b, c in zip(lps, ref, clear))
    assert agree(ours) >= agree(python_int8), (agree(ours), agree(python_int8))


@pytest.mark.parametrize("activation", ["gelu", "swish"])
def test_int8_step_follows_the_models_activation(activation):
    """A GELU or Swish model's int8 step (encoder and decoder loops) tracks its fp32 model, not fp32 ReLU over the
    same weights."""
    model = _random_model(activation=activation)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.3)  # a well-conditioned stack, as test_int8_encoder_approximates_fp32
    relu = Transformer(ModelConfig(**{**model.config.to_dict(), "activation": "relu"})).eval()
    relu.load_state_dict(model.state_dict())
    src = _sources()
    ref = _step_log_probs(model, src, 6)
    feed = [lp.argmax(-1) for lp in ref]
    ours = _step_log_probs(native.native_step(model, "int8"), src, 6, feed)
    other = _step_log_probs(relu, src, 6, feed)
    err = max((a - b).abs().max().item() for a, b in zip(ours, ref))
    apart = max((a - b).abs().max().item() for a, b in zip(other, ref))
    assert 0 < err < apart / 4, (err, apart)


@pytest.mark.slow
def test_translator_int8_native(tiny_model_dir):
    lines = read_corpus("test", "en", 24)
    fast = load(tiny_model_dir, dtype="int8", native=True)
    assert isinstance(fast.model, native.NativeStep) and fast.model.maps == "int8"
    fp32 = load(tiny_model_dir).translate(lines)
    same = sum(a == b for a, b in zip(fast.translate(lines, batch_size=5), fp32))
    python_same = sum(a == b for a, b in zip(load(tiny_model_dir, dtype="int8").translate(lines), fp32))
    assert same >= min(python_same, 18), (same, python_same)


def test_build_failure_falls_back_with_a_warning(monkeypatch):
    from torch.utils import cpp_extension

    def broken(**kwargs):
        raise OSError("no compiler here")

    monkeypatch.setattr(cpp_extension, "load", broken)
    monkeypatch.setattr(cpp, "load_built", lambda *_: None)  # no build made before (a fresh machine)
    native.extension.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="no compiler here"):
            assert native.native_step(_random_model()) is None
    finally:
        monkeypatch.undo()
        native.extension.cache_clear()
    with warnings.catch_warnings():  # and with a compiler it builds (or loads) without a word
        warnings.simplefilter("error")
        assert native.extension() is not None


@pytest.mark.parametrize("shape", [(1, 5, 3), (3, 130, 17), (4, 128, 384), (37, 64, 100)])
def test_int8_gemm_kernel_equals_portable_loop_and_approximates_fp32(shape):
    """int8_gemm.h: the AVX-512 VNNI kernel or the AVX2 kernel (whichever the CPU has) and the portable loop
    return the same floats (exact int32 sums, same epilogue), within int8 rounding of fp32; odd sizes hit
    every tail."""
    ext = native.extension()
    if torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"):  # a SIMD kernel is compiled in
        assert ext.has_vnni() or ext.has_avx2_kernel()
    M, K, N = shape
    g = torch.Generator().manual_seed(2)
    x, w, b = torch.randn(M, K, generator=g), torch.randn(N, K, generator=g) * 0.1, torch.randn(N, generator=g)
    fast, portable = ext.int8_linear(x, w, b, False), ext.int8_linear(x, w, b, True)
    assert torch.equal(fast, portable)
    ref = x @ w.t() + b
    assert 0 < (fast - ref).abs().max() <= 0.02 * ref.abs().max()
    # each row is quantised on its own: a row's output does not depend on the other rows
    assert torch.equal(ext.int8_linear(x[-1:], w, b, False), fast[-1:])
    assert torch.allclose(ext.int8_linear(x, w, None, False), fast - b, atol=1e-4, rtol=0)  # no bias: zeros


def test_int8_candidates_match_aten_candidates():
    """The int8 step's loop version of beam_candidates selects the same rows and tokens, forced rows
    included, with log-probabilities equal to rounding."""
    ext = native.extension()
    g = torch.Generator().manual_seed(3)
    slots, rows, V, k2 = 3, 4, 300, 8
    logits = torch.randn(slots * rows, V, generator=g) * 4
    scores = -torch.rand(slots, rows, generator=g) * 5
    for forced in (torch.empty(0, dtype=torch.long), torch.tensor([1, 6, 7])):
        ours = ext.beam_candidates_fast(logits, scores, forced, k2, k2, 2)
        ref = ext.beam_candidates(logits, scores, forced, k2, k2, 2, 64)
        assert torch.equal(ours[1], ref[1]) and torch.equal(ours[2], ref[2])
        assert torch.allclose(ours[0], ref[0], atol=1e-5, rtol=0)
        if forced.numel():  # a forced row offers eos alone
            picked = ours[1] * 1 + torch.arange(slots)[:, None] * rows
            assert (ours[2][torch.isin(picked, forced)] == 2).all()


@pytest.mark.parametrize("overrides", [dict(), dict(norm="pre", d_model=36, n_heads=4), dict(activation="gelu")])
def test_int8_encoder_approximates_fp32(overrides):
    """The C++ int8 encoder and encoder-decoder keys/values stay within int8 rounding of fp32's
    (d_model 36, 4 heads: d_k = 9 runs the loops' scalar tails; pre-norm adds the final norms)."""
    model = _random_model(**overrides)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.3)  # 0.09 std: a well-conditioned stack, so fp32 vs int8 differences stay small
    fast = native.native_step(model, "int8")
    src = _sources()
    enc, ref = fast.encode(src), model.encode(src)
    assert torch.equal(enc.mask, ref.mask)
    real = ref.mask[:, 0, 0, :, None]  # (B, S, 1): padded positions are never attended
    err = ((enc.memory - ref.memory) * real).abs().max() / ref.memory.abs().max()
    assert 0 < err < 0.05, err
    cache, ref_cache = fast.init_cache(enc), model.init_cache(ref)
    for ours, theirs in zip(cache.layers, ref_cache.layers):
        for a, b in ((ours.memory_k, theirs.memory_k), (ours.memory_v, theirs.memory_v)):
            assert a.shape == b.shape
            assert ((a - b) * real[:, None]).abs().max() < 0.05 * b.abs().max()


@pytest.mark.slow
@pytest.mark.parametrize("dtype, threads", [("int8", 1), ("int8", 2), ("fp32", 2)])
def test_loop_native_is_batch_invariant(tiny_model_dir, dtype, threads):
    """Every int8 map quantises each row on its own and sums exactly, every fp32 output is one chain of
    fused multiply-adds computed by one thread, and the loops treat rows one at a time, so --native output
    (tokens and scores) does not depend on the batch or the threads."""
    lines = read_corpus("test", "en", 24)
    fast = load(tiny_model_dir, dtype=dtype, native=True)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        run = lambda **kw: [(t.tokens, t.logprob, t.score) for t in fast.translate(lines, return_scores=True, **kw)]
        reference = run(batch_size=1)
        assert run(batch_size=7) == reference
        assert run(batch_size=64, sort=False) == reference
    finally:
        torch.set_num_threads(before)


def test_int8_step_candidates_equal_step_then_candidates():
    """The fused int8 step (logits folded into each row's log Σ exp and best tokens as they are made, never
    written) selects what decode_step then beam_candidates select, forced rows included; the History cache
    (rows by index) gives the logits of the tensor cache (rows copied) bit for bit, through beam reorders.
    A vocabulary of 700 runs the 256-column pieces' tail."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig.preset("tiny", vocab_size=700, dropout=0.0)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    fast = native.native_step(model, "int8")
    src = torch.randint(4, 700, (3, 7), generator=torch.Generator().manual_seed(5))
    src[:, -1] = 3
    encoded = fast.encode(src)
    fused, history = fast.init_cache(encoded, 1), fast.init_cache(encoded, 1)
    assert isinstance(fused, native.HistoryCache)
    tensors = native.DeferredCache.of(
        DecoderCache([LayerCache(k, v) for k, v in zip(encoded.keys, encoded.values)], encoded.mask, 1)
    )
    scores, tokens = torch.zeros(3, 1), torch.full((3,), 2)
    for t, forced in enumerate(([], [1], [], [0, 5, 6], [])):
        got = fast.step_candidates(tokens, fused, scores, forced, 8)
        logits = fast.decode_step(tokens, tensors)
        assert torch.equal(fast.decode_step(tokens, history), logits), t
        want = fast.beam_candidates(logits, scores, forced, 8, 8)
        assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2]), t
        assert torch.allclose(got[0], want[0], atol=1e-5, rtol=0), t
        rows = (got[1][:, :4] + torch.arange(got[1].size(0))[:, None] * scores.size(1)).flatten()  # 4 beams each
        for c in (fused, history, tensors):
            c.reorder(rows.flip(0) if t == 2 else rows, beam=4)
            if t == 2:  # two reorders before a step compose
                c.reorder(torch.arange(rows.numel()).flip(0))
        scores, tokens = got[0][:, :4], got[2][:, :4].flatten()


@pytest.mark.parametrize("maps, vocab", [("int8", 60), ("int8", 700), ("fp32", 700)])
def test_loop_whole_beam_search_equals_the_python_loop(maps, vocab):
    """The loop step's beam search in one C++ call (Decoder::beam_search) returns the hypotheses of
    search.beam_search's loop over step_candidates: tokens, log-probabilities and scores, every n-best entry,
    with and without the length penalty, and with length limits short enough to force eos."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig.preset("tiny", vocab_size=vocab, dropout=0.0)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    fast = native.native_step(model, maps)
    assert fast.searches_whole
    src = torch.randint(4, vocab, (6, 9), generator=torch.Generator().manual_seed(1))
    src[:, -1] = 3
    src[2, 4], src[2, 5:] = 3, 0  # one short sentence, right-padded
    flat = lambda found: [[(h.tokens, h.logprob, h.score) for h in hyps] for hyps in found]
    for beam, alpha, max_len_b in ((1, 0.6, 50), (4, 0.6, 50), (4, 0.0, 3), (5, 1.0, 2)):
        whole = beam_search(fast, src, beam=beam, alpha=alpha, max_len_b=max_len_b, nbest=beam)
        fast.searches_whole = False
        try:
            loop = beam_search(fast, src, beam=beam, alpha=alpha, max_len_b=max_len_b, nbest=beam)
        finally:
            fast.searches_whole = True
        assert flat(whole) == flat(loop), (beam, alpha, max_len_b)
        assert all(len(hyps) == beam for hyps in whole)
    limits = max_lengths(src, 0, 1.0, 2, 1000)
    assert all(len(h.tokens) <= limit for hyps, limit in zip(whole, limits) for h in hyps)
    assert any(len(h.tokens) == limit for hyps, limit in zip(whole, limits) for h in hyps)  # eos forced


def test_whole_beam_search_is_for_the_loop_step(tiny_model_dir):
    model = load(tiny_model_dir, backend="fp32").model
    assert native.native_step(model).searches_whole  # fp32: the loop step by default
    fast = native.native_step(model, "aten")
    assert not fast.searches_whole
    with pytest.raises(ValueError, match="loop step"):
        fast.beam_search(_sources(), 4, 0.6, 1.0, 50, 1)
    with pytest.raises(ValueError, match="maps"):
        native.native_step(model, "fp16")
    with pytest.raises(ValueError, match="fp32 model"):
        native.native_step(model.to(torch.bfloat16), "fp32")


@pytest.mark.parametrize(
    "overrides", [dict(), dict(norm="pre", d_model=36, n_heads=4), dict(activation="swish", output_bias=True)]
)
def test_fp32_loop_step_is_fp32_within_rounding(overrides):
    """The fp32 loop step (fp32_gemm.h's maps, int8_step.h's loops, the C++ encoder) is fp32 in another
    summation order: fed fp32's greedy tokens, every step's log-probabilities within 1e-4 nats of the Python
    step's, not bit for bit; beam search finds the same hypotheses with log-probabilities within 1e-4.
    (d_model 36: d_k = 9 runs the loops' scalar tails.)"""
    model = _random_model(**overrides)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.5)  # a well-conditioned stack: no near-ties that rounding could flip
    fast = native.native_step(model)
    assert fast.maps == "fp32" and fast.searches_whole
    src = _sources()
    ref = _step_log_probs(model, src, 6)
    ours = _step_log_probs(fast, src, 6, [lp.argmax(-1) for lp in ref])
    err = max((a - b).abs().max().item() for a, b in zip(ours, ref))
    assert 0 < err < 1e-4, err
    want, got = beam_search(model, src, beam=4, nbest=4), beam_search(fast, src, beam=4, nbest=4)
    assert [[h.tokens for h in hs] for hs in got] == [[h.tokens for h in hs] for hs in want]
    assert max(abs(a.logprob - b.logprob) for x, y in zip(got, want) for a, b in zip(x, y)) < 1e-4
