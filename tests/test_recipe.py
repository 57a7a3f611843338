"""The recipe end to end on a small Multi30k slice: prepare → train → average → choose on valid → test,
in-process and under torchrun with two processes (gloo)."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from conftest import read_multi30k
from transduce.config import ConfigError
from transduce.recipe import load_recipe, run_recipe

SIZES = {"train": 1500, "val": 60, "test_2016_flickr": 40}


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
    """A Multi30k-shaped directory holding the first lines of each real file."""
    root = tmp_path_factory.mktemp("m30k-raw")
    for split, n in SIZES.items():
        for lang in ("en", "de"):
            with gzip.open(root / f"{split}.{lang}.gz", "wt", encoding="utf-8") as f:
                f.write("\n".join(read_multi30k(split, lang, n)) + "\n")
    return root


def write_recipe(path: Path, raw: Path, out: Path, processes: int) -> Path:
    path.write_text(f"""
[recipe]
out = "{out}"
processes = {processes}
[prepare]
corpus = "multi30k"
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
subword_dropout = {0.1 if processes == 2 else 0.0}
[average]
last = 3
[evaluate]
beam = 2
alpha = [0.0, 0.6, 2.0]
""")
    return path


@pytest.mark.parametrize("processes", [1, 2])
def test_recipe_runs_end_to_end_and_chooses_on_valid(raw, tmp_path, processes):
    out = tmp_path / "out"
    results = run_recipe(load_recipe(write_recipe(tmp_path / "r.toml", raw, out, processes)))
    saved = json.loads((out / "results.json").read_text())
    assert saved["train"]["step"] == 12 and saved["train_processes"] == processes
    assert saved["averaged_checkpoints"] == 3 and set(saved["scores"]) == {"final", "averaged"}
    chosen = saved["chosen"]
    assert saved["chosen_by"] == "bleu"  # cased output: sacreBLEU
    valid = {name: s["valid"]["bleu"] for name, s in saved["scores"].items()}
    assert valid[chosen] == max(valid.values())
    assert "test" in saved["scores"][chosen] and all("test" not in s for n, s in saved["scores"].items() if n != chosen)
    test = saved["scores"][chosen]["test"]
    assert test["sentences"] == SIZES["test_2016_flickr"] and 0 <= test["tok_lc_bleu"] <= 100
    assert len((out / "test.hyp").read_text().splitlines()) == SIZES["test_2016_flickr"]
    sweep = saved["alpha_sweep_valid_bleu"][chosen]  # α chosen on valid too, and used on test
    assert set(sweep) == {"0.0", "0.6", "2.0"} and sweep[str(test["alpha"])] == max(sweep.values())
    assert saved["decode"]["alpha"] == test["alpha"] == saved["scores"][chosen]["valid"]["alpha"]
    assert (out / "model" / "config.toml").is_file() and results["chosen"] == chosen
    assert saved["fp32_table"] == {}  # the recipe has no [fp32] table
    if shutil.which("c++") is not None:  # the last stage: int8-native against fp32 on valid, kept in the model
        record = json.loads((out / "model" / "backends.json").read_text())
        assert record["data"].endswith(" valid") and record["beam"] == 2 and record["sentences"] > 0
        assert saved["backends"].startswith("bleu fp32") and f"{record['delta']:+.2f}" in saved["backends"]
    if processes == 2:  # BPE-dropout under torchrun: rank 0 samples the epoch's segmentation, rank 1 receives it
        assert list((out / "run" / "checkpoints").glob("step_*/subwords.safetensors"))


def test_a_lowercased_recipe_chooses_alpha_and_model_on_tok_lc_bleu(raw, tmp_path, monkeypatch):
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
    run_recipe(load_recipe(write_recipe(tmp_path / "r.toml", raw, out, 1), ["prepare.lowercase=true"]))
    saved = json.loads((out / "results.json").read_text())
    assert saved["chosen_by"] == "tok_lc_bleu" and saved["chosen"] == "averaged"
    assert saved["decode"]["alpha"] == 2.0 and saved["scores"]["averaged"]["test"]["alpha"] == 2.0
    assert saved["alpha_sweep_valid_bleu"]["averaged"] == {"0.0": 1.0, "0.6": 7.0, "2.0": 21.0}


def test_recipe_rejects_unknown_keys_and_bad_values(raw, tmp_path):
    path = write_recipe(tmp_path / "r.toml", raw, tmp_path / "out", 1)
    with pytest.raises(ConfigError, match="processes"):
        load_recipe(path, ["recipe.processes=0"])
    with pytest.raises(ConfigError, match="alpha"):
        load_recipe(path, ["evaluate.alpha=[]"])
    with pytest.raises(ConfigError, match="vocab_sise"):
        load_recipe(path, ["prepare.vocab_sise=10"])
    for bad in ("[]", "[5, 5]", "-1", "[3, -2]", "2.5", "[5, 2.5]"):
        with pytest.raises(ConfigError, match="'last'"):
            load_recipe(path, [f"average.last={bad}"])
    for bad in ("0.5", "[-1.0]", "[1.0, 1.0]", '["a"]', "[true]"):
        with pytest.raises(ConfigError, match="'channel_weights'"):
            load_recipe(path, [f"evaluate.channel_weights={bad}"])
    for bad in ("-1", "3"):  # beam 2
        with pytest.raises(ConfigError, match="'channel_candidates'"):
            load_recipe(path, [f"evaluate.channel_candidates={bad}"])


def test_the_fp32_table_applies_where_training_runs_in_fp32_and_the_command_line_wins(raw, tmp_path, monkeypatch):
    import transduce.train.step as step
    from transduce.recipe import write_train_config

    path = write_recipe(tmp_path / "r.toml", raw, tmp_path / "out", 1)  # [train] dtype = "bf16", peak_lr = 0.003
    path.write_text(path.read_text() + '[fp32]\ntrain.peak_lr = 0.004\nmodel.activation = "gelu"\n')
    bf16 = load_recipe(path)
    assert bf16.train["peak_lr"] == 0.003 and "activation" not in bf16.model and bf16.fp32_applied == {}
    assert bf16.fp32_why.startswith("[fp32] not applied: dtype bf16")
    fp32 = load_recipe(path, ['train.dtype="fp32"'])
    assert fp32.fp32_applied == {"train.peak_lr": 0.004, "model.activation": "gelu"}
    assert fp32.train["peak_lr"] == 0.004 and fp32.model == {"preset": "tiny", "activation": "gelu"}
    fp32.out.mkdir()
    assert "peak_lr = 0.004" in write_train_config(fp32).read_text()
    mine = load_recipe(path, ['train.dtype="fp32"', "train.peak_lr=0.005", "fp32.train.warmup=8"])
    assert mine.train["peak_lr"] == 0.005 and mine.train["warmup"] == 8  # --set over [fp32] over [train]
    assert mine.fp32_applied == {"train.warmup": 8, "model.activation": "gelu"}
    off = load_recipe(path, ['train.dtype="fp32"', "recipe.use_fp32_table=false"])
    assert off.train["peak_lr"] == 0.003 and off.fp32_applied == {} and "use_fp32_table" in off.fp32_why
    for native, applied in ((False, True), (True, False)):  # dtype "auto" resolves on the machine
        monkeypatch.setattr(step, "native_bf16", lambda device_type, ok=native: (ok, "as the test says"))
        auto = load_recipe(path, ['train.dtype="auto"', 'train.device="cpu"'])
        assert bool(auto.fp32_applied) is applied and auto.train["peak_lr"] == (0.004 if applied else 0.003)


def test_the_fp32_table_names_what_it_cannot_set(raw, tmp_path):
    path = write_recipe(tmp_path / "r.toml", raw, tmp_path / "out", 1)
    text = path.read_text()
    path.write_text(text + "[fp32]\nevaluate.beam = 3\n")
    with pytest.raises(ConfigError, match=r"\[fp32\]: unknown entry 'evaluate'"):
        load_recipe(path)
    path.write_text(text + "[fp32]\npeak_lr = 0.004\n")
    with pytest.raises(ConfigError, match=r"\[fp32\]: unknown entry 'peak_lr'"):
        load_recipe(path)
    path.write_text(text)
    for bad in ("fp32.peak_lr=0.004", "fp32.evaluate.beam=3", "fp32.train=1"):
        with pytest.raises(ConfigError, match="an \\[fp32\\] entry is train.KEY or model.KEY"):
            load_recipe(path, [bad])


def test_the_multi30k_recipe_is_muon_gelu_weight_decay_and_ema_without_bit_in_bf16_and_fp32_alike():
    config = Path(__file__).resolve().parents[1] / "configs" / "multi30k-en-de.toml"
    recipes = [load_recipe(config, [f'train.dtype="{dtype}"']) for dtype in ("bf16", "fp32")]
    for recipe in recipes:
        assert recipe.fp32_applied == {}
        train = {key: recipe.train[key] for key in ("optimizer", "peak_lr", "weight_decay", "bidirectional",
                                                    "diversify", "rdrop_alpha", "ema_decay")}
        assert train == {"optimizer": "muon", "peak_lr": 0.006, "weight_decay": 0.1, "bidirectional": 0,
                         "diversify": "off", "rdrop_alpha": 2.0, "ema_decay": 0.999}
        assert recipe.model["activation"] == "gelu"
    assert recipes[0].train == {**recipes[1].train, "dtype": "bf16"}


def test_evaluate_only_rescores_a_finished_run_and_keeps_its_training_figures(raw, tmp_path):
    out = tmp_path / "out"
    path = write_recipe(tmp_path / "r.toml", raw, out, 1)
    with pytest.raises(FileNotFoundError, match="results.json"):
        run_recipe(load_recipe(path), evaluate_only=True)
    first = run_recipe(load_recipe(path))
    again = run_recipe(load_recipe(path, ["evaluate.alpha=1.0", "evaluate.beam=1"]), evaluate_only=True)
    assert again["train_wall_s"] == first["train_wall_s"] and again["train"] == first["train"]
    assert again["fp32_table"] == first["fp32_table"] == {}
    assert again["decode"]["alpha"] == 1.0 and again["decode"]["beam"] == 1
    assert "alpha_sweep_valid_bleu" not in again
    assert json.loads((out / "results.json").read_text())["decode"]["beam"] == 1
    # reranking needs the channel model that only a BiT run leaves
    with pytest.raises(ConfigError, match="'channel_weights'.*bit-model"):
        run_recipe(load_recipe(path, ["evaluate.channel_weights=[0.0, 1.0]"]), evaluate_only=True)
    # several averaging windows: each is a candidate on valid; one larger than the checkpoints kept is capped
    kept = len(list((out / "run" / "checkpoints").glob("step_*")))
    windows = run_recipe(load_recipe(path, [f"average.last=[2, {kept + 5}, 3]"]), evaluate_only=True)
    assert windows["averaged_checkpoints"] == [2, kept, 3]
    assert list(windows["scores"]) == ["final", "averaged 2", f"averaged {kept}", "averaged 3"]
    assert all((out / f"averaged-{n}" / "model.safetensors").is_file() for n in (2, 3, kept))
    valid = {name: s["valid"]["bleu"] for name, s in windows["scores"].items()}
    assert valid[windows["chosen"]] == max(valid.values()) and "test" in windows["scores"][windows["chosen"]]


def test_a_bit_run_reranks_with_its_switch_snapshot_and_chooses_lambda_on_valid(raw, tmp_path):
    out = tmp_path / "out"
    # epochs of ~6 updates of 16,000 tokens over the doubled split: epochs 1-2 train both ways, the switch
    # comes at epoch 3, past half of the 16 updates
    overrides = ["train.bidirectional=0.5", "train.max_tokens=16000", "train.max_steps=16",
                 "evaluate.channel_weights=[0.0, 0.5, 3.0]", "evaluate.alpha=0.6"]
    saved = run_recipe(load_recipe(write_recipe(tmp_path / "r.toml", raw, out, 1), overrides))
    assert (out / "run" / "bit-model" / "model.safetensors").is_file()
    chosen = saved["chosen"]
    sweep = saved["alpha_sweep_valid_bleu"][chosen]
    assert set(sweep) == {"0.6, lambda 0.0", "0.6, lambda 0.5", "0.6, lambda 3.0"}
    valid, test = saved["scores"][chosen]["valid"], saved["scores"][chosen]["test"]
    assert sweep[f"0.6, lambda {valid['channel_weight']}"] == max(sweep.values()) == valid["bleu"]
    assert test["channel_weight"] == valid["channel_weight"]
    if valid["channel_weight"] > 0:  # the test split was decoded the same way, and the channel model kept
        assert saved["decode"]["rerank"] == {"candidates": 2, "weight": valid["channel_weight"]}
        assert (out / "channel-model" / "model.safetensors").is_file() and saved["channel"] == str(out / "channel-model")
    else:
        assert "rerank" not in saved["decode"] and not (out / "channel-model").exists()
