"""Edges of the placement policies: a prefix whose length is a multiple of the block or bin, direct calls with a
budget past N, and bin_size validation."""

import numpy as np
import pytest

from minipic_lite.checkpoints import bin_weights, plan
from minipic_lite.checkpoints.policies import balanced, block


def test_block_places_a_checkpoint_at_the_end_of_a_prefix_of_whole_blocks():
    assert block(np.ones(33), 4, block_size=16) == [16, 32]  # N = 32
    assert plan("block", np.ones(1025), 4) == [512, 1024]  # the default block of 512 tokens


def test_balanced_called_with_a_budget_past_n_places_nothing_at_zero():
    assert balanced(np.ones(3), 5) == [1, 2]  # N = 2: ⌊i·3/6⌋ for i = 1..5 is 0, 1, 1, 2, 2


def test_binned_dp_can_place_its_one_aligned_position_when_n_is_one_bin():
    weights = np.zeros(65)  # N = 64 = bin_size: 64 is an aligned position
    weights[64] = 1.0
    assert plan("dp", weights, 1, bin_size=64) == [64]


def test_bin_weights_of_a_prefix_of_whole_bins_has_one_bin_past_them():
    assert bin_weights(np.ones(8), 4).tolist() == [4.0, 4.0]  # N = 7: depths 0..3 and 4..7
    assert bin_weights(np.ones(9), 4).tolist() == [4.0, 4.0, 1.0]  # N = 8: depth 8 in a bin of its own


def test_a_bool_bin_size_is_refused():
    with pytest.raises(ValueError, match="bin_size must be an integer >= 1, got True"):
        plan("balanced", np.ones(11), 2, bin_size=True)
