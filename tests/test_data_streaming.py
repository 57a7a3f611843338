"""The streaming data path: compressed inputs, bounded memory (reader, de-duplication, encoder, batching),
weighted corpora, BPE on a sample, and parallel encoding equal to one process."""

import gzip
import inspect
import lzma
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from transduce.cli import main
from transduce.data import PreparedData
from transduce.data.batching import TokenBatches, _greedy_bounds
from transduce.data.dataset import TokenArray
from transduce.data.dedup import Digests, first_occurrences
from transduce.data.encode import encode_chunks
from transduce.data.sources import Source, iter_lines
from transduce.data.staging import stage_split
from transduce.data.vocab import Vocab

WORDS = (
    "the cat sat on a mat while two dogs ran past seven red houses near old bridges and green trees "
    "under bright summer skies"
).split()
WÖRTER = (
    "die Katze saß auf einer Matte während zwei Hunde an sieben roten Häusern nahe alten Brücken und "
    "grünen Bäumen unter hellem Sommerhimmel vorbeiliefen"
).split()


def pair(i: int) -> tuple[str, str]:
    """A distinct, deterministic sentence pair for every ``i``."""
    rng = np.random.default_rng(i)
    n = int(rng.integers(4, 12))
    return (
        " ".join(WORDS[j] for j in rng.integers(0, len(WORDS), n)) + f" {i}",
        " ".join(WÖRTER[j] for j in rng.integers(0, len(WÖRTER), n)) + f" {i}",
    )


def write_corpus(stem: Path, pairs: list[tuple[str, str]], opener=open) -> tuple[Path, Path]:
    paths = []
    for side, suffix in ((0, ".en"), (1, ".de")):
        path = stem.with_suffix(suffix + {open: "", gzip.open: ".gz", lzma.open: ".xz"}[opener])
        with opener(path, "wb") as f:
            f.write("".join(p[side] + "\n" for p in pairs).encode())
        paths.append(path)
    return paths[0], paths[1]


def prepare(*args) -> int:
    return main(["prepare", "files", *map(str, args)])


def test_plain_gzip_and_xz_give_the_same_data(tmp_path):
    pairs = [pair(i) for i in range(300)]
    outs = []
    for opener in (open, gzip.open, lzma.open):
        src, tgt = write_corpus(tmp_path / f"c{len(outs)}", pairs, opener)
        out = tmp_path / f"out{len(outs)}"
        assert prepare("--src-file", src, "--tgt-file", tgt, "--out", out, "--vocab-size", 120) == 0
        outs.append(out)
    ref = PreparedData.open(outs[0]).split("train")
    assert len(ref) == 300 and ref.tgt_text(7) == pairs[7][1]
    for out in outs[1:]:
        other = PreparedData.open(out).split("train")
        assert np.array_equal(other.src.ids, ref.src.ids) and np.array_equal(other.tgt.offsets, ref.tgt.offsets)
    renamed = tmp_path / "misnamed.txt"  # recognised by its bytes, not its name
    renamed.write_bytes(gzip.compress(b"a\nb\n"))
    assert list(iter_lines(renamed)) == ["a", "b"]
    broken = tmp_path / "broken.xz"
    broken.write_bytes(lzma.compress(b"x\n" * 1000)[:-20])
    with pytest.raises(ValueError, match="broken.xz, after line .*not a valid compressed file"):
        list(iter_lines(broken))


def test_readers_are_generators(tmp_path):
    src, tgt = write_corpus(tmp_path / "c", [pair(i) for i in range(5)])
    assert inspect.isgenerator(iter_lines(src))
    assert inspect.isgenerator(Source("c", src, tgt).pairs())
    short = tmp_path / "short.de"
    short.write_text("eins\n")
    with pytest.raises(ValueError, match=r"c\.en has 5 lines, .*short\.de has 1"):
        list(Source("c", src, short).pairs())


def test_dedup_keeps_first_occurrence_in_8_bytes_per_pair():
    digests = Digests()
    for d in [5, 3, 5, 9, 3, 3, 1]:
        digests.append(d)
    assert first_occurrences(digests.array()).tolist() == [True, True, False, True, False, False, True]
    for _ in range(300_000):
        digests.append(7)
    assert digests.nbytes <= 8 * len(digests) + 8 * Digests.BLOCK


@pytest.mark.slow
def test_staging_memory_does_not_hold_the_text(tmp_path):
    """200,000 distinct pairs (over 200 bytes of str objects each) stream through in under 80 bytes a pair:
    only digests stay (8 bytes a pair, about 40 while they are sorted to find repeats)."""
    n = 200_000

    def pairs():
        for i in range(n):
            yield f"sentence number {i} of the stream, with some words", f"Satz Nummer {i} des Stroms, mit Wörtern"

    tracemalloc.start()
    try:
        split = stage_split("train", [("stream", 1.0, pairs())], {}, tmp_path, dedup=True)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert split.read == n and split.filtered == {"empty": 0, "duplicate": 0}
    assert peak < 80 * n, f"staging {n:,} pairs peaked at {peak:,} bytes"  # the strings alone are > 100 bytes a pair


