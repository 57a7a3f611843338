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
(`make test` and `make test-fast` keep it in .cache/tests). The model's folder is named by a digest of this
recipe, the corpus, the code it trains with and torch's version, so a change to any of them trains a new one.

``tiny_translator`` (session scope): that model loaded as a :class:`transduce.decode.translator.Translator`;
``translator`` is the same object, under the name the decoding, serving and file tests use.

Shared by several test files, each made once per test session (:func:`build_once`; ``multi30k_raw`` once per
pytest-xdist worker):

* ``data_dir``: a prepared slice of the corpus (2,000 pairs, 500 pieces) for training tests, with
  :func:`write_config` and :func:`train_in_process` to train on it;
* ``multi30k_raw``: a directory of the corpus's first lines under Multi30k's file names
  (:func:`write_multi30k_shaped`), what ``transduce prepare multi30k --raw`` and the recipe read;
* ``finished_recipe``: one recipe run to its end on ``multi30k_raw`` (:func:`write_recipe`), for tests that
  read or re-evaluate a finished run;
* ``browser``: a headless chromium (skipped loudly without one; TRANSDUCE_REQUIRE_BROWSER=1 fails instead);
* :func:`serve_subprocess`: ``transduce serve`` in its own process, stopped as SIGTERM stops it.

Tests marked ``slow`` (pyproject.toml) take about 2 s or more each on two busy cores, or share a fixture that does
(a whole file is marked with ``pytestmark``); ``make test-fast`` leaves them out, ``make test`` runs them.
"""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import hashlib
import inspect
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"
CORPUS = REPO / "tests" / "data" / "bible-en-fr"  # shipped: train / valid / test, en / fr
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
    cache = os.environ.get("TRANSDUCE_TEST_CACHE")  # kept across sessions: `make test`, `make test-fast`
    root = Path(cache) if cache else None
    return build_once(tmp_path_factory, f"tiny_model_en_fr-{_tiny_digest()}", _train_tiny, root)


def build_once(tmp_path_factory, name: str, build, root: Path | None = None) -> Path:
    """Folder ``name``, made by ``build(folder)`` once per test session and shared by its pytest-xdist workers
    through an fcntl lock (in ``root`` instead, once for as long as ``root`` keeps it). A build that failed
    halfway is removed and run again by the next test that asks."""
    base = tmp_path_factory.getbasetemp()
    root = root or (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base)  # one per pytest session
    root.mkdir(parents=True, exist_ok=True)
    folder, done = root / name, root / f"{name}.done"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not done.is_file():
                shutil.rmtree(folder, ignore_errors=True)
                build(folder)
                done.touch()
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return folder


@pytest.fixture(scope="session")
def tiny_translator(tiny_model_dir):
    """``transduce.load(tiny_model_dir, backend="fp32")``: the Python fp32 step, the reference (``auto`` would
    run the C++ loop step), on the CPU, with torch set to one thread (bit-exact decoding)."""
    from transduce.api import load

    torch.set_num_threads(1)
    return load(tiny_model_dir, backend="fp32")


@pytest.fixture(scope="session")
def translator(tiny_translator):
    """``tiny_translator``, under the name the decoding, serving and file tests use."""
    return tiny_translator


def _tiny_digest() -> str:
    """12 hex digits that change with the tiny model's recipe, its corpus, the code it trains with and torch."""
    h = hashlib.sha256()
    h.update(inspect.getsource(_train_tiny).encode() + inspect.getsource(_pad).encode())
    h.update(repr((TINY_PAIRS, TINY_VOCAB, TINY_STEPS, TINY_BATCH, TINY_SEED, TINY_MAX_POSITIONS)).encode())
    h.update(repr((SRC_LANG, TGT_LANG, torch.__version__)).encode())
    code = SRC / "transduce"
    for path in [CORPUS / f"train.{SRC_LANG}.gz", CORPUS / f"train.{TGT_LANG}.gz", code / "modeldir.py"]:
        h.update(path.read_bytes())
    for path in sorted([*(code / "model").glob("*.py"), code / "data" / "vocab.py", code / "safefiles.py"]):
        h.update(path.read_bytes())
    return h.hexdigest()[:12]


