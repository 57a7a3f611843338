"""`transduce study table3` end to end on a tiny budget: two rows, a few updates, the shipped corpus in a
Multi30k-shaped directory; the table's shape, the plots, skipping finished rows and resuming a killed one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import write_multi30k_shaped

from transduce.cli import main as cli
from transduce.study.report import NONE, PAPER, verdict
from transduce.study.significance import Paired
from transduce.study.table3 import rows
from transduce.train.checkpoint import list_checkpoints

SIZES = {"train": 600, "val": 16, "test_2016_flickr": 8}
STEPS = 6
# the C++ kernels would be built on first use; the tensor ops keep the test to seconds on any checkout
ARGS = ["--scale", "cpu", "--d-model", "64", "--steps", str(STEPS), "--max-tokens", "300", "--seeds", "1"]
ARGS += ["--base-seeds", "1", "2"]
ARGS += ["--rows", "base", "A-h-4", "--parallel", "2", "--set", "loss_kernel=tensor", "--set", "dropout_kernel=tensor"]
ARGS += ["--beam", "1", "--max-len-b", "4"]  # an untrained model writes to the length limit: keep that short


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """A prepared data directory from the first lines of the shipped corpus (en-fr), Multi30k's file names."""
    root = tmp_path_factory.mktemp("study")
    raw = write_multi30k_shaped(root / "raw", SIZES)
    out = root / "data"
    argv = ["prepare", "multi30k", "--src", "en", "--tgt", "fr", "--raw", str(raw), "--out", str(out)]
    assert cli(argv + ["--vocab-size", "300"]) == 0
    return out


def study(data: Path, out: Path, *extra: str) -> int:
    return cli(["study", "table3", "--data", str(data), "--out", str(out), *ARGS, *extra])


@pytest.mark.slow
def test_sweep_tabulates_plots_skips_and_resumes(data, tmp_path, capsys):
    out = tmp_path / "sweep"
    assert study(data, out) == 0
    results = {p.name: json.loads(p.read_text()) for p in (out / "results").glob("*.json")}
    assert set(results) == {"base.seed1.json", "base.seed2.json", "A-h-4.seed1.json"}
    for r in results.values():
        assert r["steps"] == STEPS and r["sentences"] == SIZES["val"] and r["dev_ppl"] > 1 and r["params"] > 0
        assert len(r["bleu_stats"]) == len(r["nll_stats"]) == SIZES["val"]  # per dev sentence, for the paired tests
        assert [p["step"] for p in r["curve"]] == list(range(1, STEPS + 1))  # validated every tenth (here: each)
    assert results["A-h-4.seed1.json"]["shape"]["h"] == 4 and results["A-h-4.seed1.json"]["shape"]["d_k"] == 16

    table = (out / "table3.md").read_text().splitlines()
    body = [line for line in table if line.startswith("| ")]
    header, rows_ = body[0], body[1:]
    table_rows, yardstick = rows_[:2], rows_[2:]
    assert all(line.count("|") == header.count("|") for line in table_rows)
    assert table_rows[0].startswith("| base | 6 | 64 | 256 | 8 | 8 | 8 | 0.1 | 0.1 | 6 |")
    assert "| 1, 2 |" in table_rows[0]
    assert table_rows[1].startswith("| (A) h=4 |  |  |  | 4 | 16 | 16 |  |  | 6 |")  # unchanged cells blank
    assert f"| {PAPER['A h=4']['ppl']:.2f} | {PAPER['A h=4']['bleu']:.1f} |" in table_rows[1]
    verdicts = [c.strip() for c in table_rows[1].strip().strip("|").split("|")][16]  # row A against both base seeds
    assert all(v in ("better", "worse", NONE) for v in verdicts.split(" / "))
    assert len(yardstick) == 2 and yardstick[1].startswith("| 2 − 1 | ")  # one pair of base seeds
    plots = sorted(p.name for p in (out / "plots").glob("*.png"))
    assert plots == ["table3-A.png", "table3-curves-A.png"]  # per group with results
    assert (out / "plots" / "table3-A.png").stat().st_size > 5000

    # a second run skips both; a row killed after its step-4 checkpoint resumes from it
    killed = out / "runs" / "A-h-4.seed1"
    (out / "results" / "A-h-4.seed1.json").unlink()
    shutil.rmtree(killed / "run" / "model")
    kept = list_checkpoints(killed / "run" / "checkpoints")
    assert int(kept[-1].name.split("_")[1]) == STEPS and len(kept) >= 2
    shutil.rmtree(kept[-1])  # as if killed before its last checkpoint
    base_result = out / "results" / "base.seed1.json"
    before = base_result.stat().st_mtime_ns
    capsys.readouterr()
    assert study(data, out) == 0
    printed = capsys.readouterr().out
    assert "done already: base seed 1" in printed and "start: A h=4 seed 1" in printed
    assert base_result.stat().st_mtime_ns == before
    resumed = json.loads((out / "results" / "A-h-4.seed1.json").read_text())
    assert resumed["steps"] == STEPS and resumed["resumed_from_step"] == STEPS - 1
    assert f"(step {STEPS - 1}, epoch" in (killed / "log.txt").read_text()  # the trainer's "resumed from ..."


