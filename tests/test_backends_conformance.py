"""Every decoding backend against the readable reference, on the same model and the same inputs.

The reference is the Python fp32 step (``Transformer.decode_step``) decoding each sentence on its own, one
thread. Every check runs on two models: the paper's (ReLU, a bias-free output projection) and one with Swish
feed-forwards and an output bias (``activation="swish"``, ``output_bias=True``, as many OPUS-MT models), so
a backend that ignores either part breaks its contract. Each backend of :data:`transduce.backends.BACKENDS` has a contract below, and the suite checks it
batched (all sentences in one call) and unbatched (one sentence per call):

* ``exact``: the same hypotheses, log-probabilities and scores as its reference, bit for bit;
* ``batch_invariant``: a sentence's output does not depend on the other sentences of its batch, bit for bit;
* ``max_logp_error``: fed the reference's greedy tokens, every step's log-probabilities are within this many
  nats of fp32's (the approximate backends; a well-conditioned random model, where fp32 agrees with fp64).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass

import pytest
import torch

from transduce.backends import BACKENDS, native
from transduce.backends.policy import decoder_for
from transduce.decode.search import beam_search
from transduce.fastpaths import Choice
from transduce.model import ModelConfig, Transformer


@dataclass(frozen=True)
class Contract:
    reference: str  # the backend whose outputs this one is held to
    exact: bool  # bit-identical to ``reference``, batched and unbatched
    batch_invariant: bool
    max_logp_error: float | None = None  # against fp32, per step, in nats (approximate backends)


CONTRACTS = {
    "fp32": Contract("fp32", exact=True, batch_invariant=True),
    "fp32-native": Contract("fp32-native", exact=True, batch_invariant=True, max_logp_error=1e-5),  # measured 4.8e-7
    "bf16": Contract("bf16", exact=True, batch_invariant=True, max_logp_error=0.01),  # measured 0.0027
    "bf16-native": Contract("bf16", exact=True, batch_invariant=True, max_logp_error=0.01),
    "fp16": Contract("fp16", exact=True, batch_invariant=False),  # CUDA only: not checked on a CPU
    "int8": Contract("int8", exact=True, batch_invariant=False, max_logp_error=0.02),  # measured 0.0059
    "int8-native": Contract("int8-native", exact=True, batch_invariant=True, max_logp_error=0.02),  # 0.0053
}
NATIVE = [b for b in BACKENDS if b.endswith("-native")]
CUDA_ONLY = ("fp16",)
BEAM = 4
MODELS = {"paper": {}, "swish-output-bias": dict(activation="swish", output_bias=True)}


def _model(variant: str) -> Transformer:
    """A tiny random model, far enough from initialisation to give varied distributions, yet well
    conditioned (int8's error is then a few hundredths of a nat)."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig.preset("tiny", vocab_size=60, dropout=0.0, **MODELS[variant])).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.1)
    return model


def _sources() -> torch.Tensor:
    """(6, 9) ids + eos, right-padded: one width for all, as the Translator pads a batch of one length."""
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, 60, (6, 9), generator=g)
    src[:, -1] = 3
    src[2, 4], src[2, 5:] = 3, 0
    src[4, 6], src[4, 7:] = 3, 0
    return src


@pytest.fixture(scope="module", params=list(MODELS))
def decoders(request):
    """backend -> its decoder over the same fp32 weights of one of MODELS (native ones need a C++ compiler)."""
    torch.set_num_threads(1)
    out = {}
    for name in BACKENDS:
        if (name in NATIVE and shutil.which("c++") is None) or name in CUDA_ONLY:
            continue
        # a fresh copy of the same weights each: bf16 converts its model in place
        decoder, ran = decoder_for(_model(request.param), Choice(name, "conformance"), torch.device("cpu"))
        assert ran.name == name, ran  # a native backend that silently fell back would test nothing
        out[name] = decoder
    return out


def _hyps(decoder, src: torch.Tensor) -> list[tuple]:
    return [(h[0].tokens, h[0].logprob, h[0].score) for h in beam_search(decoder, src, beam=BEAM)]


def _run(decoder, batched: bool) -> list[tuple]:
    src = _sources()
    if batched:
        return _hyps(decoder, src)
    return [h for i in range(src.size(0)) for h in _hyps(decoder, src[i : i + 1])]


def _step_log_probs(decoder, src: torch.Tensor, feed: list[torch.Tensor]) -> list[torch.Tensor]:
    """Log-probabilities (B, V) of each step, fed ``feed[t]`` after step t."""
    cache = decoder.init_cache(decoder.encode(src), 1)
    tokens, out = torch.full((src.size(0),), 2), []
    for t in range(len(feed)):
        out.append(torch.log_softmax(decoder.decode_step(tokens, cache).float(), -1))
        tokens = feed[t]
    return out


def test_every_backend_has_a_contract():
    assert set(CONTRACTS) == set(BACKENDS)


@pytest.mark.slow
@pytest.mark.parametrize("name", BACKENDS)
def test_backend_keeps_its_contract(name, decoders):
    if name not in decoders:
        pytest.skip(
            f"{name} decodes on CUDA only"
            if name in CUDA_ONLY
            else "no C++ compiler: the native backends cannot be built (the Python step runs instead)"
        )
    contract, decoder = CONTRACTS[name], decoders[name]
    reference = _run(decoders["fp32"] if contract.reference == "fp32" else decoders[contract.reference], False)
    alone = _run(decoder, batched=False)
    together = _run(decoder, batched=True)
    if contract.exact:
        assert alone == reference, f"{name} unbatched differs from {contract.reference}"
    if contract.batch_invariant:
        assert together == alone, f"{name}: a sentence's output depends on its batch"
        if contract.exact:
            assert together == reference
    if contract.max_logp_error is not None:
        src = _sources()
        fp32 = decoders["fp32"]
        greedy_feed = [lp.argmax(-1) for lp in _step_log_probs(fp32, src, [torch.zeros(6, dtype=torch.long)] * 8)]
        want = _step_log_probs(fp32, src, greedy_feed)
        got = _step_log_probs(decoder, src, greedy_feed)
        real = (src != 0).any(1)  # every row is a sentence
        error = max((a - b)[real].abs().max().item() for a, b in zip(got, want))
        assert 0 < error <= contract.max_logp_error, (name, error)


@pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler")
def test_native_aten_fp32_is_the_reference_step_for_step(decoders):
    """The C++ step over ATen's ops (bf16-native's, here in fp32) gives the Python step's logits bit for bit,
    step after step (not only the argmax)."""
    src, fp32 = _sources(), decoders["fp32"]
    fast = native.native_step(fp32, "aten")
    feed = [torch.randint(4, 60, (src.size(0),), generator=torch.Generator().manual_seed(t)) for t in range(6)]
    for a, b in zip(_step_log_probs(fast, src, feed), _step_log_probs(fp32, src, feed)):
        assert torch.equal(a, b)
