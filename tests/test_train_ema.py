"""The moving average of the weights (train.ema_decay, train/ema.py): the update rule, its start, checkpoints
and resume, RUN_DIR/ema-model and the recipe's third candidate."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import train_in_process, write_config, write_recipe
from safetensors.torch import load_file

from transduce.config import ConfigError
from transduce.recipe import load_recipe, run_recipe
from transduce.train.config import load_config
from transduce.train.ema import WeightEMA


def test_the_average_starts_with_a_copy_and_then_moves_by_one_minus_decay():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    ema = WeightEMA(model, decay=0.75, start=3)
    initial = model.weight.detach().clone()
    seen = []
    for step in range(1, 6):
        with torch.no_grad():
            model.weight.add_(torch.randn(2, 3))
        seen.append(model.weight.detach().clone())
        ema.update(model, step)
        if step < 3:  # before the start: untouched, nothing counted
            assert ema.updates == 0 and torch.equal(ema.model.weight, initial)
    want = seen[2]  # update 3 copies; 4 and 5 move a quarter of the way
    for w in seen[3:]:
        want = 0.75 * want + 0.25 * w
    torch.testing.assert_close(ema.model.weight, want, rtol=0, atol=1e-6)
    assert ema.updates == 3 and not ema.model.weight.requires_grad


def test_the_average_starts_when_the_caller_says_the_warm_up_ended_in_time():
    model = torch.nn.Linear(3, 2)
    ema = WeightEMA(model, decay=0.75, start=600)
    ema.update(model, 5)
    assert ema.updates == 0
    ema.update(model, 6, begun=True)  # warmup_share of the budget used before 600 updates
    ema.update(model, 7)
    assert ema.updates == 2


def test_config_names_an_impossible_warmup_share(data_dir, tmp_path):
    config = write_config(tmp_path / "c.toml", data_dir, tmp_path / "run")
    for bad in ("warmup_share=1.0", "warmup_share=-0.1"):
        with pytest.raises(ConfigError, match="warmup_share"):
            load_config(config, ["schedule=linear", bad])
    with pytest.raises(ConfigError, match="warmup_share.*linear"):
        load_config(config, ["schedule=rsqrt", "warmup_share=0.25"])
    assert load_config(config, ["schedule=linear", "warmup_share=0.25"])[0].warmup_share == 0.25


def test_config_names_an_impossible_decay_or_a_start_without_one(data_dir, tmp_path):
    config = write_config(tmp_path / "c.toml", data_dir, tmp_path / "run")
    for bad in ("ema_decay=1.0", "ema_decay=-0.1"):
        with pytest.raises(ConfigError, match="ema_decay"):
            load_config(config, [bad])
    with pytest.raises(ConfigError, match="ema_start.*ema_decay"):
        load_config(config, ["ema_start=4"])
    with pytest.raises(ConfigError, match="ema_start"):
        load_config(config, ["ema_decay=0.9", "ema_start=0"])


@pytest.mark.slow
def test_an_ema_run_checkpoints_the_average_resumes_it_bit_identically_and_saves_ema_model(data_dir, tmp_path):
    settings = dict(ema_decay=0.5, ema_start=3)
    ref = train_in_process(write_config(tmp_path / "ref.toml", data_dir, tmp_path / "ref", **settings))
    assert ref.ema.updates == 6  # updates 3..8
    # four updates, then --resume to eight: the same average as the uninterrupted run
    half = write_config(tmp_path / "half.toml", data_dir, tmp_path / "half", max_steps=4, **settings)
    train_in_process(half)
    train_in_process(half, resume=True, overrides=["max_steps=8"])
    step8 = "checkpoints/step_00000008"
    want, got = (load_file(str(tmp_path / run / step8 / "ema.safetensors")) for run in ("ref", "half"))
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    assert json.loads((tmp_path / "half" / step8 / "state.json").read_text())["ema_updates"] == 6
    # RUN_DIR/ema-model holds the average, which is neither the last weights nor update 2's
    saved = load_file(str(tmp_path / "ref/ema-model/model.safetensors"))
    assert all(torch.equal(saved[k], want[k]) for k in saved)
    for other in ("checkpoints/step_00000008/model.safetensors", "checkpoints/step_00000002/model.safetensors"):
        weights = load_file(str(tmp_path / "ref" / other))
        assert not all(torch.equal(saved[k], weights[k]) for k in saved), other
    assert "updates 3-8" in (tmp_path / "ref/ema-model/config.toml").read_text()
    # a checkpoint without an average cannot resume a run that keeps one
    plain = write_config(tmp_path / "plain.toml", data_dir, tmp_path / "plain", max_steps=2)
    train_in_process(plain)
    with pytest.raises(ConfigError, match="step_00000002.*ema_decay"):
        train_in_process(plain, resume=True, overrides=["max_steps=4", "ema_decay=0.5"])


@pytest.mark.slow
def test_a_recipe_with_ema_scores_the_average_as_a_third_candidate(multi30k_raw, tmp_path):
    out = tmp_path / "out"
    overrides = ["train.ema_decay=0.8", "evaluate.alpha=0.6"]  # one α: a third of the decodes
    recipe = load_recipe(write_recipe(tmp_path / "r.toml", multi30k_raw, out, 1), overrides)
    results = run_recipe(recipe)
    saved = json.loads((out / "results.json").read_text())
    assert set(saved["scores"]) == {"final", "averaged", "ema"}
    valid = {name: s["valid"]["bleu"] for name, s in saved["scores"].items()}
    chosen = saved["chosen"]
    assert valid[chosen] == max(valid.values()) and results["chosen"] == chosen
    source = {"final": out / "run/model", "averaged": out / "averaged", "ema": out / "run/ema-model"}[chosen]
    want, got = (load_file(str(d / "model.safetensors")) for d in (source, out / "model"))
    assert all(torch.equal(want[k], got[k]) for k in want)