def test_changed_settings_do_not_mix_into_a_sweep(data, tmp_path):
    out = tmp_path / "sweep"
    (out).mkdir()
    (out / "sweep.json").write_text(json.dumps({"data": str(data.resolve()), "d_model": 128}))
    assert study(data, out) == 2  # a ConfigError naming sweep.json's key
    assert not (out / "runs").exists()


def test_a_verdict_needs_significance_against_every_base_seed():
    up, down, unsure = Paired(1.0, 0.5, 1.5, 0.001), Paired(-1.0, -1.5, -0.5, 0.001), Paired(0.4, -0.1, 0.9, 0.2)
    assert verdict([up, up, up], lower_is_better=False) == "better"
    assert verdict([up, up, up], lower_is_better=True) == "worse"  # perplexity went up
    assert verdict([down, down], lower_is_better=True) == "better"
    assert verdict([up, up, unsure], lower_is_better=False) == NONE  # one base seed is not beaten
    assert verdict([up, down], lower_is_better=False) == NONE  # the sign depends on the base seed
    assert verdict([Paired(0.0, 0.0, 0.0, 0.001)], lower_is_better=False) == NONE  # sacreBLEU's p for equal systems


def test_rows_scale_by_the_papers_ratios():
    table = {r.name: r.shape() for r in rows(128)}
    assert len(table) == len(PAPER) == 20
    assert table["base"] == dict(
        N=6, d_model=128, d_ff=512, h=8, d_k=16, d_v=16, P_drop=0.1, eps_ls=0.1, positions="sinusoidal"
    )
    assert [table[f"A h={h}"]["d_k"] for h in (1, 4, 16, 32)] == [128, 32, 8, 4]  # d_k = d_v = d_model / h
    assert (table["B d_k=16"]["d_k"], table["B d_k=16"]["d_v"], table["B d_k=32"]["d_k"]) == (4, 16, 8)
    assert (table["C d_model=256"]["d_model"], table["C d_model=256"]["d_k"], table["C d_model=256"]["d_ff"]) == (
        64,
        8,
        512,
    )
    assert table["C d_model=1024"]["d_model"] == 256 and table["C d_ff=4096"]["d_ff"] == 1024
    assert table["E learned positions"]["positions"] == "learned"
    assert (table["big"]["d_model"], table["big"]["d_ff"], table["big"]["h"], table["big"]["P_drop"]) == (
        256,
        1024,
        16,
        0.3,
    )
    assert {r.name: r.steps_scale for r in rows(128)}["big"] == 3  # the paper: 300K updates against 100K
    assert [r.shape()["d_k"] for r in rows(160) if r.name in ("A h=32", "B d_k=16")] == [5, 5]
    with pytest.raises(ValueError, match="multiple of 32"):
        rows(80)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--rows", "base", "Z-h-3"], "unknown row(s) Z-h-3"),
        (["--set", "max_steps=3"], "--set max_steps: the study sets these itself"),
        (["--d-model", "80"], "multiple of 32"),
    ],
)
def test_bad_options_are_refused_before_anything_runs(data, tmp_path, capsys, extra, message):
    out = tmp_path / "sweep"
    assert study(data, out, *extra) == 2
    assert message in capsys.readouterr().err and not out.exists()


def test_data_must_be_a_prepared_directory(tmp_path, capsys):
    assert study(tmp_path / "nothing", tmp_path / "sweep") == 2
    assert "no manifest.json there" in capsys.readouterr().err
