"""Small random OPUS-MT models written as MarianMT directories, as the hub serves them, for the tests that
import one (tests/test_interop_native.py also writes the same weights as a native Marian release)."""

import json
import random
from pathlib import Path

import torch
from safetensors.torch import save_file

from transduce.data.vocab import Vocab
from transduce.interop import marian
from transduce.model import ModelConfig, Transformer

WORDS = [
    "the",
    "a",
    "dog",
    "cat",
    "runs",
    "sleeps",
    "on",
    "under",
    "red",
    "blue",
    "house",
    "tree",
    "man",
    "woman",
    "child",
    "sees",
    "big",
    "small",
    "old",
]


def sentences(n: int, seed: int = 0) -> list[str]:
    """``n`` random sentences of :data:`WORDS`, 3 to 9 words each."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9))) for _ in range(n)]


def opus_ids(V: int) -> dict[str, int]:
    """MarianMT config.json keys of OPUS-MT's layout for ``V`` ids: ``</s>`` 0, ``<pad>`` V - 1 starts decoding."""
    return dict(
        vocab_size=V,
        decoder_vocab_size=V,
        pad_token_id=V - 1,
        eos_token_id=0,
        forced_eos_token_id=0,
        decoder_start_token_id=V - 1,
    )


def write_marianmt(
    out: Path,
    vocab: Vocab,
    languages: list[str] = (),
    d_model: int = 32,
    d_ff: int = 48,
    seed: int = 0,
    source_lang: str = "",
    target_lang: str = "",
    activation: str = "relu",
    logit_bias: float = 0.0,
) -> tuple[dict[str, torch.Tensor], list[str], ModelConfig]:
    """A random ``tiny`` model in MarianMT's files, with OPUS-MT's vocabulary layout: ``</s>`` 0, ``<unk>`` 1,
    then ``languages`` (``>>xx<<`` target-language tokens of a multilingual model), the pieces, ``<pad>``
    last with a zero row; one shared table. ``source_lang``/``target_lang`` go into tokenizer_config.json,
    as the hub's OPUS-MT repositories have them; feed-forward ``activation``, and an output bias
    (``final_logits_bias``) drawn with standard deviation ``logit_bias`` (0: all zeros, as models without one).
    Returns (MarianMT tensors, the vocabulary order, config)."""
    torch.manual_seed(seed)
    cfg = ModelConfig.preset(
        "tiny", vocab_size=len(vocab), d_model=d_model, d_ff=d_ff, n_heads=4, max_positions=64, activation=activation
    )
    hf = marian.to_marian_state(Transformer(cfg))  # MarianMT names, our ids (pad 0, unk 1, bos 2, eos 3)
    pieces = [vocab.sp.id_to_piece(i) for i in range(len(vocab))]
    order = ["</s>", "<unk>"] + list(languages) + pieces[4:] + ["<pad>"]  # OPUS-MT's layout; <pad> last, zero row
    V = len(order)
    ours = {p: i for i, p in enumerate(pieces)}
    table = torch.stack([hf["model.shared.weight"][ours[p]] if p in ours else torch.randn(d_model) for p in order])
    table[V - 1] = 0.0
    hf["model.shared.weight"] = table
    assert "model.encoder.embed_tokens.weight" not in hf  # tie_embeddings "all": one shared table
    bias = torch.randn(1, V) * logit_bias
    bias[0, V - 1] = 0.0  # the <pad> column, which a native release does not have
    hf["final_logits_bias"] = bias

    out.mkdir(parents=True)
    config = marian.marian_config(cfg)
    config.update(opus_ids(V), max_position_embeddings=512)
    (out / "config.json").write_text(json.dumps(config))
    (out / "vocab.json").write_text(json.dumps({p: i for i, p in enumerate(order)}))
    if source_lang or target_lang:
        (out / "tokenizer_config.json").write_text(json.dumps({"source_lang": source_lang, "target_lang": target_lang}))
    save_file({k: v.contiguous() for k, v in hf.items()}, str(out / "model.safetensors"))
    vocab.save(out / "source.spm")
    vocab.save(out / "target.spm")
    return hf, order, cfg
