"""The DP's tolerance: a checkpoint that saves nothing is never bought with float noise in the prefix sums."""

import pytest

from minipic_lite.checkpoints import dp_fast, dp_hull, dp_reference

SOLVERS = {"reference": dp_reference, "hull": dp_hull, "fast": dp_fast}


@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize(
    ("weights", "budget", "expected"),
    [
        ([1.1, 0.0, 0.7, 0.0], 2, [2]),  # no mass at 3: a checkpoint there saves nothing
        ([0.7, 0.1, 0.0, 0.0], 2, [1]),
        ([0.3, 0.0, 0.7, 0.7, 0.1, 0.0], 5, [2, 3, 4]),  # every depth with mass has its own checkpoint already
    ],
)
def test_float_noise_buys_no_checkpoint_that_saves_nothing(solver, weights, budget, expected):
    assert SOLVERS[solver](weights, budget) == expected
