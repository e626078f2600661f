"""Edges of the cost model (checkpoints/cost.py) and the simulator (checkpoints/simulator.py) that test_cost and
test_simulator leave open: a scalar is not 1-D weights, a bool is not a budget, positions come back unique, the worst
case counts only depths with mass and refuses zero mass as the expected cost does; no request resumes past L - 1 (a
checkpoint at L serves no identical request), equal overlaps go to the most recently used entry, an empty cache
matches at depth 0, and the per-request ratios of a one-request run. Also: a bad position beside good ones, the first
bad weight named, the default cache of 16 entries, ℓ below an entry's first checkpoint, a resume at the first token,
and an empty replay."""

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


def test_a_position_out_of_range_raises_beside_valid_ones():
    """Both ends of the sorted positions are checked: 0 beside 2, or N + 1 beside 1, raises."""
    with pytest.raises(ValueError, match=r"lie in 1..3, got \[0, 2\]"):
        validate_positions([2, 0], 3)
    with pytest.raises(ValueError, match=r"lie in 1..3, got \[1, 4\]"):
        validate_positions([4, 1], 3)


def test_bad_weights_are_reported_at_the_first_bad_depth():
    with pytest.raises(ValueError, match=r"finite: weights\[1\] = nan$"):
        validate_weights([1.0, float("nan"), float("inf")])
    with pytest.raises(ValueError, match=r"non-negative: weights\[1\] = -0.5$"):
        validate_weights([1.0, -0.5, -2.0])


def test_the_default_cache_holds_sixteen_entries():
    """16 entries by default: the first of 16 distinct requests is still cached for a 17th, not for an 18th.
    Each request of 4 tokens is cached with balanced(N=4, M=1) = {2}; the same request again resumes at 2."""
    distinct = [[i] * 4 for i in range(1, 18)]
    kept = simulate(distinct[:16] + [distinct[0]], Planner("balanced", 1))
    assert kept.recomputed_per_request[-1] == 2
    evicted = simulate(distinct + [distinct[0]], Planner("balanced", 1))
    assert evicted.recomputed_per_request[-1] == 4


def test_an_entry_resumes_from_the_empty_prefix_before_its_first_checkpoint():
    """ℓ(t; C) = max({0} ∪ {c ∈ C : c ≤ t}): 0 below the first checkpoint, else the deepest one not past t."""
    cache = CheckpointCache(1)
    cache.insert(np.array([1, 2, 3, 4, 5, 6]), [5, 2])
    entry = cache.entries[0]
    assert [entry.resume_depth(t) for t in range(7)] == [0, 0, 2, 2, 2, 5, 5]


def test_a_resume_at_the_first_token_counts_as_resumed():
    """[5, 6] is cached with balanced(N=2, M=1) = {1}; [5, 7] shares 1 token and resumes there."""
    result = simulate([[5, 6], [5, 7]], Planner("balanced", 1))
    assert result.recomputed_per_request == [2, 1] and result.num_resumed == 1


def test_an_empty_replay_has_zero_ratios():
    """No request: nothing computed and nothing saved; the ratios are 0, not a division by zero."""
    result = simulate([], Planner("balanced", 1))
    assert (result.num_requests, result.savings_factor, result.checkpoints_per_request) == (0, 0.0, 0.0)


def test_a_request_that_is_a_prefix_of_a_cached_entry_is_an_entry_of_its_own():
    """Only an identical request is not cached again: one that a cached entry merely starts with is a new entry, with
    its own checkpoints (here at its end, 3), so a later request that leaves it at depth 3 resumes there."""
    result = simulate([[1, 2, 3, 4, 5], [1, 2, 3], [1, 2, 3, 7]], CheckpointsAtTheEnd(), num_entries=4)
    assert result.num_checkpoints == 3 and result.recomputed_per_request == [5, 3, 1]  # three entries
    cache = CheckpointCache(4)
    cache.insert(np.array([1, 2, 3, 4, 5]), [])
    assert cache.contains(np.array([1, 2, 3, 4, 5])) and not cache.contains(np.array([1, 2, 3]))
