import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minipic_lite.checkpoints import dp_fast, dp_hull, dp_reference, expected_cost, plan, worst_case_cost
from minipic_lite.checkpoints.dp import _monotone_chain, lower_hull, useful_lines
from tests.checkpoints.helpers import assert_close, brute_force, least_expected_cost

SOLVERS = {"reference": dp_reference, "hull": dp_hull, "fast": dp_fast}


def random_instance(seed: int) -> tuple[np.ndarray, int]:
    """Small weights with zero-mass bins, often mass at depth 0, sometimes integer ties."""
    rng = np.random.default_rng(seed)
    num_tokens, budget = int(rng.integers(1, 10)), int(rng.integers(0, 5))
    if seed % 3 == 0:
        weights = rng.integers(0, 3, num_tokens + 1).astype(float)
    else:
        weights = rng.random(num_tokens + 1) * (rng.random(num_tokens + 1) < 0.6)
    weights[0] += 2.0 * (seed % 2)
    if weights.sum() == 0:
        weights[-1] = 1.0
    return weights, budget


@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize("seed", range(60))
def test_dp_equals_brute_force(solver, seed):
    weights, budget = random_instance(seed)
    positions = SOLVERS[solver](weights, budget)
    assert positions == sorted(set(positions))
    assert len(positions) <= budget and all(1 <= c < len(weights) for c in positions)
    assert_close(expected_cost(weights, positions), brute_force(weights, budget))


@settings(max_examples=60, deadline=None)
@given(
    weights=st.lists(st.sampled_from([0.0, 0.0, 0.5, 1.0, 3.0, 7.25]), min_size=2, max_size=9),
    budget=st.integers(0, 4),
)
def test_dp_versions_agree_with_brute_force(weights, budget):
    if sum(weights) == 0:
        weights[0] = 1.0
    best = brute_force(weights, budget)
    for solver in SOLVERS.values():
        assert_close(expected_cost(weights, solver(weights, budget)), best)


@pytest.mark.parametrize("seed", range(20))
def test_the_independent_optimum_equals_brute_force(seed):
    weights, budget = random_instance(seed)
    assert_close(least_expected_cost(weights, budget), brute_force(weights, budget))


@pytest.mark.parametrize("solver", SOLVERS)
def test_dp_is_optimal_on_larger_instances(solver):
    rng = np.random.default_rng(7)
    for num_tokens, budget in [(63, 5), (130, 9), (257, 3)]:
        weights = rng.random(num_tokens + 1) ** 4 * (rng.random(num_tokens + 1) < 0.5)
        expected = least_expected_cost(weights, budget)  # brute force is too slow here
        assert_close(expected_cost(weights, SOLVERS[solver](weights, budget)), expected)


def test_cost_is_non_increasing_in_budget():
    rng = np.random.default_rng(3)
    weights = rng.random(200) * (rng.random(200) < 0.3)
    costs = [expected_cost(weights, dp_fast(weights, m)) for m in range(0, 40)]
    assert all(later <= earlier + 1e-12 for earlier, later in itertools.pairwise(costs))
    assert costs[-1] < costs[0]


@pytest.mark.parametrize("solver", SOLVERS)
def test_point_mass_is_hit_exactly(solver):
    weights = np.zeros(50)
    weights[37] = 2.5
    assert SOLVERS[solver](weights, 1) == [37]
    assert SOLVERS[solver](weights, 4) == [37]  # NOTE: extra checkpoints that save nothing are not placed.
    weights[0] = 10.0  # mass at depth 0 costs nothing whatever the plan
    assert SOLVERS[solver](weights, 3) == [37]


def test_all_mass_at_zero_or_no_budget_places_nothing():
    for solver in SOLVERS.values():
        assert solver([5.0, 0.0, 0.0], 2) == []
        assert solver([0.0, 1.0, 1.0], 0) == []


@pytest.mark.parametrize(("num_tokens", "budget"), [(10, 1), (10, 3), (17, 4), (30, 5), (64, 7), (9, 12)])
def test_uniform_dp_cost_equals_balanced(num_tokens, budget):
    weights = np.ones(num_tokens + 1)
    balanced = plan("balanced", weights, budget)
    assert_close(expected_cost(weights, dp_fast(weights, budget)), expected_cost(weights, balanced))
    if num_tokens <= 17:
        assert_close(expected_cost(weights, balanced), brute_force(weights, budget))


@pytest.mark.parametrize(("num_tokens", "budget"), [(6, 1), (9, 2), (12, 3), (13, 4), (11, 5)])
def test_balanced_is_minimax_optimal(num_tokens, budget):
    weights = np.ones(num_tokens + 1)
    balanced = plan("balanced", weights, budget)
    assert len(balanced) == min(budget, num_tokens)
    assert worst_case_cost(weights, balanced) == brute_force(weights, budget, cost=worst_case_cost)
    assert worst_case_cost(weights, balanced) == -(-(num_tokens + 1) // (budget + 1)) - 1


def test_budget_and_weights_are_validated():
    for solver in SOLVERS.values():
        with pytest.raises(ValueError, match="budget must be >= 0"):
            solver([1.0, 1.0], -1)
        with pytest.raises(ValueError, match=r"non-negative: weights\[0\]"):
            solver([-1.0, 1.0], 1)


@pytest.mark.parametrize("kind", ["random", "convex", "concave", "staircase", "collinear", "two_points", "one_point"])
def test_lower_hull_matches_monotone_chain(kind):
    rng = np.random.default_rng(0)
    x = np.arange(300, dtype=float)
    y = {
        "random": rng.random(300),
        "convex": (x - 150) ** 2,
        "concave": -((x - 150) ** 2),
        "staircase": np.r_[0.0, 1e6 + (x[1:] - 50) ** 2],  # one point dropped per pass: the fallback
        "collinear": 3 * x + 1,
        "two_points": x,
        "one_point": x,
    }[kind]
    size = {"two_points": 2, "one_point": 1}.get(kind, 300)
    x, y = x[:size], y[:size]
    assert lower_hull(x, y).tolist() == _monotone_chain(x, y, np.arange(size)).tolist()


def test_useful_lines_keep_a_minimizer_for_every_query_in_range():
    rng = np.random.default_rng(2)
    num_kept = 0
    for _ in range(50):
        slopes = np.arange(1, 41, dtype=float)
        intercepts = np.cumsum(rng.random(40) * 40) * rng.choice([-1, 1])
        x_lo, x_hi = np.sort(rng.random(2) * 40)
        queries = np.r_[x_lo, x_hi, rng.uniform(x_lo, x_hi, 30)]
        kept = useful_lines(slopes, intercepts, x_lo, x_hi)
        all_lines = intercepts[:, None] - slopes[:, None] * queries
        np.testing.assert_allclose(all_lines[kept].min(axis=0), all_lines.min(axis=0))
        num_kept += kept.size
    assert num_kept < 50 * 40 / 2  # and most lines are pruned
