"""Chat turns: the branch points of a prompt and a plan moved up to them (exact expectations)."""

import pytest

from minipic_lite.checkpoints.turns import branch_points, snap_to_turns

S = 1  # the turn-start token (<|im_start|> in SmolLM2's vocabulary)


@pytest.mark.parametrize(
    ("token_ids", "expected"),
    [
        ([S, 7, 7, S, 8, 8, S, 9], [3]),  # system, user, assistant header: the user turn starts at 3
        ([S, 7, S, 8, S, 9, S, 4], [2, 4]),  # a conversation: every start but the first and the last
        ([5, S, 7, S, 8], [1]),  # a preamble before the first turn: its start is a branch point too
        ([S, 7, 7, 7], []),  # one turn (a prompt cut inside its first turn)
        ([S, 7, S, 8], []),  # two turns: the last is the one the request is about
        ([7, 7, 7], []),  # no turns
    ],
    ids=["system-user-header", "conversation", "preamble", "one-turn", "two-turns", "no-turns"],
)
def test_branch_points_are_every_turn_start_but_the_first_and_the_last(token_ids, expected):
    assert branch_points(token_ids, S) == expected


@pytest.mark.parametrize(
    ("positions", "points", "bin_size", "expected"),
    [
        ([16], [37], 4, [36]),  # M = 1: the prior's 16 moves up to the branch point 37 on the grid of 4
        ([12, 24, 36], [30], 4, [12, 28, 36]),  # the deepest position at or below 28 (24) takes its place
        ([12, 24, 36], [30, 18], 4, [16, 28, 36]),  # deepest first: 28 takes 24, then 16 takes 12
        ([12, 24, 36], [26, 25], 1, [25, 26, 36]),  # 26 takes 24, then 25 the next one down, 12
        ([12, 24], [24], 4, [12, 24]),  # a branch point planned already stays, nothing else moves
        ([4, 24], [9], 4, [8, 24]),  # 8 (on the grid) takes 4: checkpoints only move up
        ([12, 24], [5], 4, [12, 24]),  # no position at or below 4: skipped
        ([12, 24], [3], 4, [12, 24]),  # rounds down to 0: no checkpoint there
        ([12, 24], [], 4, [12, 24]),
    ],
)
def test_snap_to_turns_by_hand(positions, points, bin_size, expected):
    assert snap_to_turns(positions, points, bin_size) == expected


def test_snap_to_turns_rejects_a_bad_grid():
    with pytest.raises(ValueError, match="bin_size must be >= 1 token, got 0"):
        snap_to_turns([4], [5], 0)
