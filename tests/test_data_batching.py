"""Token-budget batches: format, budget, determinism from (seed, epoch), resume, rank shards."""

import numpy as np
import pytest
import torch
from conftest import read_corpus

from transduce.data import PreparedData
from transduce.data.batching import TokenBatches, _greedy_bounds
from transduce.data.build import BuildSettings, build
from transduce.data.corpora import Corpus, SplitText


@pytest.fixture(scope="module")
def train(tmp_path_factory):
    """The first 3,000 en-fr training pairs of the shipped corpus, prepared."""
    en, fr = read_corpus("train", "en", 3000), read_corpus("train", "fr", 3000)
    out = tmp_path_factory.mktemp("batching")
    build(Corpus("slice", "en", "fr", {"train": SplitText(en, fr)}, {}), BuildSettings(vocab_size=1000), out)
    return PreparedData.open(out).split("train")


def as_lists(batches):
    return [b.index.tolist() for b in batches]


def test_batch_format_and_budget(train):
    batches = TokenBatches(train, max_tokens=1000, seed=3)
    seen = []
    for b in batches.epoch(0):
        B, S = b.src.shape
        assert b.src.dtype == b.tgt.dtype == torch.int64
        assert B * max(S, b.tgt.shape[1]) <= 1000
        for row, i in enumerate(b.index.tolist()):
            s, t = train.src[i], train.tgt[i]
            assert b.src[row, : len(s) + 1].tolist() == [*s, 3] and not b.src[row, len(s) + 1 :].any()
            assert b.tgt[row, : len(t) + 2].tolist() == [2, *t, 3] and not b.tgt[row, len(t) + 2 :].any()
        assert b.src_tokens == int((b.src != 0).sum()) and b.tgt_tokens == int((b.tgt[:, 1:] != 0).sum())
        seen += b.index.tolist()
    assert sorted(seen) == list(range(len(train)))  # every sentence once, nothing dropped


def test_same_seed_same_batches_other_seed_or_epoch_differs(train):
    a = as_lists(TokenBatches(train, 800, seed=1).epoch(2))
    assert a == as_lists(TokenBatches(train, 800, seed=1).epoch(2))
    assert a != as_lists(TokenBatches(train, 800, seed=2).epoch(2))
    assert a != as_lists(TokenBatches(train, 800, seed=1).epoch(3))
    ordered = TokenBatches(train, 800, shuffle=False)
    assert as_lists(ordered.epoch(0)) == as_lists(ordered.epoch(5))


def test_resume_inside_an_epoch(train):
    batches = TokenBatches(train, 800, seed=4)
    full = as_lists(batches.epoch(1))
    assert as_lists(batches.epoch(1, start=7)) == full[7:]


@pytest.mark.parametrize("world_size", [2, 3, 5])
def test_rank_shards_disjoint_complete_equal(train, world_size):
    single = TokenBatches(train, 700, seed=9)
    shards = [TokenBatches(train, 700, seed=9, rank=r, world_size=world_size) for r in range(world_size)]
    lengths = {len(s.epoch(1)) for s in shards}
    assert lengths == {len(shards[0])}  # the same number of batches on every rank
    assert len(shards[0]) * world_size >= len(single)
    ids = np.concatenate([np.concatenate(s.indices(1)) for s in shards])
    assert sorted(ids.tolist()) == list(range(len(train)))  # disjoint and covering the epoch


def test_padding_small_and_errors(train):
    assert TokenBatches(train, 1000).padding_fraction() < 0.1  # a real corpus slice, length-sorted buckets
    assert TokenBatches(train, 1000, shuffle=False).padding_fraction() == TokenBatches(train, 1000).padding_fraction()
    with pytest.raises(ValueError, match="sentence .* needs .* more than max_tokens=20"):
        TokenBatches(train, 20)
    with pytest.raises(ValueError, match="rank 2 is not in 0..1"):
        TokenBatches(train, 4096, rank=2, world_size=2)


def test_plan_is_the_documented_algorithm_over_small_dtypes(train):
    """Permute, stable-sort by (max(S, T), T, S), fill greedily, shuffle the batches (step 1-4), computed here
    in int64 as written: the compact arrays change nothing, so a checkpoint resumes into the same epoch."""
    assert train.src.lengths.dtype == train.tgt.lengths.dtype == np.int16
    plan = TokenBatches(train, 800, seed=4).indices(1)
    assert {p.dtype for p in plan} == {np.dtype(np.int32)}
    rng = np.random.default_rng([4, 1])
    order = rng.permutation(len(train))
    s, t = train.src.lengths.astype(np.int64) + 1, train.tgt.lengths.astype(np.int64) + 2
    w = np.maximum(s, t)
    order = order[np.lexsort((s[order], t[order], w[order]))]
    expected = [order[a:b] for a, b in _greedy_bounds(w[order], 800)]
    expected = [expected[i] for i in rng.permutation(len(expected))]
    assert [p.tolist() for p in plan] == [e.tolist() for e in expected]
