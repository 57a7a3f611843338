"""Shared test fixtures.

``tiny_model_dir`` (session scope): a model directory holding a ``tiny`` preset model trained for a
fixed number of steps on the first 3,000 sentence pairs of real Multi30k en->de, with a shared
SentencePiece vocabulary of 1,000 pieces. It is deterministic (fixed seed, one torch thread) and
trained once per test session, shared by pytest-xdist workers through an fcntl lock. It translates
badly but not randomly (short, fluent-ish German), which is what decoding, visualisation and
serving tests need. Skipped with a reason when Multi30k is absent. About 40 s of one core when
the machine is idle; set TRANSDUCE_TEST_CACHE=DIR to keep the model across test sessions
(delete DIR after changing this recipe).

``tiny_translator`` (session scope): that model loaded as a :class:`transduce.decode.translator.Translator`.
"""

from __future__ import annotations

import fcntl
import gzip
import os
import time
from pathlib import Path

import pytest
import torch

# the decoding commands (cli.py) and transduce.load set MKL's reproducibility mode before MKL's first call;
# tests that decode with a bare model need it too (batch invariance on Intel CPUs)
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

MULTI30K = Path(__file__).resolve().parents[2] / "shared/data/multi30k"
TINY_PAIRS = 3000
TINY_VOCAB = 1000
TINY_STEPS = 400
TINY_BATCH = 64  # sentences per step
TINY_SEED = 1
TINY_MAX_POSITIONS = 128  # Multi30k sentences are far shorter; keeps overlong-input tests cheap

# `make test` runs two pytest-xdist workers on two cores: one intra-op thread each. Two threads per
# worker oversubscribe the cores, and tiny models then run up to ~20x slower. Tests that need more
# threads (or spawn processes) set their own.
torch.set_num_threads(1)


def read_multi30k(split: str, lang: str, limit: int | None = None) -> list[str]:
    """Lines of ``{split}.{lang}.gz`` from the shared Multi30k copy (skips the test if absent)."""
    path = MULTI30K / f"{split}.{lang}.gz"
    if not path.is_file():
        pytest.skip(f"Multi30k not found at {path} (expected ../shared/data/multi30k next to the repo)")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f]
    return lines[:limit] if limit is not None else lines


def _train_tiny(out: Path) -> None:
    from transduce.data.vocab import BOS_ID, EOS_ID, PAD_ID, Vocab, Vocabs
    from transduce.model import ModelConfig, Transformer
    from transduce.modeldir import save_model_dir

    en, de = read_multi30k("train", "en", TINY_PAIRS), read_multi30k("train", "de", TINY_PAIRS)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        vocab = Vocab.train(en + de, TINY_VOCAB)
        cfg = ModelConfig.preset("tiny", vocab_size=len(vocab), max_positions=TINY_MAX_POSITIONS)
        torch.manual_seed(TINY_SEED)
        model = Transformer(cfg)
        src = [vocab.encode(s) + [EOS_ID] for s in en]
        tgt = [[BOS_ID] + vocab.encode(s) + [EOS_ID] for s in de]
        opt = torch.optim.Adam(model.parameters(), lr=2e-3, betas=(0.9, 0.98), eps=1e-9)
        gen = torch.Generator().manual_seed(TINY_SEED)
        start = time.time()
        model.train()
        for step in range(TINY_STEPS):
            idx = torch.randint(len(src), (TINY_BATCH,), generator=gen).tolist()
            s = _pad([src[i] for i in idx], PAD_ID)
            t = _pad([tgt[i] for i in idx], PAD_ID)
            logits = model(s, t[:, :-1])  # (B, T, V)
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.size(-1)), t[:, 1:].reshape(-1),
                ignore_index=PAD_ID, label_smoothing=cfg.label_smoothing)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step % 100 == 0 and os.environ.get("TRANSDUCE_TINY_VERBOSE"):
                print(step, round(loss.item(), 3), round(time.time() - start, 1), flush=True)
        meta = {"src_lang": "en", "tgt_lang": "de", "trained_by": "tests/conftest.py tiny_model_dir",
                "steps": TINY_STEPS, "final_loss": round(loss.item(), 4), "seconds": round(time.time() - start, 1)}
        save_model_dir(out, model.eval(), Vocabs(vocab, vocab), meta)
    finally:
        torch.set_num_threads(threads)


def _pad(rows: list[list[int]], pad: int) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([r + [pad] * (width - len(r)) for r in rows])  # (B, width)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """Path of a trained ``tiny`` en->de model directory (see the module docstring)."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # one dir per pytest session
    if os.environ.get("TRANSDUCE_TEST_CACHE"):  # opt-in cache kept across sessions (development)
        shared = Path(os.environ["TRANSDUCE_TEST_CACHE"])
        shared.mkdir(parents=True, exist_ok=True)
    out = shared / "tiny_model_en_de"
    with open(shared / "tiny_model_en_de.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not (out / "model.safetensors").is_file():
                _train_tiny(out)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return out


@pytest.fixture(scope="session")
def tiny_translator(tiny_model_dir):
    """``transduce.load(tiny_model_dir)`` (fp32, CPU), with torch set to one thread (bit-exact decoding)."""
    from transduce.api import load

    torch.set_num_threads(1)
    return load(tiny_model_dir)
