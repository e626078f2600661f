"""Edges of the engine's checkpoint planner (checkpoints/planner.py) that test_state_cache leaves open: a
baseline plans over the whole prompt, what counts as evidence that moves `dp` off its prior (one shared token is), a
planner re-plans after every observation by default, and the engine's planner and its estimator share one window."""

import numpy as np

from minipic_lite.checkpoints import DepthHistogram, Planner
from minipic_lite.checkpoints.planner import CheckpointPlanner
from minipic_lite.checkpoints.simulator import simulate

B = 4


def test_a_baseline_plans_over_every_token_of_the_prompt():
    assert CheckpointPlanner("last", budget=1, bin_size=B, prior="balanced").plan(range(64)) == [64]
    assert CheckpointPlanner("last", budget=1, bin_size=1, prior="balanced").plan(range(10)) == [10]


def test_a_recent_prompt_that_shares_nothing_is_no_evidence():
    planner = CheckpointPlanner("dp", budget=2, bin_size=B, prior="balanced")
    planner.observe(list(range(100, 164)))
    unrelated = list(range(500, 564))
    assert not planner.has_evidence(unrelated)
    assert planner.plan(unrelated) == [20, 40]  # the prior's (balanced) plan
    assert planner.has_evidence(list(range(100, 108)) + list(range(600, 656)))  # shares 8 tokens with it


def test_a_learned_distance_is_evidence_for_any_prompt():
    planner = CheckpointPlanner("dp", budget=2, bin_size=B, prior="balanced")
    first = list(range(100, 164))
    planner.observe(first)
    planner.observe(first[:40] + list(range(24)))  # it leaves the first at depth 40: a distance is learned
    assert planner.planner.estimator.suffix.num_observations == 1
    assert planner.has_evidence(list(range(500, 564)))


def test_observe_measures_the_depth_without_the_prompts_last_token_and_only_against_a_shared_prefix():
    planner = CheckpointPlanner("dp", budget=2, bin_size=B, prior="balanced")
    seen = []
    planner.planner.observe = lambda ids, depth, best: seen.append((depth, None if best is None else len(best)))
    planner.observe(list(range(100, 116)))
    planner.observe(list(range(100, 116)))  # the same prompt again: its last token is computed anyway
    planner.observe(list(range(500, 516)))  # shares nothing: no entry
    assert seen == [(0, None), (15, 16), (0, None)]


def test_a_planner_replans_after_every_observation_by_default():
    """The plan cached for a length is dropped as soon as one new request is observed (replan_every = 1)."""
    planner = Planner("dp", 1, DepthHistogram(prior_weight=0.0))
    entry = np.arange(8)
    assert planner.plan(entry) == []  # no mass at all: no checkpoint helps
    planner.observe(entry, 3, np.arange(8))  # one request left an entry of 8 tokens at depth 3
    assert planner.plan(entry) == [3]


def test_the_engines_planner_and_its_estimator_look_at_the_same_recent_prompts():
    """The overlap estimate and the depth of a new prompt are read over one window of recent prompts."""
    planner = CheckpointPlanner("dp", budget=2, bin_size=B, prior="balanced")
    assert planner.recent.maxlen == planner.planner.estimator.history.maxlen


def test_a_recent_prompt_that_shares_one_token_is_evidence():
    planner = CheckpointPlanner("dp", budget=2, bin_size=B, prior="balanced")
    planner.observe(list(range(100, 164)))
    assert planner.has_evidence([100] + list(range(600, 663)))


def test_dps_estimate_is_uniform_past_the_shared_header_until_a_request_leaves_a_prompt():
    """A recent prompt shares 3 tokens of a new one (N = 8): history 1 at 3; its own request 1/5 on each of 4..8
    (past the header, what `balanced` assumes); the prior 1/8 on each of 1..8."""
    planner = CheckpointPlanner("dp", budget=1, bin_size=1, prior="balanced")
    planner.observe([1, 2, 3, 9])
    weights = planner.planner.estimator.weights_for(np.array([1, 2, 3, 4, 5, 6, 7, 8]))
    np.testing.assert_allclose(weights, [0, 1 / 8, 1 / 8, 1 + 1 / 8] + [1 / 5 + 1 / 8] * 5)


def test_observe_breaks_a_tie_of_depth_toward_the_most_recent_prompt_as_the_simulator_does():
    """C shares 3 tokens with A and with B: the entry it is observed against (whose length past the branch the
    estimator learns) is B, the more recent, as `simulator.py`'s cache picks the most recently used entry. Before:
    A, the oldest (a helper's mutation test found the tie untested)."""
    a, b, c = list(range(1, 9)), [1, 2, 3, 9, 9], [1, 2, 3, 7, 7, 7]
    planner, seen = CheckpointPlanner("dp", budget=2, bin_size=B, prior="balanced"), []
    planner.planner.observe = lambda ids, depth, best: seen.append((depth, None if best is None else best.tolist()))
    for prompt in (a, b, c):
        planner.observe(prompt)

    class Recording:  # a checkpoint at each entry's end; records what it observes
        def plan(self, token_ids) -> list[int]:
            return [len(token_ids)]

        def observe(self, token_ids, depth, entry_token_ids) -> None:
            simulated.append((depth, None if entry_token_ids is None else entry_token_ids.tolist()))

    simulated = []
    simulate([a, b, c], Recording())
    assert seen == simulated == [(0, None), (3, a), (3, b)]
