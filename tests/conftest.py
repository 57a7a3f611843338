"""Shared test fixtures and the corpus the tests train and translate on.

The tests need nothing outside the repository: ``tests/data/bible-en-fr`` holds a small public-domain
English–French corpus (World English Bible, Louis Segond 1910; see tests/data/README.md), read with
:func:`read_corpus`. Tests about Multi30k itself read ``../shared/data/multi30k`` with
:func:`read_multi30k`, which skips them when it is absent; every skipped test is then named, with its
reason, in a section of the terminal summary (:func:`pytest_terminal_summary`), never skipped silently.

``tiny_model_dir`` (session scope): a model directory holding a ``tiny`` preset model trained for a
fixed number of steps on the first 3,000 pairs of that corpus, en->fr, with a shared SentencePiece
vocabulary of 1,000 pieces. It is deterministic (fixed seed, one torch thread) and trained once per test
session, shared by pytest-xdist workers through an fcntl lock. It translates badly but not randomly
(short, fluent-ish French), which is what decoding, visualisation and serving tests need. About 40 s of
one core when the machine is idle; set TRANSDUCE_TEST_CACHE=DIR to keep the model across test sessions
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

CORPUS = Path(__file__).resolve().parent / "data" / "bible-en-fr"  # shipped: train / valid / test, en / fr
SRC_LANG, TGT_LANG = "en", "fr"
# the decoding commands (cli.py) and transduce.load set MKL's reproducibility mode before MKL's first call;
# tests that decode with a bare model need it too (batch invariance on Intel CPUs)
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

MULTI30K = Path(__file__).resolve().parents[2] / "shared/data/multi30k"
NEEDS_MULTI30K = "needs Multi30k's full data"  # the start of every skip reason for its absence
TINY_PAIRS = 3000
TINY_VOCAB = 1000
TINY_STEPS = 400
TINY_BATCH = 64  # sentences per step
TINY_SEED = 1
TINY_MAX_POSITIONS = 128  # the corpus's verses are far shorter; keeps overlong-input tests cheap

# `make test` runs two pytest-xdist workers on two cores: one intra-op thread each. Two threads per
# worker oversubscribe the cores, and tiny models then run up to ~20x slower. Tests that need more
# threads (or spawn processes) set their own.
torch.set_num_threads(1)


def read_corpus(split: str, lang: str, limit: int | None = None) -> list[str]:
    """The first ``limit`` lines of the shipped corpus: ``split`` in train / valid / test, ``lang`` en / fr."""
    with gzip.open(CORPUS / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f]
    return lines[:limit] if limit is not None else lines


def multi30k_missing() -> str | None:
    """Why Multi30k's full data cannot be read here (a skip reason), or None when it can."""
    if (MULTI30K / "train.en.gz").is_file():
        return None
    return f"{NEEDS_MULTI30K}: not found at {MULTI30K} (../shared/data/multi30k beside the repository)"


needs_multi30k = pytest.mark.skipif(multi30k_missing() is not None, reason=multi30k_missing() or "")


def read_multi30k(split: str, lang: str, limit: int | None = None) -> list[str]:
    """Lines of ``{split}.{lang}.gz`` from the shared Multi30k copy (skips the test, named in the summary,
    if absent). Only for tests about Multi30k itself; the rest use :func:`read_corpus`."""
    if multi30k_missing():
        pytest.skip(multi30k_missing())
    with gzip.open(MULTI30K / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f]
    return lines[:limit] if limit is not None else lines


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """Name the CPU kernel paths that ran (test_backends_cpu_paths.py), and every skipped test and why, so that a run
    that could not test something says so."""
    _cpu_paths_summary(terminalreporter)
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if getattr(r, "longrepr", None)]
    if not skipped:
        return
    heading = f"{len(skipped)} test{'s' * (len(skipped) != 1)} did not run"
    terminalreporter.section(heading, sep="!", yellow=True, bold=True)
    for report in skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        terminalreporter.write_line(f"SKIPPED {report.nodeid}: {reason.removeprefix('Skipped: ')}", yellow=True)


