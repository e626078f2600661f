import pytest

from minipic_lite.checkpoints import CheckpointCache, EntryHistory, Planner, simulate


def test_tiny_stream_exact_counts():
    stream = [
        [1, 2, 3, 4, 5, 6, 7, 8],  # miss: 8 computed; cached with balanced(N=8, M=1) = {4}
        [1, 2, 3, 4, 5, 6, 9],  # shares 6 -> resumes at 4: 3 computed; replaces the first entry, {4}
        [1, 2, 3, 7],  # shares 3 < 4 -> resumes at 0: 4 computed; cached with {⌊5/2⌋} = {2}
        [1, 2, 3, 7],  # identical: depth capped at L − 1 = 3 -> resumes at 2: 2 computed; not re-cached
    ]
    result = simulate(stream, Planner("balanced", 1), num_entries=1)
    assert result.recomputed_per_request == [8, 3, 4, 2]
    assert (result.num_prompt_tokens, result.num_recomputed_tokens) == (23, 17)
    assert (result.num_checkpoints, result.num_resumed, result.num_requests) == (3, 2, 4)
    assert result.savings_factor == 23 / 17
    assert result.checkpoints_per_request == 3 / 4


@pytest.mark.parametrize(("eviction", "recomputed"), [("fifo", [8, 8, 5, 5]), ("lru", [8, 8, 5, 9])])
def test_fifo_and_lru_evict_different_entries(eviction, recomputed):
    a, b = [1] * 8, [2] * 8
    stream = [a, b, a + [5], b + [6]]  # a + [5] uses a, then its insertion evicts a (FIFO) or b (LRU)
    result = simulate(stream, Planner("balanced", 1), num_entries=2, eviction=eviction)
    assert result.recomputed_per_request == recomputed
    assert result.num_prompt_tokens == 34


@pytest.mark.parametrize("policy", ["none", "kv_only"])
def test_no_recurrent_checkpoints_recompute_everything(policy):
    stream = [[1, 2, 3, 4], [1, 2, 3, 4, 5], [1, 2, 3, 4, 5]]
    result = simulate(stream, Planner(policy, 8))
    assert result.num_recomputed_tokens == result.num_prompt_tokens == 14
    assert result.num_checkpoints == 0 and result.savings_factor == 1.0


def test_dp_learns_the_shared_document_online():
    doc = list(range(100, 110))  # 10 shared tokens, then 3-token questions that differ at once
    stream = [doc + [1, 1, 1], doc + [2, 2, 2], doc + [3, 3, 3]]
    planner = Planner("dp", 1, EntryHistory(prior_weight=0.0))
    result = simulate(stream, planner, num_entries=4)
    # 1st: nothing seen, no checkpoint. 2nd: shares 10 with the 1st, which has none -> all 13; history says
    # depth 10, so it is cached with {10}. 3rd: resumes at 10 from the 2nd entry: 3 computed.
    assert result.recomputed_per_request == [13, 13, 3]
    assert result.num_checkpoints == 2


def test_bad_configuration_raises():
    with pytest.raises(ValueError, match="num_entries must be >= 1"):
        CheckpointCache(0)
    with pytest.raises(ValueError, match="unknown eviction 'random'"):
        CheckpointCache(4, eviction="random")
    with pytest.raises(ValueError, match="request 1 has no tokens"):
        simulate([[1, 2], []], Planner("none", 0))
