"""The recipe end to end on a Multi30k-shaped directory of the shipped corpus (en-fr): prepare → train → average → choose on valid → test,
in-process and under torchrun with two processes (gloo)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import RECIPE_SIZES, write_recipe
from safetensors.torch import load_file

from transduce.config import ConfigError
from transduce.recipe import load_recipe, member_recipe, run_recipe


@pytest.mark.slow
def test_recipe_runs_end_to_end_and_chooses_on_valid(finished_recipe):
    path, results = finished_recipe
    check_finished(path.parent / "out", results, processes=1)


@pytest.mark.slow
def test_recipe_runs_end_to_end_under_torchrun_with_two_processes(multi30k_raw, tmp_path):
    out = tmp_path / "out"
    results = run_recipe(load_recipe(write_recipe(tmp_path / "r.toml", multi30k_raw, out, 2)))
    check_finished(out, results, processes=2)


def check_finished(out: Path, results: dict, processes: int) -> None:
    """What a finished run of :func:`write_recipe` holds: its figures, the model chosen on valid, its test."""
    saved = json.loads((out / "results.json").read_text())
    assert saved["train"]["step"] == 12 and saved["train_processes"] == processes
    assert saved["averaged_checkpoints"] == 3 and set(saved["scores"]) == {"final", "averaged"}
    chosen = saved["chosen"]
    assert saved["chosen_by"] == "bleu"  # cased output: sacreBLEU
    valid = {name: s["valid"]["bleu"] for name, s in saved["scores"].items()}
    assert valid[chosen] == max(valid.values())
    assert "test" in saved["scores"][chosen] and all("test" not in s for n, s in saved["scores"].items() if n != chosen)
    test = saved["scores"][chosen]["test"]
    assert test["sentences"] == RECIPE_SIZES["test_2016_flickr"] and 0 <= test["tok_lc_bleu"] <= 100
    assert len((out / "test.hyp").read_text().splitlines()) == RECIPE_SIZES["test_2016_flickr"]
    sweep = saved["alpha_sweep_valid_bleu"][chosen]  # α chosen on valid too, and used on test
    assert set(sweep) == {"0.0", "0.6", "2.0"} and sweep[str(test["alpha"])] == max(sweep.values())
    assert saved["decode"]["alpha"] == test["alpha"] == saved["scores"][chosen]["valid"]["alpha"]
    assert (out / "model" / "config.toml").is_file() and results["chosen"] == chosen
    if shutil.which("c++") is not None:  # the last stage: int8-native against fp32 on valid, kept in the model
        record = json.loads((out / "model" / "backends.json").read_text())
        assert record["data"].endswith(" valid") and record["beam"] == 2 and record["sentences"] > 0
        assert saved["backends"].startswith("bleu fp32") and f"{record['delta']:+.2f}" in saved["backends"]


@pytest.mark.slow
def test_a_lowercased_recipe_chooses_alpha_and_model_on_tok_lc_bleu(multi30k_raw, tmp_path, monkeypatch):
    # Cased sacreBLEU of lowercase output is meaningless. Scores are rigged so that the two metrics
    # disagree: tok-lc BLEU prefers alpha 2.0 and the averaged model, sacreBLEU alpha 0.0 and the final one.
    import transduce.api
    import transduce.recipe as recipe_module

    real = recipe_module._score

    def rigged(evaluate_model, translator, data, split, decode, hyp_path=None):
        result = real(evaluate_model, translator, data, split, decode, hyp_path)
        averaged = translator is rigged.translators.get("averaged")
        result["tok_lc_bleu"] = 10 * decode["alpha"] + averaged
        result["bleu"] = 10 * (2.0 - decode["alpha"]) + (not averaged)
        return result

    rigged.translators = {}
    real_load = transduce.api.load

    def load(directory, **kw):
        translator = real_load(directory, **kw)
        rigged.translators["averaged" if Path(directory).name == "averaged" else "final"] = translator
        return translator

    monkeypatch.setattr(recipe_module, "_score", rigged)
    monkeypatch.setattr(transduce.api, "load", load)
    out = tmp_path / "out"
    run_recipe(load_recipe(write_recipe(tmp_path / "r.toml", multi30k_raw, out, 1), ["prepare.lowercase=true"]))
    saved = json.loads((out / "results.json").read_text())
    assert saved["chosen_by"] == "tok_lc_bleu" and saved["chosen"] == "averaged"
    assert saved["decode"]["alpha"] == 2.0 and saved["scores"]["averaged"]["test"]["alpha"] == 2.0
    assert saved["alpha_sweep_valid_bleu"]["averaged"] == {"0.0": 1.0, "0.6": 7.0, "2.0": 21.0}


def test_recipe_rejects_unknown_keys_and_bad_values(multi30k_raw, tmp_path):
    path = write_recipe(tmp_path / "r.toml", multi30k_raw, tmp_path / "out", 1)
    with pytest.raises(ConfigError, match="processes"):
        load_recipe(path, ["recipe.processes=0"])
    with pytest.raises(ConfigError, match="'members'"):
        load_recipe(path, ["recipe.members=0"])
    with pytest.raises(ConfigError, match="'seed'.*members > 1"):
        load_recipe(path, ["recipe.members=2", "recipe.seed=0"])
    with pytest.raises(ConfigError, match=r"\[train\] seed.*recipe.seed"):
        run_recipe(load_recipe(path, ["recipe.members=2", "train.seed=5"]))
    with pytest.raises(ConfigError, match="alpha"):
        load_recipe(path, ["evaluate.alpha=[]"])
    with pytest.raises(ConfigError, match="vocab_sise"):
        load_recipe(path, ["prepare.vocab_sise=10"])
    with pytest.raises(ConfigError, match="'extra_src'.*only the bible corpus"):
        load_recipe(path, ['prepare.extra_src=["k"]'])
    bible = load_recipe(path, ['prepare.corpus="bible"', 'prepare.src="4"', 'prepare.extra_src=["k", "3"]'])
    argv = bible.prepare.argv(tmp_path)
    assert argv[argv.index("--extra-src") + 1] == "k,3"
    for bad in ("[]", "[5, 5]", "-1", "[3, -2]", "2.5", "[5, 2.5]"):
        with pytest.raises(ConfigError, match="'last'"):
            load_recipe(path, [f"average.last={bad}"])
    with pytest.raises(ConfigError, match=r"unknown table \[fp32\]"):
        path.write_text(path.read_text() + "[fp32]\ntrain.peak_lr = 0.004\n")
        load_recipe(path)


def test_the_multi30k_recipe_is_muon_gelu_weight_decay_r_drop_and_ema_in_bf16_and_fp32_alike():
    config = Path(__file__).resolve().parents[1] / "configs" / "multi30k-en-de.toml"
    recipes = [load_recipe(config, [f'train.dtype="{dtype}"']) for dtype in ("bf16", "fp32")]
    for recipe in recipes:
        train = {
            key: recipe.train[key]
            for key in ("optimizer", "peak_lr", "weight_decay", "rdrop_alpha", "ema_decay", "schedule")
        }
        assert train == {
            "optimizer": "muon",
            "peak_lr": 0.006,
            "weight_decay": 0.1,
            "rdrop_alpha": 2.0,
            "ema_decay": 0.999,
            "schedule": "linear",
        }
        assert recipe.model["activation"] == "gelu"
    assert recipes[0].train == {**recipes[1].train, "dtype": "bf16"}


def test_evaluate_only_needs_a_finished_run(multi30k_raw, tmp_path):
    path = write_recipe(tmp_path / "r.toml", multi30k_raw, tmp_path / "out", 1)
    with pytest.raises(FileNotFoundError, match="results.json"):
        run_recipe(load_recipe(path), evaluate_only=True)


@pytest.mark.slow
def test_evaluate_only_rescores_a_finished_run_and_keeps_its_training_figures(finished_recipe, multi30k_raw, tmp_path):
    finished, first = finished_recipe
    out = tmp_path / "out"
    shutil.copytree(finished.parent / "out", out)
    path = write_recipe(tmp_path / "r.toml", multi30k_raw, out, 1)
    again = run_recipe(load_recipe(path, ["evaluate.alpha=1.0", "evaluate.beam=1"]), evaluate_only=True)
    assert again["train_wall_s"] == first["train_wall_s"] and again["train"] == first["train"]
    assert again["decode"]["alpha"] == 1.0 and again["decode"]["beam"] == 1
    assert "alpha_sweep_valid_bleu" not in again
    assert json.loads((out / "results.json").read_text())["decode"]["beam"] == 1
    # several averaging windows: each is a candidate on valid; one larger than the checkpoints kept is capped
    kept = len(list((out / "run" / "checkpoints").glob("step_*")))
    windows = run_recipe(load_recipe(path, [f"average.last=[2, {kept + 5}, 3]"]), evaluate_only=True)
    assert windows["averaged_checkpoints"] == [2, kept, 3]
    assert list(windows["scores"]) == ["final", "averaged 2", f"averaged {kept}", "averaged 3"]
    assert all((out / f"averaged-{n}" / "model.safetensors").is_file() for n in (2, 3, kept))
    valid = {name: s["valid"]["bleu"] for name, s in windows["scores"].items()}
    assert valid[windows["chosen"]] == max(valid.values()) and "test" in windows["scores"][windows["chosen"]]


def test_members_seeds_never_overlap_between_recipe_seeds(multi30k_raw, tmp_path):
    path = write_recipe(tmp_path / "r.toml", multi30k_raw, tmp_path / "out", 1)
    seeds = [load_recipe(path, ["recipe.members=3", f"recipe.seed={s}"]).recipe.member_seeds() for s in (1, 2, 3)]
    assert seeds == [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    member = member_recipe(load_recipe(path, ["recipe.members=2", "recipe.seed=2"]), 2)
    assert member.recipe.seed == 4 and member.recipe.members == 1
    assert member.out == tmp_path / "out" / "member-2" and member.data_dir == tmp_path / "out" / "data"


@pytest.mark.slow
def test_members_train_at_once_and_their_ensemble_competes_on_valid(multi30k_raw, tmp_path):
    out = tmp_path / "out"
    # one α (choosing it is test_a_lowercased_recipe_chooses_alpha_and_model_on_tok_lc_bleu's): a third of the decodes
    overrides = ["recipe.members=2", "recipe.seed=2", "evaluate.alpha=0.6"]
    recipe = load_recipe(write_recipe(tmp_path / "r.toml", multi30k_raw, out, 1), overrides)
    results = run_recipe(recipe)
    saved = json.loads((out / "results.json").read_text())
    assert saved["members"] == 2 and saved["member_seeds"] == [3, 4] and saved["train"]["step"] == [12, 12]
    weights = []
    for i, seed in ((1, 3), (2, 4)):  # each member a whole run of its own, from its own seed
        member = json.loads((out / f"member-{i}" / "results.json").read_text())
        assert member["seed"] == seed and member["train"]["step"] == 12
        assert "step 12" in (out / f"member-{i}" / "train.log").read_text()
        weights.append(load_file(out / f"member-{i}" / "run" / "model" / "model.safetensors"))
    assert any(not torch.equal(weights[0][name], weights[1][name]) for name in weights[0])
    assert set(saved["scores"]) == {"ensemble", "member 1", "member 2"}
    assert "ref_perplexity" not in saved["scores"]["ensemble"]["valid"]  # decoded as an ensemble: no one model's
    valid = {name: s["valid"]["bleu"] for name, s in saved["scores"].items()}
    chosen = saved["chosen"]
    assert valid[chosen] == max(valid.values()) and results["chosen"] == chosen
    assert [n for n, s in saved["scores"].items() if "test" in s] == [chosen]
    assert len((out / "test.hyp").read_text().splitlines()) == RECIPE_SIZES["test_2016_flickr"]
    if chosen == "ensemble":
        assert saved["model"] == str(out / "member-1" / "model") and saved["ensemble"] == [
            str(out / "member-2" / "model")
        ]
    else:
        assert (out / "model" / "config.toml").is_file() and "ensemble" not in saved
    again = run_recipe(recipe, evaluate_only=True)  # members and ensemble scored again, training figures kept
    assert again["train"] == saved["train"] and again["chosen"] == chosen
    assert again["scores"]["ensemble"]["valid"]["bleu"] == saved["scores"]["ensemble"]["valid"]["bleu"]


@pytest.mark.slow
def test_a_failing_member_stops_the_others_and_names_its_log(multi30k_raw, tmp_path):
    out = tmp_path / "out"
    recipe = load_recipe(write_recipe(tmp_path / "r.toml", multi30k_raw, out, 1), ["recipe.members=2"])
    recipe.train["max_tokens"] = 0  # rejected by `transduce train` in each member's process
    with pytest.raises(RuntimeError, match=r"member-\d/train\.log"):
        run_recipe(recipe)
    assert "max_tokens" in (out / "member-1" / "train.log").read_text() + (out / "member-2" / "train.log").read_text()
