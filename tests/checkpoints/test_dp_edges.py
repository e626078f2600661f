"""The DP's tolerance: a checkpoint that saves nothing is never bought with float noise in the prefix sums; and
the lower hull of three points drops a middle point that is no vertex."""

import numpy as np
import pytest

from minipic_lite.checkpoints import dp_fast, dp_hull, dp_reference
from minipic_lite.checkpoints.dp import lower_hull

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


def test_the_lower_hull_of_three_points_drops_a_middle_point_on_or_above_the_chord():
    x = np.array([0.0, 1.0, 2.0])
    assert lower_hull(x, np.array([0.0, 5.0, 0.0])).tolist() == [0, 2]
    assert lower_hull(x, np.array([0.0, 1.0, 2.0])).tolist() == [0, 2]  # on the chord: no vertex
    assert lower_hull(x, np.array([0.0, -1.0, 0.0])).tolist() == [0, 1, 2]
