"""Cutting an ordered list of model blocks into contiguous stages.

- ``uniform``: block counts as equal as possible.
- ``balanced``: minimise the heaviest stage for any per-block weight (parameter counts, or
  profiled F+B+W time), exactly, by dynamic programming over cut points: O(n^2 k) for n blocks
  and k stages.

A partition is given as blocks per stage (``[3, 2, 2]``: stage 0 holds blocks 0-2, ...).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


def uniform(n_blocks: int, n_stages: int) -> list[int]:
    _check(n_blocks, n_stages)
    q, extra = divmod(n_blocks, n_stages)
    return [q + (s < extra) for s in range(n_stages)]


def balanced(weights: Sequence[float], n_stages: int) -> list[int]:
    """The partition whose heaviest stage (sum of its blocks' weights) is the lightest possible;
    among those, the one found first by preferring earlier cuts (deterministic)."""
    n = len(weights)
    _check(n, n_stages)
    prefix = [0.0]
    for w in weights:
        if w < 0:
            raise ValueError(f"block weights must be >= 0, got {w}")
        prefix.append(prefix[-1] + w)
    inf = float("inf")
    # best[k][i]: the lightest heaviest stage when the first i blocks form k stages; cut[k][i]: where stage k-1 starts
    best = [[inf] * (n + 1) for _ in range(n_stages + 1)]
    cut = [[0] * (n + 1) for _ in range(n_stages + 1)]
    best[0][0] = 0.0
    for k in range(1, n_stages + 1):
        for i in range(k, n - (n_stages - k) + 1):
            for j in range(k - 1, i):
                value = max(best[k - 1][j], prefix[i] - prefix[j])
                if value < best[k][i]:
                    best[k][i], cut[k][i] = value, j
    sizes, i = [], n
    for k in range(n_stages, 0, -1):
        j = cut[k][i]
        sizes.append(i - j)
        i = j
    return sizes[::-1]


def min_max_cut(n_blocks: int, n_stages: int, cost: Callable[[int, int, int], float],
                empty: bool = False) -> tuple[float, list[int]]:
    """The cut of ``n_blocks`` blocks into ``n_stages`` contiguous stages of one block or more
    (``empty``: or none) whose largest ``cost(j, i, k)`` (stage k holding blocks j..i-1) is the
    least, by dynamic programming over the cut points: ``(that least, blocks per stage)``; among
    equals, the earliest cuts."""
    if not empty:
        _check(n_blocks, n_stages)
    least = 0 if empty else 1  # blocks in a stage
    inf = float("inf")
    best = [0.0] + [inf] * n_blocks  # the first k stages over the first i blocks
    cuts: list[list[int]] = []  # per stage k, per i: where it starts
    for k in range(n_stages):
        nxt, cut = [inf] * (n_blocks + 1), [0] * (n_blocks + 1)
        for i in range(least * (k + 1), n_blocks - least * (n_stages - 1 - k) + 1):
            nxt[i], cut[i] = min((max(best[j], cost(j, i, k)), j) for j in range(least * k, i - least + 1)
                                 if best[j] < inf)
        best = nxt
        cuts.append(cut)
    sizes, i = [], n_blocks
    for k in range(n_stages - 1, -1, -1):
        sizes.append(i - cuts[k][i])
        i = cuts[k][i]
    return best[n_blocks], sizes[::-1]


def stage_weights(weights: Sequence[float], sizes: Sequence[int]) -> list[float]:
    """Each stage's total weight under a partition."""
    out, i = [], 0
    for k in sizes:
        out.append(sum(weights[i:i + k]))
        i += k
    return out


def _check(n_blocks: int, n_stages: int) -> None:
    if not 1 <= n_stages <= n_blocks:
        raise ValueError(f"cannot cut {n_blocks} blocks into {n_stages} stages: need 1 <= stages <= blocks")
