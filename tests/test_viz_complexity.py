"""transduce complexity: banded attention is the model's restricted attention, FLOP counts follow
Table 1's orders, path lengths match the analytic values."""

from __future__ import annotations

import math

import pytest
import torch

from transduce.cli import main
from transduce.model.attention import attention_reference
from transduce.model.transformer import window_mask
from transduce.viz.complexity import LAYERS, PAPER, UnrolledLSTM, build_layers, count_flops, measure, slope
from transduce.viz.paths import max_path_length, sequential_operations
from transduce.viz.restricted import banded_attention


@pytest.mark.parametrize("n,r", [(10, 3), (10, 4), (7, 16), (33, 8)])
def test_banded_attention_equals_masked_reference(n, r):
    torch.manual_seed(n + r)
    q, k, v = torch.randn(3, 2, n, 8).unbind(0)  # (B, n, d) each
    want, _ = attention_reference(q[:, None], k[:, None], v[:, None], window_mask(n, n, r, causal=False))
    torch.testing.assert_close(banded_attention(q, k, v, r), want[:, 0], atol=1e-5, rtol=1e-5)


def test_unrolled_lstm_is_the_lstm():
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(12, 12, batch_first=True)
    x = torch.randn(2, 9, 12)
    torch.testing.assert_close(UnrolledLSTM(lstm)(x), lstm(x)[0], atol=1e-5, rtol=1e-5)


def test_flops_closed_forms():
    n, d, r, k = 24, 16, 5, 3
    x = torch.randn(1, n, d)
    counted = {name: count_flops(fn, x) for name, (_, fn) in build_layers(d, r, k).items()}
    # multiply-adds x 2: Q Kᵀ and P V; two LSTM matrix products of 4d gates per step; k taps per output
    assert counted == {
        "self_attention": 4 * n * n * d,
        "restricted": 4 * n * r * d,
        "recurrent": 2 * n * (2 * 4 * d * d),
        "convolution": 2 * k * n * d * d,
    }


def test_flop_slopes_follow_table_1():
    lengths = [8, 16, 32, 64]
    by_n = measure(16, lengths, r=4, k=3, repeats=1)
    for name in LAYERS:
        assert slope(by_n[name]["n"], by_n[name]["flops"]) == pytest.approx(PAPER[name][3], abs=0.05), name
        assert all(t > 0 for t in by_n[name]["seconds"]) and all(b > 0 for b in by_n[name]["bytes"])
    ds = [8, 16, 32]
    for name in LAYERS:
        flops = [count_flops(build_layers(d, 4, 3)[name][1], torch.randn(1, 16, d)) for d in ds]
        assert slope(ds, flops) == pytest.approx(PAPER[name][4], abs=0.05), name
    # self-attention's memory grows faster than linear (it holds the n × n weights)
    assert by_n["self_attention"]["bytes"][-1] / by_n["self_attention"]["bytes"][0] > 20


@pytest.mark.parametrize("n", [2, 5, 16, 37, 100])
def test_path_lengths_match_analytic_values(n):
    for r in (3, 4, 8):
        want = max(math.ceil((n - 1) / ((r - 1) // 2)), math.ceil((n - 1) / (r // 2)))
        assert max_path_length("restricted", n, r=r) == want
    for k in (3, 5):
        assert max_path_length("convolution", n, k=k) == math.ceil((n - 1) / (k // 2))
    for k in (2, 3):
        digits = len(_base(n - 1, k))  # layer l covers the base-k digit l of the distance
        assert max_path_length("dilated", n, k=k) == digits
    assert max_path_length("self_attention", n) == 1
    assert max_path_length("recurrent", n) == n
    assert sequential_operations("recurrent", n) == n
    assert all(sequential_operations(kind, n) == 1 for kind in ("self_attention", "restricted", "convolution"))


def _base(x: int, k: int) -> list[int]:
    digits = []
    while x:
        x, d = divmod(x, k)
        digits.append(d)
    return digits or [0]


def test_path_length_rejects_degenerate_windows():
    with pytest.raises(ValueError, match="--r"):
        max_path_length("restricted", 10, r=2)
    with pytest.raises(ValueError, match="--k"):
        max_path_length("convolution", 10, k=4)


@pytest.mark.slow
def test_cli_writes_table_and_plot(tmp_path, capsys):
    out = tmp_path / "cx"
    assert (
        main(
            [
                "complexity",
                "--d",
                "16",
                "--lengths",
                "8,16,32",
                "--ds",
                "8,16",
                "--n-for-d",
                "8",
                "--r",
                "4",
                "--repeats",
                "1",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    table = capsys.readouterr().out
    for row in (
        "| self-attention | O(n²·d) |",
        "| restricted | O(r·n·d) |",
        "| recurrent | O(n·d²) |",
        "| convolution | O(k·n·d²) |",
    ):
        assert row in table
    assert "31 contiguous; 4 dilated" in table  # n = 32, k = 3
    assert (out / "table.md").read_text() in table
    png = (out / "complexity.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20000
    assert main(["complexity", "--lengths", "8", "--out", str(out)]) == 2