def _cpu_paths_summary(terminalreporter) -> None:
    """One line: the CPU, and for each SIMD level of the C++ step how many of its tests passed or failed
    (levels the CPU lacks are named as not run), the AVX-512 code when it ran on SIMDe's intrinsics, and
    aarch64 when its build ran under emulation."""
    from transduce import cpp

    counts: dict[str, dict[str, int]] = {}
    for outcome in ("passed", "failed"):
        for report in terminalreporter.stats.get(outcome, []):
            nodeid = getattr(report, "nodeid", "")
            if not nodeid.startswith("tests/test_backends_cpu_paths.py") or getattr(report, "when", "call") != "call":
                continue
            if "under_emulation" in nodeid:
                counts.setdefault("aarch64 under qemu-user", {}).setdefault(outcome, 0)
                counts["aarch64 under qemu-user"][outcome] += 1
            for name in (*(isa.name for isa in cpp.ISAS), "avx512vnni-simde"):  # [avx2], [gelu-avx2]
                if f"[{name}]" in nodeid or f"-{name}]" in nodeid:
                    label = name.replace("-simde", " under SIMDe")
                    counts.setdefault(label, {}).setdefault(outcome, 0)
                    counts[label][outcome] += 1
    if not counts:
        return
    cpu = next((ln.partition(":")[2].strip() for ln in _cpuinfo() if ln.startswith("model name")), "unknown CPU")
    ran = ", ".join(f"{name} ({', '.join(f'{n} {k}' for k, n in sorted(c.items()))})" for name, c in counts.items())
    missing = [isa.name for isa in cpp.ISAS if isa.name not in counts]
    terminalreporter.section("CPU kernel paths", sep="-", bold=True)
    terminalreporter.write_line(f"{cpu}: ran {ran}" + (f"; not run here: {', '.join(missing)}" if missing else ""))


def _cpuinfo() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []


def _train_tiny(out: Path) -> None:
    from transduce.data.vocab import BOS_ID, EOS_ID, PAD_ID, Vocab, Vocabs
    from transduce.model import ModelConfig, Transformer
    from transduce.modeldir import save_model_dir

    en, fr = read_corpus("train", SRC_LANG, TINY_PAIRS), read_corpus("train", TGT_LANG, TINY_PAIRS)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        vocab = Vocab.train(en + fr, TINY_VOCAB)
        cfg = ModelConfig.preset("tiny", vocab_size=len(vocab), max_positions=TINY_MAX_POSITIONS)
        torch.manual_seed(TINY_SEED)
        model = Transformer(cfg)
        src = [vocab.encode(s) + [EOS_ID] for s in en]
        tgt = [[BOS_ID] + vocab.encode(s) + [EOS_ID] for s in fr]
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
                logits.reshape(-1, logits.size(-1)),
                t[:, 1:].reshape(-1),
                ignore_index=PAD_ID,
                label_smoothing=cfg.label_smoothing,
            )
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step % 100 == 0 and os.environ.get("TRANSDUCE_TINY_VERBOSE"):
                print(step, round(loss.item(), 3), round(time.time() - start, 1), flush=True)
        meta = {
            "src_lang": SRC_LANG,
            "tgt_lang": TGT_LANG,
            "trained_by": "tests/conftest.py tiny_model_dir",
            "steps": TINY_STEPS,
            "final_loss": round(loss.item(), 4),
            "seconds": round(time.time() - start, 1),
        }
        save_model_dir(out, model.eval(), Vocabs(vocab, vocab), meta)
    finally:
        torch.set_num_threads(threads)


def _pad(rows: list[list[int]], pad: int) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([r + [pad] * (width - len(r)) for r in rows])  # (B, width)


@pytest.fixture(autouse=True)
def keep_torch_threads():
    """Each test leaves torch's intra-op thread count as it found it: the server, ``--threads`` and the
    thread-scaling tests set their own."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """Path of a trained ``tiny`` en->fr model directory (see the module docstring)."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # one dir per pytest session
    if os.environ.get("TRANSDUCE_TEST_CACHE"):  # opt-in cache kept across sessions (development)
        shared = Path(os.environ["TRANSDUCE_TEST_CACHE"])
        shared.mkdir(parents=True, exist_ok=True)
    out = shared / "tiny_model_en_fr"
    with open(shared / "tiny_model_en_fr.lock", "w") as lock:
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