# ---------------------------------------------------------------- training on a slice of the corpus
PAIRS, VALID = 2000, 100  # data_dir's training and validation pairs


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    """A prepared data directory (``transduce prepare files``) of the corpus's first 2,000 training and 100
    validation pairs, en->fr, 500 shared pieces, once per test session. Tests read it and never write into it."""
    return build_once(tmp_path_factory, "corpus-slice", _prepare_slice) / "data"


def _prepare_slice(root: Path) -> None:
    from transduce.cli import main

    root.mkdir(parents=True)
    for name, n in (("train", PAIRS), ("valid", VALID)):
        for lang in ("en", "fr"):
            (root / f"{name}.{lang}").write_text("\n".join(read_corpus(name, lang, n)) + "\n")
    argv = ["prepare", "files", "--src-lang", "en", "--tgt-lang", "fr", "--vocab-size", "500"]
    for flag, name in [("src", "train.en"), ("tgt", "train.fr"), ("valid-src", "valid.en"), ("valid-tgt", "valid.fr")]:
        argv += [f"--{flag}-file", str(root / name)]
    assert main([*argv, "--out", str(root / "data")]) == 0


def write_config(path: Path, data: Path, out: Path, **train) -> Path:
    """A training config of the ``tiny`` preset on ``data``: 8 updates of 300 tokens, checkpoints every 2, no
    validation or BLEU; ``train`` overrides any [train] key."""
    values = dict(
        data=str(data),
        out=str(out),
        max_tokens=300,
        schedule="inverse_sqrt",
        peak_lr=3e-3,
        warmup=8,
        dtype="bf16",
        threads=1,
        max_steps=8,
        validate_every=1000,
        save_every_steps=2,
        keep_last=10,
        log_every=1,
        tensorboard=False,
        bleu_sentences=0,
        check_backends=0,
    )
    values.update(train)
    lines = ["[train]"] + [f"{k} = {v!r}" if not isinstance(v, str) else f'{k} = "{v}"' for k, v in values.items()]
    path.write_text("\n".join(lines).replace("True", "true").replace("False", "false") + '\n[model]\npreset = "tiny"\n')
    return path


def train_in_process(config: Path, resume: bool = False, overrides=()):
    """Train ``config`` in this process, as ``transduce train`` does; returns the finished Trainer."""
    from transduce.data import PreparedData
    from transduce.train.config import load_config, model_config
    from transduce.train.trainer import Trainer, write_run_header

    threads = torch.get_num_threads()
    cfg, table = load_config(config, list(overrides))
    data = PreparedData.open(cfg.data)
    mcfg = model_config(table, data.vocabs, "test")
    write_run_header(cfg, mcfg, data.vocabs)
    trainer = Trainer(cfg, mcfg, data, resume=resume)
    try:
        trainer.train()
    finally:
        torch.set_num_threads(threads)
    return trainer


# ---------------------------------------------------------------- Multi30k-shaped data and the recipe
MULTI30K_SPLITS = {"train": "train", "val": "valid", "test_2016_flickr": "test"}  # Multi30k's names -> the corpus's
RECIPE_SIZES = {"train": 1500, "val": 60, "test_2016_flickr": 40}  # multi30k_raw's lines per split


def write_multi30k_shaped(root: Path, sizes: dict[str, int]) -> Path:
    """``root`` holding ``{split}.{en,fr}.gz`` under Multi30k's file names, each the first ``sizes[split]`` lines
    of the corpus's matching split."""
    root.mkdir(parents=True, exist_ok=True)
    for split, n in sizes.items():
        for lang in ("en", "fr"):
            with gzip.open(root / f"{split}.{lang}.gz", "wt", encoding="utf-8") as f:
                f.write("\n".join(read_corpus(MULTI30K_SPLITS[split], lang, n)) + "\n")
    return root


