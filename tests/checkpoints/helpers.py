"""Oracles shared by the checkpoint tests."""

import itertools

import numpy as np

from minipic_lite.checkpoints import expected_cost


def brute_force(weights, budget, cost=expected_cost, grid=None) -> float:
    """The least cost over every subset of at most `budget` positions (of `grid`, default 1..N)."""
    grid = range(1, len(weights)) if grid is None else grid
    subsets = (c for m in range(min(budget, len(grid)) + 1) for c in itertools.combinations(grid, m))
    return min(cost(weights, c) for c in subsets)


def assert_close(actual: float, expected: float, rtol: float = 1e-9, atol: float = 1e-12) -> None:
    abs_err = abs(actual - expected)
    rel_err = abs_err / max(abs(expected), 1e-300)
    assert abs_err <= atol + rtol * abs(expected), f"{actual} vs {expected}: abs err {abs_err:.3g}, rel {rel_err:.3g}"


def least_expected_cost(weights, budget) -> float:
    """The optimum by another route than the DP under test: with a checkpoint at s (s = 0: the free empty prefix)
    and m more to place, depths s.. cost  best[m][s] = min(seg(s, N+1), min_{e>s} seg(s, e) + best[m-1][e]),
    where seg(s, e) = Σ_{s<=t<e} weights[t]·(t − s) is summed term by term (no prefix sums, no hull), O(M·N²)."""
    w = np.asarray(weights, dtype=np.float64)
    n = w.size  # depths 0..n-1; a segment ends at e in s+1..n
    seg = np.zeros((n + 1, n + 1))
    for s in range(n):
        seg[s, s + 1 :] = np.cumsum(w[s:] * np.arange(n - s))  # seg[s, e] for e = s+1..n
    best = seg[:, n].copy()  # m = 0: no checkpoint after s
    for _ in range(budget):
        best = np.array([min(seg[s, n], min((seg[s, e] + best[e] for e in range(s + 1, n)), default=np.inf))
                         for s in range(n)] + [0.0])  # fmt: skip
    return float(best[0]) / float(w.sum())
