"""The benchmark harness (bench/, `make bench`) runs end to end on a tiny model, so it cannot rot.

Timing figures are not checked (they belong in BENCHMARKS.md); what is checked is that the peer
computes the same function as transduce, that every stage produces well-formed results, and that a
peer that cannot run is reported rather than dropped.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

from bench_train import build_models, curves, throughput, throughput_table  # noqa: E402

from transduce.data.batching import Batch  # noqa: E402

VOCAB = 64


def fake_batch(seed: int, B: int = 6, S: int = 9, T: int = 8) -> Batch:
    """Random right-padded ids with the Batch layout (src = ids + eos, tgt = bos + ids + eos)."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, VOCAB, (B, S), generator=g)
    tgt = torch.randint(4, VOCAB, (B, T), generator=g)
    tgt[:, 0] = 2
    for b in range(B):
        s_len, t_len = S - b % 3, T - b % 2
        src[b, s_len - 1], src[b, s_len:] = 3, 0
        tgt[b, t_len - 1], tgt[b, t_len:] = 3, 0
    return Batch(src, tgt, torch.arange(B), int((src != 0).sum()), int((tgt[:, 1:] != 0).sum()))


def test_peer_computes_the_same_function():
    models = build_models("tiny", VOCAB)
    batch = fake_batch(0)
    with torch.no_grad():
        a = models["transduce"].eval()(batch.src, batch.tgt[:, :-1])
        b = models["nn.Transformer"].eval()(batch.src, batch.tgt[:, :-1])
    real = batch.tgt[:, 1:] != 0
    assert (a[real] - b[real]).abs().max() < 1e-4


@pytest.mark.slow
def test_throughput_flops_and_table():
    # fp32: in bf16 the 2048³ peak product that throughput() measures is emulated on AVX2 CPUs (minutes)
    r = throughput("tiny", "fp32", [fake_batch(1)], VOCAB, repeats=1, peak=1e11)
    assert set(r.tok_s) == {"transduce", "nn.Transformer"}
    assert all(v > 0 for v in r.tok_s.values()) and math.isfinite(r.ratio)
    # forward + backward ≈ 3 × 2 × parameters-in-matmuls per token: at least the feed-forward and projections
    assert r.flops_per_token > 6 * 2 * (64 * 256) * 2
    assert "| tiny |" in throughput_table([r])


def test_convergence_curves_start_equal():
    r = curves("tiny", "fp32", [fake_batch(2), fake_batch(3)], VOCAB, warmup=10)
    assert set(r.curves) == {"transduce", "transduce seed 2", "nn.Transformer"}
    # same weights and batch: the first loss differs only by dropout
    first = [c[0] for c in r.curves.values()]
    assert max(first) - min(first) < 0.5 and r.tail_gap("transduce", "nn.Transformer") >= 0


def test_fairseq_is_reported_not_dropped():
    from run import fairseq_status

    assert fairseq_status().startswith("- fairseq:")


@pytest.mark.slow
def test_decode_workers_agree(tiny_model_dir, tmp_path):
    pytest.importorskip("ctranslate2")
    from bench_decode import export_all, run_engine

    from transduce.data.vocab import Vocabs

    missing = export_all(tiny_model_dir, tmp_path)
    assert "ct2-float32" not in missing, missing
    vocab = Vocabs.load(tiny_model_dir / "vocab").src
    src = [vocab.encode(s) + [3] for s in ("A man is riding a bike.", "Two dogs play in the snow.")]
    (tmp_path / "src.json").write_text(str(src))
    ours = run_engine("transduce-fp32", tiny_model_dir, tmp_path, tmp_path / "src.json", 2, 1)
    ct2 = run_engine("ct2-float32", tiny_model_dir, tmp_path, tmp_path / "src.json", 2, 1)
    assert "error" not in ours and "error" not in ct2, (ours, ct2)
    assert ours["sentences"] == 2 and ours["maxrss_mb"] > 0
    assert ours["hyps"] == ct2["hyps"]  # same arithmetic, same best hypotheses


@pytest.mark.slow
def test_decode_native_engine_agrees(tiny_model_dir, tmp_path):
    """The benchmark's native engine decodes exactly what its Python engine does."""
    import shutil

    if shutil.which("c++") is None:
        pytest.skip("no C++ compiler to build the native decoder step")
    from bench_decode import run_engine

    from transduce.data.vocab import Vocabs

    vocab = Vocabs.load(tiny_model_dir / "vocab").src
    src = [vocab.encode(s) + [3] for s in ("A man is riding a bike.", "Two dogs play in the snow.", "A girl.")]
    (tmp_path / "src.json").write_text(str(src))
    runs = [
        run_engine(e, tiny_model_dir, tmp_path, tmp_path / "src.json", 2, 1)
        for e in ("transduce-fp32", "transduce-fp32-native", "transduce-int8-native")
    ]
    assert all("error" not in r for r in runs), runs
    assert runs[1]["hyps"] == runs[0]["hyps"] and runs[1]["sentences"] == 3
    assert runs[2]["sentences"] == 3 and len(runs[2]["hyps"]) == 3  # int8: an approximation, also decodes


