import math

import numpy as np
import pytest

from minipic_lite.checkpoints import (
    expected_cost,
    expected_depth,
    recompute_tokens,
    resume_depths,
    savings_fraction,
    token_savings_factor,
    worst_case_cost,
)


def test_resume_and_recompute_follow_the_definition():
    # N = 10, C = {3, 7}: ℓ = 0 0 0 3 3 3 3 7 7 7 7, r = t − ℓ
    assert resume_depths(10, [7, 3]).tolist() == [0, 0, 0, 3, 3, 3, 3, 7, 7, 7, 7]
    assert recompute_tokens(10, [3, 7]).tolist() == [0, 1, 2, 0, 1, 2, 3, 0, 1, 2, 3]
    assert recompute_tokens(4, []).tolist() == [0, 1, 2, 3, 4]


def test_expected_and_worst_case_cost_by_hand():
    weights = [1, 0, 2, 0, 0, 1]  # depths 0, 2, 5 with mass 1, 2, 1
    # C = {2}: r(0) = 0, r(2) = 0, r(5) = 3  ->  E = 3/4, worst = 3
    assert expected_cost(weights, [2]) == 0.75
    assert worst_case_cost(weights, [2]) == 3
    assert expected_cost(weights, []) == (2 * 2 + 5) / 4
    assert worst_case_cost(np.ones(6), [2]) == 3  # depths 5 -> 5 − 2


def test_savings_fraction_and_factor():
    weights = [0, 0, 0, 0, 1, 0, 0, 0, 1]  # depths 4 and 8, E[T] = 6
    assert expected_depth(weights) == 6
    assert savings_fraction(weights, [4]) == pytest.approx(1 - 2 / 6)
    assert token_savings_factor(weights, [4]) == pytest.approx(6 / 2)
    assert token_savings_factor(weights, [4], suffix_tokens=10) == pytest.approx(16 / 12)
    assert token_savings_factor(weights, [4, 8]) == math.inf
    assert savings_fraction([1, 0, 0], [1]) == 0.0  # only depth 0: nothing to save
    assert token_savings_factor([1, 0, 0], [1]) == 1.0


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        ([1.0, -0.5, 1.0], r"non-negative: weights\[1\] = -0.5"),
        ([1.0, float("nan"), 1.0], r"finite: weights\[1\] = nan"),
        ([1.0, 2.0, float("inf")], r"finite: weights\[2\] = inf"),
        ([1.0], r"N >= 1, got N = 0"),
        ([], r"N >= 1, got N = -1"),
        ([[1.0, 2.0]], r"1-D"),
    ],
    ids=["negative", "nan", "inf", "N=0", "empty", "2-D"],
)
def test_bad_weights_raise_naming_the_problem(weights, message):
    with pytest.raises(ValueError, match=message):
        expected_cost(weights, [])


def test_bad_positions_and_zero_mass_raise():
    with pytest.raises(ValueError, match=r"lie in 1..3"):
        expected_cost([1, 1, 1, 1], [0])
    with pytest.raises(ValueError, match=r"lie in 1..3"):
        expected_cost([1, 1, 1, 1], [4])
    with pytest.raises(ValueError, match="sum to zero"):
        expected_cost([0, 0, 0], [1])
    with pytest.raises(ValueError, match="suffix_tokens"):
        token_savings_factor([0, 1], [1], suffix_tokens=-1)