@pytest.fixture(scope="session")
def multi30k_raw(tmp_path_factory) -> Path:
    """A Multi30k-shaped directory of the corpus's first lines, :data:`RECIPE_SIZES` of each split."""
    return write_multi30k_shaped(tmp_path_factory.mktemp("m30k-raw"), RECIPE_SIZES)


def write_recipe(path: Path, raw: Path, out: Path, processes: int) -> Path:
    """A recipe on ``raw`` (en->fr, 400 pieces, ``tiny``): 12 bf16 updates, a checkpoint every 3, the last 3
    averaged, beam 2 and α chosen among 0, 0.6 and 2 on valid."""
    path.write_text(f"""
[recipe]
out = "{out}"
processes = {processes}
[prepare]
corpus = "multi30k"
tgt = "fr"
raw = "{raw}"
vocab_size = 400
[model]
preset = "tiny"
[train]
max_tokens = 400
schedule = "linear"
peak_lr = 0.003
warmup = 4
dtype = "bf16"
threads = 1
max_steps = 12
save_every_steps = 3
validate_every = 6
bleu_sentences = 20
tensorboard = false
[average]
last = 3
[evaluate]
beam = 2
alpha = [0.0, 0.6, 2.0]
""")
    return path


@pytest.fixture(scope="session")
def finished_recipe(multi30k_raw, tmp_path_factory) -> tuple[Path, dict]:
    """(its recipe file, its results.json) for :func:`write_recipe` with one process, run to its end in OUT = the
    recipe file's folder / "out", once per test session. Tests that change a run copy OUT first."""
    from transduce.recipe import load_recipe, run_recipe

    def run(folder: Path) -> None:
        folder.mkdir(parents=True)
        run_recipe(load_recipe(write_recipe(folder / "r.toml", multi30k_raw, folder / "out", 1)))

    folder = build_once(tmp_path_factory, "finished-recipe", run)
    return folder / "r.toml", json.loads((folder / "out" / "results.json").read_text())


# ---------------------------------------------------------------- servers and browsers
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve_subprocess(root: Path, *args: str) -> Iterator[str]:
    """``transduce serve ARGS --threads 1`` in its own process, in folder ``root`` (its log: root/serve.log), on a
    free port; yields the server's URL once /health answers. On exit it sends SIGTERM and checks uvicorn's
    graceful shutdown (exit status 0 or the signal's, "Application shutdown complete" logged)."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    argv = [sys.executable, "-m", "transduce", "serve", *args, "--port", str(port), "--threads", "1"]
    log_path = root / "serve.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(argv, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 120
            while True:
                try:
                    urllib.request.urlopen(url + "/health", timeout=5)
                    break
                except OSError:
                    assert process.poll() is None and time.monotonic() < deadline, log_path.read_text()
                    time.sleep(0.2)
            yield url
        finally:
            process.terminate()  # SIGTERM: uvicorn's graceful shutdown, which then re-raises the signal
            status = process.wait(60)
    assert status in (0, -signal.SIGTERM), log_path.read_text()
    assert "Application shutdown complete" in log_path.read_text()


CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1200,900",
]


def no_browser(why: str):
    """Skip the test with a loud reason (and a warning in the summary); fail it with TRANSDUCE_REQUIRE_BROWSER."""
    message = (
        f"NO BROWSER, PAGE TEST SKIPPED: {why}. Install Debian's chromium and chromium-driver "
        "(apt-get install -y chromium chromium-driver) to run it."
    )
    if os.environ.get("TRANSDUCE_REQUIRE_BROWSER"):
        pytest.fail(message + " (TRANSDUCE_REQUIRE_BROWSER is set)")
    warnings.warn(message, stacklevel=2)
    pytest.skip(message)


@pytest.fixture
def browser(tmp_path):
    """A headless chromium driven by selenium (Debian's chromium and chromium-driver on PATH)."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        no_browser("the selenium package is not installed (pip install selenium)")
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if binary is None or driver_path is None:
        no_browser(
            f"chromium {'found' if binary else 'not found'}, chromedriver "
            f"{'found' if driver_path else 'not found'} on PATH"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in CHROMIUM_FLAGS + [f"--user-data-dir={tmp_path / 'profile'}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()