def test_benchmarks_md_keeps_each_machines_sections_together(tmp_path):
    from run import INTRO, compose

    sections = tmp_path / "sections"
    sections.mkdir()
    (sections / "train-a.md").write_text("## Training: CPU A (2 cores)\n\ntrain on A\n")
    (sections / "train-b.md").write_text("## Training: CPU B (2 cores)\n\ntrain on B\n")
    (sections / "decode.md").write_text("## Decoding: CPU A (2 cores)\n\ndecode on A\n")
    out = tmp_path / "BENCHMARKS.md"
    compose(out, sections)
    text = out.read_text()
    assert text.startswith(INTRO)
    a = sorted(text.index(s) for s in ("train on A", "decode on A"))
    assert not a[0] < text.index("train on B") < a[1]  # A's sections are adjacent, whichever machine comes first


def test_the_training_bench_times_a_preset_with_model_keys_over_it(data_dir, capsys):
    import train_step as bench

    from transduce.config import ConfigError

    threads = torch.get_num_threads()
    try:
        bench.main(
            [
                str(data_dir),
                "--preset",
                "tiny",
                "--set",
                "d_model=32",
                "--set",
                "model.d_ff=48",
                "--dtype",
                "fp32",
                "--threads",
                "1",
                "--max-tokens",
                "300",
                "--steps",
                "2",
                "--warmup",
                "1",
            ]
        )
        line = capsys.readouterr().out.strip().splitlines()[-1]
        assert line.startswith("tiny d_model=32 d_ff=48 fp32 threads=1") and "2 updates" in line
        with pytest.raises(ConfigError, match="d_modle"):
            bench.main([str(data_dir), "--preset", "tiny", "--set", "d_modle=32"])
    finally:
        torch.set_num_threads(threads)


def test_the_training_bench_prices_each_product_shape_of_an_update(data_dir, capsys):
    import train_step as bench

    assert bench.product_flops("aten::mm", [[64, 128], [128, 8000], [64, 8000]]) == 2 * 64 * 128 * 8000
    assert bench.product_flops("aten::addmm", [[256], [10, 128], [128, 256], [], []]) == 2 * 10 * 128 * 256
    assert bench.product_flops("aten::bmm", [[8, 5, 4], [8, 4, 3]]) == 2 * 8 * 5 * 4 * 3
    assert bench.product_flops("aten::add", [[3, 3], [3, 3]]) == 0
    threads = torch.get_num_threads()
    try:
        bench.main(
            [str(data_dir), "--preset", "tiny", "--dtype", "fp32", "--threads", "1", "--max-tokens", "300"]
            + ["--warmup", "1", "--gemm-shapes"]
        )
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    head = next(line for line in out.splitlines() if line.startswith("one update:"))
    assert "of which matrix products" in head and "GFLOP/s" in head
    rows = [line for line in out.splitlines() if line.startswith("| mm |") or line.startswith("| addmm |")]
    assert rows, out  # the projection and the layers' products are found with their shapes
    assert out.splitlines()[-1].startswith("all products:")


@pytest.mark.slow
def test_gpu_script_smoke_on_cpu(data_dir, tmp_path):
    """bench/gpu.py is run only when a GPU is lent: its training part runs here on CPU (tiny, fp32), so the
    one prepared script cannot break unseen between GPU runs."""
    import json

    import gpu

    gpu.main(
        [
            "--data",
            str(data_dir),
            "--out",
            str(tmp_path),
            "--device",
            "cpu",
            "--steps",
            "2",
            "--skip",
            "torchrun",
            "decode",
        ]
    )
    rows = json.loads((tmp_path / "gpu.json").read_text())["train"]
    assert [r["impl"] for r in rows] == ["transduce", "nn.Transformer"]
    assert all(r["tgt_tokens_per_s"] > 0 for r in rows)
    assert "| tiny | fp32 |" in (tmp_path / "gpu.md").read_text()


def test_decode_batching_times_each_batch_size(tiny_model_dir, tmp_path, monkeypatch, capsys):
    import decode_batching

    sentences = tmp_path / "src.en"
    sentences.write_text("A man is riding a bike.\nTwo dogs play in the snow.\nA girl reads.\n\nA red car.\n")
    argv = ["decode_batching.py", "--model", str(tiny_model_dir), "--sentences", str(sentences), "--batches", "1", "3"]
    for order in ("length", "input"):
        monkeypatch.setattr(sys, "argv", [*argv, "--order", order])
        decode_batching.main()
        out = capsys.readouterr().out
        assert f"in {order} order" in out
        rows = [line for line in out.splitlines() if line.startswith("| ") and line[2].isdigit()]
        assert [row.split("|")[1].strip() for row in rows] == ["1", "3"]
        assert all(float(row.split("|")[2]) > 0 for row in rows)


def test_the_bench_judges_every_preset_at_2x_and_medium_and_base_at_70_percent_mfu():
    from bench_train import ThroughputResult
    from run import targets

    def result(preset: str, transduce: float, peer: float) -> ThroughputResult:
        # flops_per_token / peak = 1e-4: MFU = tok/s × 1e-4
        return ThroughputResult(
            preset, "bf16", 1, 1, 1, 1.0, 1e4, {"transduce": transduce, "nn.Transformer": peer}, {}, 1
        )

    lines = targets([result("small", 4000, 2000), result("paper-base", 7300, 4900), result("medium", 6100, 3000)])
    assert lines.splitlines() == [
        "- small bf16: 2.00× nn.Transformer, target ≥ 2.0× — met",
        "- paper-base bf16: 1.49× nn.Transformer, target ≥ 2.0× — missed (needs +0.51)",
        "- paper-base bf16: MFU 73%, target ≥ 70% — met",
        "- medium bf16: 2.03× nn.Transformer, target ≥ 2.0× — met",
        "- medium bf16: MFU 61%, target ≥ 70% — missed (needs +9 points)",
    ]
