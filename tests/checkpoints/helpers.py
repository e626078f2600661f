"""Oracles shared by the checkpoint tests."""

import itertools

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