def test_encoder_reads_ahead_a_bounded_number_of_chunks():
    vocab = Vocab.train([p for i in range(200) for p in pair(i)], 100)
    pulled = []

    def chunks():
        for i in range(40):
            pulled.append(i)
            yield [pair(i)[0]] * 50, [pair(i)[1]] * 50

    lead = []
    for done, (src_ids, src_len, tgt_ids, tgt_len) in enumerate(encode_chunks(vocab, vocab, chunks(), processes=2)):
        lead.append(len(pulled) - done)
        assert len(src_len) == 50 and src_len.sum() == len(src_ids) and tgt_ids.dtype == np.int32
        assert src_ids[: src_len[0]].tolist() == vocab.encode(pair(done)[0])
    assert max(lead) <= 2 * 2 + 1  # Pool.imap would have read all 40 ahead


@pytest.mark.slow
def test_parallel_encoding_equals_one_process(tmp_path):
    src, tgt = write_corpus(tmp_path / "c", [pair(i) for i in range(9000)])  # > 2 chunks
    base = ["--src-file", src, "--tgt-file", tgt, "--vocab-size", 150]
    assert prepare(*base, "--out", tmp_path / "one", "--processes", 1) == 0
    assert prepare(*base, "--out", tmp_path / "two", "--processes", 2) == 0
    one, two = (PreparedData.open(tmp_path / d).split("train") for d in ("one", "two"))
    assert np.array_equal(one.src.ids, two.src.ids) and np.array_equal(one.tgt.offsets, two.tgt.offsets)
    assert (tmp_path / "one/train.src").read_bytes() == (tmp_path / "two/train.src").read_bytes()
    assert not (tmp_path / "two/.staging").exists()


def test_weighted_corpora_dedup_across_them_and_vocab_sample(tmp_path, capsys):
    a = write_corpus(tmp_path / "a", [pair(i) for i in range(400)])
    b = write_corpus(tmp_path / "b", [pair(i) for i in range(300, 1300)])  # 100 pairs repeat corpus a
    out = tmp_path / "out"
    args = [
        "--corpus",
        "a",
        *a,
        2,
        "--corpus",
        "b",
        *b,
        0.5,
        "--dedup",
        "--vocab-size",
        150,
        "--src-lang",
        "en",
        "--tgt-lang",
        "de",
        "--vocab-sample",
        250,
        "--out",
        out,
    ]
    assert prepare(*args) == 0
    printed = capsys.readouterr().out
    m = PreparedData.open(out).manifest
    train = m["splits"]["train"]
    assert train["filtered"]["duplicate"] == 100 and train["read"] == 1400
    ca, cb = train["corpora"]
    assert (ca["name"], ca["kept"], ca["written"]) == ("a", 400, 800)
    assert cb["kept"] == 900 and 380 < cb["written"] < 520  # a fixed half, chosen by digest
    assert train["sentences"] == ca["written"] + cb["written"]
    assert m["vocab"]["trained_on_pairs"] == 250 and m["weights"] == {"a": 2.0, "b": 0.5}
    assert "b: 1,000 read, 900 kept, weight 0.5" in printed
    text = (out / "train.de").read_text().split("\n")
    assert text.count(pair(5)[1]) == 2 and text.count(pair(350)[1]) == 2  # weight 2; 350's repeat in b dropped
    first = (out / "cache/train.src.bin").read_bytes()
    assert prepare(*args, "--force") == 0 and (out / "cache/train.src.bin").read_bytes() == first  # same draw
    assert prepare("--corpus", "a", *a, "x", "--out", tmp_path / "bad") == 2
    assert "--corpus a: weight 'x' is not a number" in capsys.readouterr().err


def reference_greedy(widths, max_tokens):
    bounds, start = [], 0
    for end in range(1, len(widths) + 1):
        if end < len(widths) and (end + 1 - start) * widths[end] <= max_tokens:
            continue
        bounds.append((start, end))
        start = end
    return bounds


def test_batching_by_length_from_offsets_alone():
    rng = np.random.default_rng(0)
    for budget in (40, 97, 400):
        widths = np.sort(rng.integers(2, 40, 3000))
        assert _greedy_bounds(widths, budget) == reference_greedy(widths.tolist(), budget)
    n = 1_000_000  # a million sentences: no Python object per sentence
    lengths = rng.integers(1, 60, n)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    ids = np.zeros(int(offsets[-1]), dtype=np.int32)
    tracemalloc.start()
    try:

        class Split:
            name, src, tgt = "train", TokenArray(ids, offsets), TokenArray(ids, offsets)

            def __len__(self):
                return n

        lengths_bytes = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        batches = TokenBatches(Split(), 4096, world_size=2)
        plan = batches.indices(3)
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert sum(len(b) for b in batches._plan(3)) == n
    assert len(plan) == len(batches) and batches.make(plan[0]).src.shape[0] == len(plan[0])
    # int16 lengths (2 bytes per sentence and side), an int32 plan; int64 everywhere took several times more
    assert lengths_bytes < 4.1 * n and held - lengths_bytes < 6 * n, (lengths_bytes / n, (held - lengths_bytes) / n)
    assert peak - lengths_bytes < 24 * n, f"batching {n:,} sentences peaked at {peak - lengths_bytes:,} bytes"
