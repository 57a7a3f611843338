"""Data diversification (train.diversify): at BiT's switch the model translates the training split both
ways, later epochs train on the split plus those pairs, the ranks hold the same made pairs, and a resumed
run reads them back instead of translating again."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file

from test_train_bidirectional import data_dir, prepare  # noqa: F401  (a 200-pair shared-vocabulary slice)
from test_train_ddp import spawn_two_ranks
from test_train_run import train_in_process, write_config
from transduce.config import ConfigError
from transduce.data import PreparedData
from transduce.data.diversified import Diversified
from transduce.model import Transformer
from transduce.train import diversify
from transduce.train.config import load_config, model_config
from transduce.train.distributed import Dist


def test_the_split_holds_the_pairs_then_the_made_targets_then_the_made_sources(data_dir):  # noqa: F811
    split = PreparedData.open(data_dir).split("train")
    n = len(split)
    forward = [[7, i % 50 + 10] for i in range(n)]
    backward = [[9] * (i % 3 + 1) if i % 4 else None for i in range(n)]  # every 4th left out
    both = Diversified(split, forward, backward)
    kept = n - len(range(0, n, 4))
    assert both.kept == {"forward": n, "backward": kept} and len(both) == 2 * n + kept
    assert both.name == "train+forward+backward"
    for i in (0, 1, n - 1):
        assert both.src[i].tolist() == split.src[i].tolist() and both.tgt[i].tolist() == split.tgt[i].tolist()
        assert both.src[n + i].tolist() == split.src[i].tolist() and both.tgt[n + i].tolist() == forward[i]
        assert both.origin(i) == "original" and both.origin(n + i) == "forward"
    # the made sources skip pair 0 (left out): the first back-translated pair is pair 1
    assert both.src[2 * n].tolist() == backward[1] and both.tgt[2 * n].tolist() == split.tgt[1].tolist()
    assert both.origin(2 * n) == "backward" and both.origin(len(both) - 1) == "backward"
    with pytest.raises(IndexError):
        both.origin(len(both))
    only_back = Diversified(split, None, backward)
    assert only_back.name == "train+backward" and len(only_back) == n + kept
    with pytest.raises(ValueError, match="forward translations: 3 sentences for a split of 200 pairs"):
        Diversified(split, [[5]] * 3, None)


def test_stored_translations_load_back_and_a_wrong_split_is_refused(tmp_path):
    made = {"forward": [[5, 6], None, [7]], "backward": None}
    diversify.save(tmp_path / diversify.FILE, made)
    assert diversify.load(tmp_path / diversify.FILE, 3) == made
    assert not (tmp_path / (diversify.FILE + ".tmp")).exists()
    with pytest.raises(ValueError, match="forward holds 3 sentences, the training split 4"):
        diversify.load(tmp_path / diversify.FILE, 4)
    with pytest.raises(FileNotFoundError, match="made translations are missing"):
        diversify.load(tmp_path / "absent.safetensors", 3)


@pytest.mark.parametrize("override, message", [
    ("bidirectional=0.0", "'diversify'.*set bidirectional > 0 too"),
    ('diversify="sideways"', "diversify"),
])
def test_config_needs_bit_and_a_known_part(data_dir, tmp_path, override, message):  # noqa: F811
    config = write_config(tmp_path / "c.toml", data_dir, tmp_path / "run", bidirectional=0.3, diversify="both")
    with pytest.raises(ConfigError, match=message):
        load_config(config, [override])


def test_greedy_outputs_are_ids_and_unfinished_ones_are_left_out(data_dir):  # noqa: F811
    data = PreparedData.open(data_dir)
    torch.manual_seed(0)
    model = Transformer(model_config({"preset": "tiny"}, data.vocabs, "test"))
    split = data.split("train")
    sources = [split.src[i].tolist() for i in range(16)]
    decoder = diversify.decoding_copy(model, "fp32")
    out = diversify.translate_ids(decoder, sources, model.config.eos_id, torch.device("cpu"))
    assert len(out) == 16 and model.training  # the copy decodes; the training model stays in train mode
    # an untrained model babbles: whatever it ends is kept, whatever reaches the length limit is not
    for src, ids in zip(sources, out):
        assert ids is None or 0 < len(ids) < int(diversify.MAX_LEN_A * len(src) + diversify.MAX_LEN_B)
        assert ids is None or all(isinstance(i, int) and i > model.config.eos_id for i in ids)


def test_the_run_switches_to_the_diversified_split_and_resume_reads_it_back(data_dir, tmp_path, capsys):  # noqa: F811
    straight = write_config(tmp_path / "a.toml", data_dir, tmp_path / "a", bidirectional=0.25, max_steps=40,
                            max_tokens=600, save_every_steps=1000, diversify="both")
    trainer = train_in_process(straight)
    out = "".join(capsys.readouterr())
    split = trainer.forward_batches.split
    assert isinstance(split, Diversified) and trainer.batches is trainer.forward_batches and trainer.diversified
    assert "the model translated the 200 training pairs (both)" in out
    assert f"source -> target only from here, {len(split):,} pairs" in out
    stored = load_file(str(tmp_path / "a" / diversify.FILE))
    assert int(stored["forward.kept"].sum()) == split.kept["forward"]
    assert int(stored["backward.kept"].sum()) == split.kept["backward"]
    # stopped 3 updates after the switch (the end of epoch 1), resumed to the same end: the stored pairs
    switch = len(trainer.both_batches)
    assert switch + 3 < 40
    split_run = write_config(tmp_path / "b.toml", data_dir, tmp_path / "b", bidirectional=0.25,
                             max_steps=switch + 3,
                             max_tokens=600, save_every_steps=1000, diversify="both")
    first = train_in_process(split_run)
    assert first.diversified
    resumed = train_in_process(split_run, resume=True, overrides=["max_steps=40"])
    assert resumed.diversified and "the model translated" not in "".join(capsys.readouterr()).split("resumed")[-1]
    ref, got = (load_file(str(tmp_path / run / "checkpoints/step_00000040/model.safetensors")) for run in "ab")
    assert all(torch.equal(ref[k], got[k]) for k in ref)
    (tmp_path / "b" / diversify.FILE).unlink()
    with pytest.raises(FileNotFoundError, match="made translations are missing"):
        train_in_process(split_run, resume=True, overrides=["max_steps=60"])


def gather_worker(rank: int, port: int, data_dir, out) -> None:  # noqa: F811
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        data = PreparedData.open(data_dir)
        torch.manual_seed(0)
        model = Transformer(model_config({"preset": "tiny"}, data.vocabs, "test"))
        # a stand-in translator that says which rank translated each sentence: the gather must put it back
        diversify.translate_ids = lambda m, sources, eos, device: [[rank + 10] + s[::-1] for s in sources]
        made = diversify.self_translate(model, data.split("train"), "both", Dist(rank, 2), "fp32",
                                        torch.device("cpu"))
        out.put((rank, made))
    finally:
        dist.destroy_process_group()


def test_each_rank_translates_its_share_and_both_hold_every_pair_in_order(data_dir):  # noqa: F811
    results = dict(spawn_two_ranks(gather_worker, data_dir, 2))
    split = PreparedData.open(data_dir).split("train")
    assert results[0] == results[1]
    for part, side in (("forward", split.src), ("backward", split.tgt)):
        assert results[0][part] == [[i % 2 + 10] + side[i].tolist()[::-1] for i in range(len(split))]
