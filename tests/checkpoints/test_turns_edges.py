"""Edges of checkpoints/turns.py that test_turns leaves open: branch points take positions deepest first, which
decides who gets the one position two points compete for."""

from minipic_lite.checkpoints.turns import snap_to_turns


def test_the_deepest_branch_point_takes_a_position_that_two_points_compete_for():
    assert snap_to_turns([4], [8, 12], 1) == [12]
    assert snap_to_turns([4, 20], [8, 12], 4) == [12, 20]
