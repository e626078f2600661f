"""Edges of the engine's checkpoint planner (checkpoints/planner.py) that test_state_cache leaves open: a
baseline plans over the whole prompt, and what counts as evidence that moves `dp` off its prior."""

from minipic_lite.checkpoints.planner import CheckpointPlanner

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
