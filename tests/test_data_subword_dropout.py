"""BPE-dropout: a new segmentation each epoch that loses no text and no pair; a resumed run reuses the stored one."""

import hashlib
import pytest

from conftest import read_multi30k
from transduce.data import PreparedData
from transduce.data.batching import TokenBatches
from transduce.data.build import BuildSettings, build
from transduce.data.corpora import Corpus, SplitText
from transduce.data.subword_dropout import SampledSplit

@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """The first 2,000 Multi30k en-de training pairs, prepared with a lowercasing 1,000-piece vocabulary."""
    en, de = read_multi30k("train", "en", 2000), read_multi30k("train", "de", 2000)
    out = tmp_path_factory.mktemp("bpe-dropout")
    build(Corpus("slice", "en", "de", {"train": SplitText(en, de)}, {}), BuildSettings(vocab_size=1000,
                                                                                        lowercase=True), out)
    return PreparedData.open(out)


def ids(arr):
    return [arr[i].tolist() for i in range(len(arr))]


def digest(split: SampledSplit) -> str:
    return hashlib.sha256(split.src.ids.tobytes() + split.tgt.ids.tobytes()).hexdigest()


def test_the_prepared_ids_are_the_deterministic_segmentation_of_the_stored_text(data):
    train = data.split("train")
    assert data.vocabs.src.encode_batch(train.lines("src")) == ids(train.src)
    assert data.vocabs.tgt.encode_batch(train.lines("tgt")) == ids(train.tgt)


def test_sampled_segmentations_are_reproducible_longer_and_lose_no_text(data):
    train, vocab = data.split("train"), data.vocabs.src
    a = SampledSplit.sample(train, data.vocabs, 0.1, seed=[1, 1], max_width=1000)
    assert digest(a) == digest(SampledSplit.sample(train, data.vocabs, 0.1, seed=[1, 1], max_width=1000))
    assert digest(a) != digest(SampledSplit.sample(train, data.vocabs, 0.1, seed=[1, 2], max_width=1000))
    assert digest(a) != digest(SampledSplit.sample(train, data.vocabs, 0.1, seed=[2, 1], max_width=1000))
    assert len(a) == len(train) and a.kept == 0
    assert a.tokens[0] > 1.05 * a.base_tokens[0] and a.tokens[1] > 1.05 * a.base_tokens[1]
    changed = sum(a.src[i].tolist() != train.src[i].tolist() for i in range(len(train)))
    assert changed > len(train) // 2
    for side, arr in (("src", a.src), ("tgt", a.tgt)):  # every sentence decodes back to its (lowercased) text
        assert [vocab.decode(arr[i]) for i in range(len(arr))] == [vocab.normalize(t) for t in train.lines(side)]
    assert "source and" in a.describe() and "0 pair(s) kept" in a.describe()


def test_pairs_too_long_for_a_batch_keep_their_prepared_ids(data):
    train = data.split("train")
    width = int(max((train.src.lengths + 1).max(), (train.tgt.lengths + 2).max()))  # the longest prepared pair
    a = SampledSplit.sample(train, data.vocabs, 0.3, seed=[1, 1], max_width=width)
    assert 0 < a.kept < len(train)
    too_long = 0
    for i in range(len(train)):
        assert len(a.src[i]) + 1 <= width and len(a.tgt[i]) + 2 <= width
        too_long += a.src[i].tolist() == train.src[i].tolist() and a.tgt[i].tolist() == train.tgt[i].tolist()
    assert too_long >= a.kept
    assert len(TokenBatches(a, max_tokens=width, seed=1).epoch(1)) > 0  # batches accept every pair
    with pytest.raises(ValueError, match="subword dropout"):
        SampledSplit.sample(train, data.vocabs, 0.0, seed=[1, 1], max_width=width)


def test_the_segmentation_survives_a_round_trip_through_a_checkpoint_file(data, tmp_path):
    from safetensors.torch import load_file, save_file

    train = data.split("train")
    a = SampledSplit.sample(train, data.vocabs, 0.1, seed=[3, 7], max_width=1000)
    save_file(a.tensors(), str(tmp_path / "subwords.safetensors"))
    b = SampledSplit.from_tensors(train, load_file(str(tmp_path / "subwords.safetensors")))
    assert digest(a) == digest(b) and b.kept == a.kept and b.tokens == a.tokens
    other = data.split("train")
    other.src.offsets = other.src.offsets[:-1]  # a segmentation must cover the split it is used with
    other.src.lengths = other.src.lengths[:-1]
    with pytest.raises(ValueError, match="another data directory"):
        SampledSplit.from_tensors(other, load_file(str(tmp_path / "subwords.safetensors")))
