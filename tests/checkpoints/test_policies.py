import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minipic_lite.checkpoints import POLICIES, bin_weights, expected_cost, plan
from tests.checkpoints.helpers import assert_close, brute_force


def test_baseline_positions_by_hand():
    weights = np.ones(101)  # N = 100
    assert plan("none", weights, 4) == []
    assert plan("kv_only", weights, 4) == []
    assert plan("balanced", weights, 4) == [20, 40, 60, 80]  # ⌊i·101/5⌋
    assert plan("balanced", weights, 3) == [25, 50, 75]
    assert plan("logarithmic", weights, 3) == [50, 75, 88]  # N − ⌊N/2^i⌋
    assert plan("sqrt", weights, 3) == [80, 90, 100]  # every ⌈√100⌉ = 10, the deepest 3
    assert plan("sqrt", np.ones(11), 5) == [4, 8]  # N = 10: every ⌈√10⌉ = 4
    assert plan("block", weights, 3, block_size=16) == [16, 32, 48]
    assert plan("block", weights, 30, block_size=16) == [16, 32, 48, 64, 80, 96]
    assert plan("balanced_tail", weights, 1) == [50]  # balanced alone
    assert plan("balanced_tail", weights, 4) == [25, 50, 75, 100]  # balanced's 3, then sqrt's deepest
    assert plan("balanced_tail", np.ones(1208), 2) == [604, 1190]  # N = 1207: every ⌈√1207⌉ = 35, the deepest


def test_budgets_beyond_n_are_capped_at_n():
    weights = np.ones(11)  # N = 10: at most every position
    for policy in ("balanced", "logarithmic", "dp"):
        assert len(plan(policy, weights, 10**12)) <= 10
    assert plan("balanced", weights, 10**12) == list(range(1, 11))


def test_alignment_rounds_baselines_down_to_the_grid():
    weights = np.ones(1001)  # N = 1000
    assert plan("balanced", weights, 3, bin_size=64) == [192, 448, 704]  # from 250, 500, 750
    assert plan("logarithmic", weights, 2, bin_size=64) == [448, 704]  # from 500, 750
    assert plan("sqrt", weights, 2, bin_size=64) == [960]  # every ⌈√1000⌉ = 32: 960, 992 -> 960, 960
    assert plan("dp", np.ones(40), 3, bin_size=64) == []  # N = 39 < 64: no aligned position exists


def test_binned_dp_is_the_optimum_among_aligned_plans():
    rng = np.random.default_rng(5)
    for bin_size in (2, 3, 8):
        for _ in range(6):
            num_tokens = int(rng.integers(bin_size, 6 * bin_size))
            weights = rng.random(num_tokens + 1) * (rng.random(num_tokens + 1) < 0.5)
            weights[-1] += 0.1
            budget = int(rng.integers(1, 4))
            positions = plan("dp", weights, budget, bin_size=bin_size)
            assert all(c % bin_size == 0 for c in positions)
            grid = range(bin_size, num_tokens + 1, bin_size)
            assert_close(expected_cost(weights, positions), brute_force(weights, budget, grid=grid))


def test_bin_weights_sums_each_bin():
    assert bin_weights(np.arange(10, dtype=float), 4).tolist() == [6.0, 22.0, 17.0]  # 0..3, 4..7, 8..9


@settings(max_examples=80, deadline=None)
@given(
    policy=st.sampled_from(sorted(POLICIES)),
    num_tokens=st.integers(1, 700),
    budget=st.integers(0, 40),
    bin_size=st.sampled_from([1, 2, 16, 64]),
    seed=st.integers(0, 2**16),
)
def test_plans_stay_within_bounds_and_budget(policy, num_tokens, budget, bin_size, seed):
    weights = np.random.default_rng(seed).random(num_tokens + 1)
    positions = plan(policy, weights, budget, bin_size=bin_size)
    assert positions == sorted(set(positions))
    assert len(positions) <= budget
    assert all(1 <= c <= num_tokens and c % bin_size == 0 for c in positions)


def test_dp_methods_are_interchangeable():
    weights = np.random.default_rng(1).random(90)
    plans = [plan("dp", weights, 6, method=method) for method in ("fast", "hull", "reference")]
    for a, b in itertools.pairwise(plans):
        assert_close(expected_cost(weights, a), expected_cost(weights, b))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: plan("dp", [1.0, -2.0, 1.0], 1), r"non-negative: weights\[1\] = -2.0"),
        (lambda: plan("balanced", [1.0, float("nan")], 1), r"finite: weights\[1\] = nan"),
        (lambda: plan("dp", [1.0, 1.0], -1), "budget must be >= 0 checkpoints, got -1"),
        (lambda: plan("dp", [1.0, 1.0], 1.5), "budget must be an integer"),
        (lambda: plan("sqrt", [1.0], 1), r"N >= 1, got N = 0"),
        (lambda: plan("random", [1.0, 1.0], 1), "unknown placement policy 'random'"),
        (lambda: plan("dp", [1.0, 1.0], 1, bin_size=0), "bin_size must be an integer >= 1"),
        (lambda: plan("balanced", [1.0, 1.0], 1, block_size=4), "does not take options"),
        (lambda: plan("block", [1.0, 1.0], 1, block_size=0), "block_size must be >= 1"),
        (lambda: plan("dp", [1.0, 1.0], 1, method="magic"), "unknown dp method 'magic'"),
    ],
    ids=["negative", "nan", "M<0", "M=1.5", "N=0", "policy", "bin_size", "option", "block_size", "method"],
)
def test_bad_input_raises_naming_the_problem(call, message):
    with pytest.raises(ValueError, match=message):
        call()
