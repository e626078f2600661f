"""Edges of the cost model (checkpoints/cost.py) and the simulator (checkpoints/simulator.py) that test_cost and
test_simulator leave open: a scalar is not 1-D weights, a bool is not a budget, positions come back unique, the worst
case counts only depths with mass and refuses zero mass as the expected cost does; no request resumes past L - 1 (a
checkpoint at L serves no identical request), equal overlaps go to the most recently used entry, an empty cache
matches at depth 0, and the per-request ratios of a one-request run."""

import numpy as np
import pytest

from minipic_lite.checkpoints import CheckpointCache, Planner, simulate, worst_case_cost
from minipic_lite.checkpoints.cost import validate_budget, validate_positions, validate_weights


def test_a_scalar_is_not_one_dimensional_weights_and_a_bool_is_not_a_budget():
    with pytest.raises(ValueError, match=r"weights must be 1-D \(the mass of depths 0..N\), got shape \(\)"):
        validate_weights(5.0)
    with pytest.raises(ValueError, match="budget must be an integer number of checkpoints, got True"):
        validate_budget(True)
    assert validate_budget(np.int64(3)) == 3


def test_positions_come_back_sorted_and_unique():
    assert validate_positions([3, 1, 3], 5).tolist() == [1, 3]


def test_the_worst_case_counts_only_depths_with_mass_and_refuses_zero_mass():
    assert worst_case_cost([1, 0, 0, 0], []) == 0  # only depth 0 has mass: depth 3 would recompute 3
    assert worst_case_cost([0, 1, 0, 1, 0], [1]) == 2  # depths 1 and 3: 0 and 3 - 1; depth 4 has none
    with pytest.raises(ValueError, match="weights sum to zero"):
        worst_case_cost([0, 0, 0], [1])


class CheckpointsAtTheEnd:
    """A stand-in planner: one checkpoint at each entry's last token."""

    def plan(self, token_ids) -> list[int]:
        return [len(token_ids)]

    def observe(self, token_ids, depth, entry_token_ids) -> None:
        pass


def test_an_identical_request_resumes_at_most_at_its_second_last_token():
    """A checkpoint at L lies past the capped depth L - 1: the same request again recomputes all of it."""
    result = simulate([[1, 2, 3, 4], [1, 2, 3, 4]], CheckpointsAtTheEnd(), num_entries=2)
    assert result.recomputed_per_request == [4, 4] and result.num_resumed == 0


def test_equal_overlaps_go_to_the_most_recently_used_entry_and_an_empty_cache_matches_at_zero():
    cache = CheckpointCache(4)
    assert cache.match(np.array([1, 2, 3])) == (0, None, 0)
    cache.insert(np.array([1, 2, 3, 9]), [])
    cache.insert(np.array([1, 2, 3, 8]), [])  # used later than the first
    resume, best, depth = cache.match(np.array([1, 2, 3, 5]))
    assert (resume, depth, best.token_ids.tolist()) == (0, 3, [1, 2, 3, 8])
    cache.touch(cache.entries[0])
    assert cache.match(np.array([1, 2, 3, 5]))[1].token_ids.tolist() == [1, 2, 3, 9]


def test_the_ratios_of_a_one_request_run():
    """One request of 4 tokens computes all 4 and is cached with balanced(N=4, M=1) = {2}."""
    one_token = simulate([[7]], Planner("none", 0))
    assert (one_token.num_recomputed_tokens, one_token.savings_factor) == (1, 1.0)
    result = simulate([[1, 2, 3, 4]], Planner("balanced", 1))
    assert (result.num_checkpoints, result.checkpoints_per_request) == (1, 1.0)


class Recording(CheckpointsAtTheEnd):
    def __init__(self):
        self.observed = []

    def observe(self, token_ids, depth, entry_token_ids) -> None:
        self.observed.append((token_ids.tolist(), depth, None if entry_token_ids is None else entry_token_ids.tolist()))


def test_the_planner_observes_each_request_with_its_overlap_depth_and_best_entry():
    """Depth: the overlap with the best entry (3), not where the request resumed (0: the entry's only checkpoint
    lies at its end, past 3)."""
    planner = Recording()
    simulate([[1, 2, 3, 4, 5], [1, 2, 3, 9, 9]], planner, num_entries=2)
    assert planner.observed == [([1, 2, 3, 4, 5], 0, None), ([1, 2, 3, 9, 9], 3, [1, 2, 3, 4, 5])]
