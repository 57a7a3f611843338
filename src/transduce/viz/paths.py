"""Table 1's last two columns computed from connectivity: maximum path length and sequential operations.

A stack of layers is unrolled into a graph whose nodes are (layer l, position i); layer 0 is the
input. Edges: (l−1, j) → (l, i) when layer l's output at i reads position j, and for the recurrent
layer also (l, i−1) → (l, i) (the hidden state). The path length from input j to position i is the
fewest edges from (0, j) to any (l, i) — how many layers (and recurrent steps) the signal needs —
found by breadth-first search; the maximum path length is its maximum over (j, i) pairs that are
connected at all (a left-to-right recurrent layer or a causal dilated convolution only carries
signals forward). Sequential operations per layer: the longest chain of dependent nodes within one
layer (n for the recurrent layer, 1 otherwise).

Layer kinds:

* ``self_attention``: every i reads every j.
* ``restricted``: i reads j ∈ [i − (r−1)//2, i + r//2] (the model's ``window_mask``); r ≥ 3.
* ``recurrent``: i reads its input j = i and the hidden state at i − 1.
* ``convolution``: contiguous kernel k (odd), i reads j ∈ [i − k//2, i + k//2] → O(n/k).
* ``dilated``: causal kernel k with dilation k^(l−1) in layer l (WaveNet/ByteNet), i reads
  i − m·k^(l−1), m = 0..k−1 → O(log_k n), the paper's row.
"""

from __future__ import annotations

import math
from collections import deque

KINDS = ("self_attention", "restricted", "recurrent", "convolution", "dilated")


def reads(kind: str, i: int, layer: int, n: int, r: int, k: int) -> range | list[int]:
    """The input positions that layer ``layer`` (from 1) reads for output position ``i``."""
    if kind == "self_attention":
        return range(n)
    if kind == "restricted":
        return range(max(0, i - (r - 1) // 2), min(n, i + r // 2 + 1))
    if kind == "recurrent":
        return [i]
    if kind == "convolution":
        return range(max(0, i - k // 2), min(n, i + k // 2 + 1))
    if kind == "dilated":
        step = k ** (layer - 1)
        return [i - m * step for m in range(k) if i - m * step >= 0]
    raise ValueError(f"unknown layer kind {kind!r}; choose from {', '.join(KINDS)}")


def _check(kind: str, n: int, r: int, k: int) -> None:
    if n < 1:
        raise ValueError(f"sequence length must be at least 1, got {n}")
    if kind == "restricted" and r < 3:
        raise ValueError(f"--r must be at least 3 for a signal to travel both ways, got {r}")
    if kind == "convolution" and (k < 3 or k % 2 == 0):
        raise ValueError(f"--k must be odd and at least 3 for a centred kernel, got {k}")
    if kind == "dilated" and k < 2:
        raise ValueError(f"--k must be at least 2 for a dilated kernel, got {k}")


def path_lengths_from(kind: str, j: int, n: int, r: int = 3, k: int = 3) -> list[float]:
    """Fewest edges from input (0, j) to each position i at any depth (inf where never connected).

    Only the dilated stack changes its connectivity with depth; for the others a node (l, i), l ≥ 1,
    is as good as any deeper (l', i) reached later, so the search keys those nodes by position alone
    and stays O(n · fan-in).
    """
    _check(kind, n, r, k)
    depth = math.ceil(math.log(n, k)) + 1 if kind == "dilated" and n > 1 else n + 1  # deeper adds nothing
    layered = kind == "dilated"
    feeds: dict[int, list[list[int]]] = {}  # layer -> for each input position, the outputs it feeds

    def outputs(layer: int, pos: int) -> list[int]:
        shape = layer if layered else 1
        if shape not in feeds:
            table: list[list[int]] = [[] for _ in range(n)]
            for i in range(n):
                for src in reads(kind, i, shape, n, r, k):
                    table[src].append(i)
            feeds[shape] = table
        return feeds[shape][pos]

    best = [math.inf] * n
    seen = {(0, j)}
    queue = deque([(0, j, 0)])
    while queue:
        layer, pos, dist = queue.popleft()
        nxt = [(layer + 1, i) for i in outputs(layer + 1, pos)] if layer < depth else []
        if kind == "recurrent" and layer >= 1 and pos + 1 < n:
            nxt.append((layer, pos + 1))
        for node_layer, i in nxt:
            key = (node_layer if layered else 1, i)
            if key in seen:
                continue
            seen.add(key)
            best[i] = min(best[i], dist + 1)
            queue.append((node_layer, i, dist + 1))
    return best


def max_path_length(kind: str, n: int, r: int = 3, k: int = 3) -> int:
    """Maximum over connected (j, i) pairs. Connectivity is translation-invariant away from the ends,
    so the worst pairs start at the first or the last position."""
    lengths = path_lengths_from(kind, 0, n, r, k) + path_lengths_from(kind, n - 1, n, r, k)
    return int(max(x for x in lengths if x != math.inf))


def sequential_operations(kind: str, n: int) -> int:
    """Longest chain of dependent nodes inside one layer: the recurrent hidden state chains all n."""
    if kind not in KINDS:
        raise ValueError(f"unknown layer kind {kind!r}; choose from {', '.join(KINDS)}")
    longest = [1] * n  # chain length ending at node i within a layer
    if kind == "recurrent":
        for i in range(1, n):
            longest[i] = longest[i - 1] + 1
    return max(longest)
