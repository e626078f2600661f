"""Span dedup, the span policies (inline / isps / barrier) and the host tier, on the scheduler and the KV-cache
manager with exact block ids and token counts (no model; `check_integrity()` after every step)."""

import dataclasses

import pytest
import torch

from minipic_lite.chunks import plan_chunk
from minipic_lite.config import ControlTokens, SchedulerConfig
from minipic_lite.hashing import root_hash
from minipic_lite.host_tier import BlockCopy, HostTier
from minipic_lite.kv_cache_manager import KVCacheManager, Rerotate
from minipic_lite.request import Request
from minipic_lite.sampling_params import SamplingParams
from minipic_lite.scheduler import Scheduler
from minipic_lite.spans import span_layout

B = 4
S, P, PAD = 1, 2, 3
CONTROL = ControlTokens(ssep_id=S, pdep_id=P, pad_id=PAD)
ROOT = root_hash("test-span-scheduling")
DOC = [S, 30, 31, 32, 33, 34, 35, 36]  # an SSEP span of two blocks
DOC2 = [S, 40, 41, 42, 43, 44, PAD, PAD]


def request(request_id, token_ids, max_tokens=2):
    token_ids, params = list(token_ids), SamplingParams(max_tokens=max_tokens)
    return Request(request_id, token_ids, params, B, ROOT, span_layout(token_ids, CONTROL, B))


def scheduler(num_blocks=32, budget=256, max_num_seqs=8, policy="inline", num_host_blocks=0, span_ahead_tokens=None):
    config = SchedulerConfig(max_num_seqs, budget, 1024, span_policy=policy, span_ahead_tokens=span_ahead_tokens)
    return Scheduler(config, KVCacheManager(num_blocks, num_host_blocks=num_host_blocks))


def step(sched, computed=None):
    """One engine step without a model (token 7 sampled); `computed` collects (request id, position) pairs."""
    out = sched.schedule()
    for s in out.scheduled:
        for start, end in s.query_ranges:
            computed is not None and computed.extend((s.seq.request_id, p) for p in range(start, end))
    sampled = [[7] if s.do_sample else [] for s in out.scheduled]
    sched.postprocess(out, sampled, lambda req: req.num_output_tokens >= req.sampling_params.max_tokens and (
        sched.finish(req, "length") or True))  # fmt: skip
    sched.kv.check_integrity()
    return out


def run(sched, computed=None, max_steps=200):
    for _ in range(max_steps):
        if not sched.has_unfinished:
            return
        step(sched, computed)
    raise AssertionError("requests did not finish")


def positions_of(computed, request_id):
    return [p for r, p in computed if r == request_id]


# -- dedup ---------------------------------------------------------------------------------------------------


def test_the_same_document_twice_in_one_prompt_is_computed_once():
    sched = scheduler()
    a = request("a", [20, 21, 22, PAD] + DOC + DOC + [P, 60, 61])
    sched.add(a)
    computed = []
    run(sched, computed)
    assert a.block_table[3:5] == a.block_table[1:3]  # one physical copy at two offsets
    assert a.cached_block_ids == {3, 4} and a.waiting_blocks == set()
    prompt_positions = [p for p in positions_of(computed, "a") if p < 23]
    assert prompt_positions == list(range(12)) + list(range(20, 23))  # the second copy [12, 20) never computed
    assert sched.kv.pool.num_free_blocks == 32 and not sched.kv.pending and not sched.kv.waiters


@pytest.mark.parametrize("policy", ["isps", "barrier"])
def test_a_document_twice_in_a_prompt_whose_spans_go_ahead_is_computed_once(policy):
    sched = scheduler(max_num_seqs=1, policy=policy)
    a = request("a", [20, 21, 22, PAD, P, 60, 61], max_tokens=4)  # no spans: it takes the only seat
    b = request("b", [25, 26, 27, PAD] + DOC + DOC + [P, 60, 62])
    sched.add(a)
    sched.add(b)
    computed = []
    run(sched, computed)
    # the span prefill holds the first copy alone (the second waits for it), and b's final hits both copies
    assert [(r, p) for r, p in computed if r.startswith("b/")] == [("b/span1", p) for p in range(8)]
    assert [p for p in positions_of(computed, "b") if p < 20] == [0, 1, 2, 3]
    assert b.cached_block_ids == {1, 2, 3, 4} and b.block_table[3:5] == b.block_table[1:3]


def test_a_request_admitted_while_another_computes_the_document_waits_for_its_blocks():
    kv = KVCacheManager(16)
    a = request("a", [20, 21, 22, PAD] + DOC + [P, 60, 61])
    b = request("b", [25, 26, 27, PAD] + DOC + [P, 60, 62])
    assert kv.allocate_prompt(a)
    kv.publish(a, 6)  # a's first chunk [0, 6) is scheduled: block 0 published, the document's are not
    assert kv.allocate_prompt(b)
    assert b.block_table[1:3] == a.block_table[1:3] and b.waiting_blocks == {1, 2} and b.cached_block_ids == {1, 2}
    assert plan_chunk(b, 100) == ([(0, 4)], 4)  # b stops where a's blocks are not written yet
    kv.check_integrity()
    kv.publish(a, 12)
    assert b.waiting_blocks == set() and plan_chunk(b, 100) == ([(0, 4), (12, 15)], 15)
    kv.free(a)
    kv.free(b)
    kv.check_integrity()
    assert kv.num_free_blocks == 16 and not kv.pending and not kv.waiters


def test_when_the_computing_request_goes_the_waiting_one_computes_the_rest_itself():
    kv = KVCacheManager(16)
    a = request("a", [20, 21, 22, PAD] + DOC + [P, 60, 61])
    b = request("b", [25, 26, 27, PAD] + DOC + [P, 60, 62])
    assert kv.allocate_prompt(a)
    kv.publish(a, 8)  # the document's first block is written, its second is not
    assert kv.allocate_prompt(b) and b.waiting_blocks == {2}
    kv.free(a)  # a is aborted (or preempted)
    kv.check_integrity()
    assert b.waiting_blocks == set() and b.cached_block_ids == {1} and kv.pending[b.block_hashes[2]][1] is b
    assert b.num_cached_tokens == 4 and plan_chunk(b, 100) == ([(0, 4), (8, 15)], 15)
    kv.publish(b, 15)
    assert not kv.pending
    kv.free(b)
    kv.check_integrity()


# -- the policies -------------------------------------------------------------------------------------------


def test_isps_admits_a_prompt_that_has_a_seat_whole_and_computes_the_next_spans_beside_it():
    sched = scheduler(max_num_seqs=1, policy="isps")
    a = request("a", [20, 21, 22, PAD] + DOC + [P, 60, 61], max_tokens=4)
    b = request("b", [25, 26, 27, PAD] + DOC2 + [P, 60, 62])
    sched.add(a)
    sched.add(b)
    first, second = step(sched), step(sched)
    # a has the seat: its span is computed in its own prefill (no span prefill of it); b waits for the only
    # seat, so its span is computed ahead in the budget left
    assert [(s.seq.request_id, s.query_ranges, s.do_sample) for s in first.scheduled] == [
        ("a", [(0, 15)], True),
        ("b/span1", [(0, 8)], False),
    ]
    assert [(s.seq.request_id, s.query_ranges) for s in second.scheduled] == [("a", [(15, 16)])]  # a decodes
    run(sched)
    assert a.num_output_tokens == 4 and b.num_output_tokens == 2 and not sched.span_running


def test_isps_overlaps_span_prefill_of_later_requests_with_decodes_and_then_admits_the_final_with_hits():
    sched = scheduler(max_num_seqs=1, policy="isps")
    a = request("a", [20, 21, 22, PAD, P, 60, 61], max_tokens=4)  # no spans
    b = request("b", [25, 26, 27, PAD] + DOC2 + [P, 60, 62])
    sched.add(a)
    sched.add(b)
    first = step(sched)  # a takes the only seat; b's span is computed in the same step, beside a's prefill
    assert [(s.seq.request_id, s.query_ranges) for s in first.scheduled] == [("a", [(0, 7)]), ("b/span1", [(0, 8)])]
    second = step(sched)  # a decodes; b waits for the seat with its span cached
    assert [(s.seq.request_id, s.query_ranges) for s in second.scheduled] == [("a", [(7, 8)])]
    computed = []
    run(sched, computed)
    assert b.cached_block_ids == {1, 2} and [p for p in positions_of(computed, "b") if p < 15] == [
        0,
        1,
        2,
        3,
        12,
        13,
        14,
    ]
    assert b.num_output_tokens == 2


def test_isps_computes_a_prompts_missing_spans_as_one_span_prefill_leaving_out_one_another_computes():
    sched = scheduler(max_num_seqs=2, policy="isps")
    doc3 = [S, 50, 51, 52, 53, 54, 55, 56]
    a = request("a", [20, 21, 22, PAD, P, 60, 61], max_tokens=4)  # no spans: a and x take the two seats
    x = request("x", [23, 21, 22, PAD, P, 60, 61], max_tokens=4)
    b = request("b", [25, 26, 27, PAD] + DOC + DOC2 + [P, 60, 62])
    c = request("c", [28, 29, 30, PAD] + doc3 + DOC2 + [P, 60, 63])  # DOC2 as b has it
    for req in (a, x, b, c):
        sched.add(req)
    computed = []
    first = step(sched, computed)
    # b's two spans in one unit; c's DOC2 is being computed by b's unit: c's unit holds doc3 alone
    assert [(s.seq.request_id, s.query_ranges) for s in first.scheduled] == [
        ("a", [(0, 7)]),
        ("x", [(0, 7)]),
        ("b/span1,2", [(0, 16)]),
        ("c/span1", [(0, 8)]),
    ]
    assert first.scheduled[2].seq.visible_start == [0] * 8 + [8] * 8  # each span sees only itself
    run(sched, computed)
    assert b.cached_block_ids == c.cached_block_ids == {1, 2, 3, 4}  # both finals hit both of their spans
    assert [p for p in positions_of(computed, "b") + positions_of(computed, "c") if p < 20] == [
        0, 1, 2, 3, 0, 1, 2, 3,
    ]  # fmt: skip
    assert b.num_output_tokens == c.num_output_tokens == 2


def isps_span_tokens_while_a_runs(span_ahead_tokens):
    """Span tokens of each step while "a" runs and "b" (two spans of 8 tokens) waits for the one seat."""
    sched = scheduler(max_num_seqs=1, policy="isps", span_ahead_tokens=span_ahead_tokens)
    a = request("a", [20, 21, 22, PAD, P, 60, 61], max_tokens=6)  # no spans: it prefills, then decodes
    b = request("b", [25, 26, 27, PAD] + DOC + DOC2 + [P, 60, 62])
    sched.add(a)
    sched.add(b)
    span_tokens = []
    while not a.is_finished:
        out = step(sched)
        assert [s.seq.request_id for s in out.scheduled][0] == "a"
        span_tokens.append(sum(s.num_query_tokens for s in out.scheduled if s.seq.is_span_prefill))
    run(sched)
    assert b.cached_block_ids == {1, 2, 3, 4} and b.num_output_tokens == 2  # its final hits both spans
    return span_tokens


def test_isps_computes_the_spans_ahead_in_the_budget_the_running_requests_leave():
    """By default (no cap) both spans of the waiting prompt are computed in the first step, beside a's prefill."""
    assert isps_span_tokens_while_a_runs(None) == [16, 0, 0, 0, 0, 0]


def test_isps_computes_at_most_span_ahead_tokens_of_spans_a_step_while_others_run():
    """With a cap, the spans ride along in the running request's steps, a few tokens a step."""
    assert isps_span_tokens_while_a_runs(5) == [5, 5, 5, 1, 0, 0]


def test_span_ahead_tokens_must_be_none_or_an_integer_of_zero_or_more():
    assert SchedulerConfig().span_ahead_tokens is None
    assert SchedulerConfig(span_ahead_tokens=0).span_ahead_tokens == 0
    for bad in (-1, 2.5, "256", True):
        with pytest.raises(ValueError, match="span_ahead_tokens"):
            SchedulerConfig(span_ahead_tokens=bad)


def test_barrier_admits_no_final_while_a_waiting_prompt_misses_a_span():
    sched = scheduler(budget=8, policy="barrier")
    a = request("a", [20, 21, 22, PAD] + DOC + [P, 60, 61])
    b = request("b", [25, 26, 27, PAD] + DOC2 + [P, 60, 62])
    sched.add(a)
    sched.add(b)
    out = step(sched)
    assert [s.seq.request_id for s in out.scheduled] == ["a/span1"]  # the budget of 8: one span per step
    out = step(sched)
    assert [s.seq.request_id for s in out.scheduled] == ["b/span1"]
    out = step(sched)
    assert [s.seq.request_id for s in out.scheduled] == ["a", "b"]  # every span is cached: finals, with hits
    run(sched)
    assert a.cached_block_ids == {1, 2} and b.cached_block_ids == {1, 2}


@pytest.mark.parametrize("policy", ["barrier", "isps"])
def test_barrier_computes_the_next_batch_spans_only_after_the_last_batch_finals_isps_beside_them(policy):
    """One seat (batches of one request): b's span waits for a to finish under barrier (SPNL), and is computed
    beside a's decodes under isps."""
    sched = scheduler(max_num_seqs=1, policy=policy)
    a = request("a", [20, 21, 22, PAD, P, 60, 61], max_tokens=4)  # no spans: its final goes first
    b = request("b", [25, 26, 27, PAD] + DOC2 + [P, 60, 62])
    sched.add(a)
    sched.add(b)
    steps = [[(s.seq.request_id, s.query_ranges) for s in step(sched).scheduled] for _ in range(5)]
    if policy == "barrier":
        assert steps == [
            [("a", [(0, 7)])],
            [("a", [(7, 8)])],
            [("a", [(8, 9)])],
            [("a", [(9, 10)])],  # a's fourth token: it finishes
            [("b/span1", [(0, 8)])],  # only now the next batch's span
        ]
    else:
        assert steps[:2] == [[("a", [(0, 7)]), ("b/span1", [(0, 8)])], [("a", [(7, 8)])]]
    run(sched)
    assert b.cached_block_ids == {1, 2} and b.num_output_tokens == 2


def test_a_span_prefill_never_preempts_a_request():
    sched = scheduler(num_blocks=6, max_num_seqs=1, policy="isps")
    a = request("a", [20, 21, 22, PAD, P, 60, 61], max_tokens=6)  # 2 blocks, growing to 4
    b = request("b", [25, 26, 27, PAD] + DOC2 + [P, 60, 62])  # its span needs 2 blocks
    sched.add(a)
    sched.add(b)
    run(sched)
    assert a.num_preemptions == 0 and a.num_output_tokens == 6 and b.num_output_tokens == 2


@pytest.mark.parametrize("policy", ["inline", "isps", "barrier"])
def test_every_policy_finishes_a_mix_sharing_documents_with_no_block_lost(policy):
    sched = scheduler(num_blocks=14, budget=6, max_num_seqs=2, policy=policy)
    prompts = [
        [20, 21, 22, PAD] + DOC + DOC2 + [P, 60, 61],
        [25, PAD, PAD, PAD] + DOC2 + DOC + [P, 62],
        DOC + DOC + [P, 63, 64, 65, 66],
        [26, 27, 28, 29, P, 67],
    ]
    requests = [request(str(i), p, max_tokens=3) for i, p in enumerate(prompts)]
    for r in requests:
        sched.add(r)
    run(sched)
    assert all(r.num_output_tokens == 3 for r in requests)
    assert sched.kv.pool.num_free_blocks == 14 and not sched.kv.pending and not sched.kv.waiters
    with pytest.raises(ValueError, match="span_policy must be one of inline, isps, barrier"):
        dataclasses.replace(sched.config, span_policy="eager")


# -- the host tier -------------------------------------------------------------------------------------------


def test_host_tier_is_lru_and_never_evicts_a_pinned_slot():
    host = HostTier(2)
    assert (host.store(b"a"), host.store(b"b")) == (0, 1)
    assert host.store(b"a") is None  # here already: fresher, no copy
    host.pinned = {b"b"}
    assert host.store(b"c") == 0 and b"a" not in host  # "b" was older but pinned: "a" goes
    host.pinned = {b"b", b"c"}
    assert host.store(b"d") is None and b"d" not in host
    assert host.load(b"b") == 1 and host.num_loaded == 1 and host.num_stored == 3
    host.check_integrity()


def test_an_evicted_block_comes_back_from_the_host_tier_into_any_free_block():
    kv = KVCacheManager(3, num_host_blocks=8)
    a = request("a", [20, 21, 22, 23, 24, 25, 26, 27, 28])  # blocks 0, 1 full
    assert kv.allocate_prompt(a) and a.block_table == [0, 1, 2]
    kv.publish(a, 9)
    kv.free(a)  # free queue (LRU): [1, 2] then [0] ... tail first: 2, 1, 0
    b = request("b", [50, 51, 52, 53, 54, 55, 56, 57, 58])  # evicts all three of a's blocks
    assert kv.allocate_prompt(b)
    copies = kv.take_copies()
    assert copies == [BlockCopy(True, 1, 0), BlockCopy(True, 0, 1)]  # only full (hashed) blocks go to the host
    kv.publish(b, 9)
    kv.free(b)
    a2 = request("a2", [20, 21, 22, 23, 24, 25, 26, 27, 99])
    assert kv.allocate_prompt(a2) and a2.cached_block_ids == {0, 1} and kv.num_host_hits == 2
    copies = kv.take_copies()
    # in order: block 1 goes out to the host (b's hash) before a's block comes into it
    assert a2.block_table == [0, 1, 2]
    assert copies == [BlockCopy(False, 0, 1), BlockCopy(True, 1, 2), BlockCopy(False, 1, 0), BlockCopy(True, 2, 3)]
    kv.check_integrity()
    assert kv.pool.peek(a2.block_hashes[0]) == a2.block_table[0]  # published: others hit it at once


# -- the copy-rerotate baseline ------------------------------------------------------------------------------


@pytest.mark.parametrize(("rotary_dim", "delta"), [(64, 40), (64, -24), (32, 300)])
def test_rerotate_turns_keys_rotated_at_p_into_keys_rotated_at_p_plus_delta(rotary_dim, delta):
    from minipic_lite.model_runner import rerotate
    from ops.rope import apply_rope, rope_cos_sin

    cos_sin = rope_cos_sin(512, rotary_dim, 10000.0)
    deltas = torch.tensor([delta, -(abs(delta) % 90), 0])  # three blocks, each turned by its own delta
    keys = torch.randn(3, 2, B, 3, 64, dtype=torch.float64).float()  # [copies, layers, block tokens, heads, head dim]
    positions = torch.arange(100, 100 + B)
    at_p = torch.stack([torch.stack([apply_rope(layer, positions, cos_sin) for layer in block]) for block in keys])
    turned = [
        [apply_rope(layer, positions + d, cos_sin) for layer in block] for block, d in zip(keys, deltas, strict=True)
    ]
    at_p_delta = torch.stack([torch.stack(block) for block in turned])
    assert (rerotate(at_p, deltas, cos_sin) - at_p_delta).abs().max() < 1e-5


def test_rerotate_copies_are_cut_into_batches_where_one_reads_what_an_earlier_one_writes():
    from minipic_lite.model_runner import independent_batches

    copies = [Rerotate(5, 6, 4), Rerotate(5, 7, 8), Rerotate(6, 8, 4), Rerotate(9, 5, 4), Rerotate(8, 10, 4)]
    batches = independent_batches(copies)  # 6 is written by the first, read by the third; 8 likewise
    assert batches == [copies[:2], copies[2:4], copies[4:]]
    assert independent_batches(copies, max_blocks=1) == [[copy] for copy in copies]
    assert independent_batches(copies[:2] + copies[3:4], max_blocks=2) == [copies[:2], copies[3:4]]
    assert independent_batches([]) == []


def test_a_span_hit_at_another_offset_is_a_rotated_private_copy_and_at_the_same_offset_a_shared_block():
    kv = KVCacheManager(16, rerotate=True)
    a = request("a", [20, 21, 22, PAD] + DOC + [P, 60, 61])
    assert kv.allocate_prompt(a)
    kv.publish(a, 15)
    kv.free(a)
    b = request("b", [25, 26, 27, 28, 29, 30, 31, PAD] + DOC + [P, 60, 62])  # the document 4 tokens later
    assert kv.allocate_prompt(b) and b.cached_block_ids == {2, 3}
    assert kv.take_copies() == [Rerotate(1, b.block_table[2], 4), Rerotate(2, b.block_table[3], 4)]
    assert b.block_table[2:4] != [1, 2] and kv.num_rerotated == 2
    kv.free(b)
    c = request("c", [20, 21, 22, PAD] + DOC + [P, 60, 63])  # where a computed it: shared, no copy
    assert kv.allocate_prompt(c) and c.block_table[1:3] == [1, 2] and kv.take_copies() == []
    kv.check_integrity()


def test_rerotate_admission_counts_the_copy_sources_it_takes_out_of_the_free_queue():
    kv = KVCacheManager(7, rerotate=True)
    a = request("a", [20, 21, 22, PAD] + DOC + [P, 60, 61])  # 4 blocks: the document's 2 end up free, cached
    assert kv.allocate_prompt(a)
    kv.publish(a, 15)
    kv.free(a)
    held = request("held", [50, 51])
    assert kv.allocate_prompt(held)  # one block in use: 6 free
    b = request("b", [25, 26, 27, 28, 29, 30, 31, PAD] + DOC + [P, 60, 62])  # 5 blocks, 2 of them copies
    # 6 free blocks, but the 2 copy sources must stay intact while b takes its 5 fresh blocks: not enough yet
    assert not kv.allocate_prompt(b) and kv.num_free_blocks == 6 and kv.take_copies() == []
    kv.check_integrity()


def test_rerotate_computes_the_blocks_again_when_copies_and_sources_never_fit_in_the_cache():
    kv = KVCacheManager(6, rerotate=True)
    a = request("a", [20, 21, 22, PAD] + DOC + [P, 60, 61])
    assert kv.allocate_prompt(a)
    kv.publish(a, 15)
    kv.free(a)
    b = request("b", [25, 26, 27, 28, 29, 30, 31, PAD] + DOC + [P, 60, 62])
    # 5 fresh blocks + 2 sources > 6 blocks in all: waiting could never end, so the document is computed again
    assert kv.allocate_prompt(b) and b.cached_block_ids == set() and kv.take_copies() == []
    assert kv.num_free_blocks == 1
    kv.check_integrity()


@pytest.mark.parametrize("policy", ["isps", "barrier"])
def test_spans_computed_ahead_that_do_not_fit_together_never_stall_the_queue(policy):
    """Three documents of two blocks per prompt, two prompts looked ahead, ten blocks: the spans computed ahead
    evict each other, so a policy that waits until all of them are cached at once would wait forever."""
    sched = scheduler(num_blocks=10, budget=16, max_num_seqs=2, policy=policy)
    docs = [[S, 30 + 8 * d, 31 + 8 * d, 32 + 8 * d, 33 + 8 * d, 34 + 8 * d, PAD, PAD] for d in range(9)]
    requests = [request(str(i), [20 + i, PAD, PAD, PAD] + sum(docs[3 * i : 3 * i + 3], []) + [P, 60]) for i in range(3)]
    for r in requests:
        sched.add(r)
    computed = []
    run(sched, computed, max_steps=100)
    assert all(r.num_output_tokens == 2 for r in requests) and sched.kv.pool.num_free_blocks == 10
    # spans are computed ahead only for prompts that fit in the free blocks together: nothing computed twice
    assert len(computed) == 3 * 30 + 3  # 3 prompts of 30 tokens, one decode step each


def test_isps_asks_no_lookahead_while_every_waiting_prompts_spans_are_had_and_nothing_was_lost():
    """Host time: with the seats full and every span of the waiting prompts cached or being computed, the lookahead
    (a match per waiting prompt) would start nothing: it is not asked again until a block is lost (evicted)."""
    sched = scheduler(max_num_seqs=1, policy="isps")
    a = request("a", [20, 21, 22, PAD, P, 60, 61], max_tokens=8)  # no spans: it takes the only seat
    b = request("b", [25, 26, 27, PAD] + DOC2 + [P, 60, 62])
    sched.add(a)
    sched.add(b)
    asked = []
    lookahead = sched._lookahead
    sched._lookahead = lambda: asked.append(len(asked)) or lookahead()
    step(sched)  # a's prefill, b's span beside it
    step(sched)  # a decodes; b's span is cached: seen complete
    num_asked = len(asked)
    step(sched)
    step(sched)
    assert len(asked) == num_asked  # nothing missing ahead, nothing lost: not asked
    sched.kv.num_losses += 1  # as an eviction would
    step(sched)
    assert len(asked) == num_asked + 1
    run(sched)
    assert b.cached_block_ids == {1, 2} and b.num_output_tokens == 2


def test_a_prompt_queued_behind_one_seen_complete_still_gets_its_spans_computed_ahead():
    """The lookahead is skipped only while EVERY waiting prompt it could take was seen with no missing span: one
    that joins the queue behind such a prompt has its span computed ahead in the next step."""
    sched = scheduler(max_num_seqs=2, policy="isps")
    a = request("a", [20, 21, 22, PAD, P, 60, 61], max_tokens=8)  # no spans: a and x take the two seats
    x = request("x", [23, 21, 22, PAD, P, 60, 61], max_tokens=8)
    b = request("b", [25, 26, 27, PAD] + DOC2 + [P, 60, 62])
    for req in (a, x, b):
        sched.add(req)
    step(sched)  # a and x prefill, b's span beside them
    step(sched)  # b's span is cached: b is seen complete
    c = request("c", [28, 29, 30, PAD] + DOC + [P, 60, 63])
    sched.add(c)
    third = step(sched)
    assert [(s.seq.request_id, s.query_ranges) for s in third.scheduled] == [
        ("a", [(8, 9)]),
        ("x", [(8, 9)]),
        ("c/span1", [(0, 8)]),
    ]
    run(sched)
    assert c.cached_block_ids == {1, 2} and c.num_output_tokens == 2


def test_a_span_prefill_takes_no_span_past_the_tokens_it_may_compute_this_step():
    """A span prefill whose first span fills the room exactly (here the cap of 8 tokens) holds that span alone: the
    next span waits for a later unit instead of holding blocks it cannot compute yet."""
    sched = scheduler(max_num_seqs=1, policy="isps", span_ahead_tokens=8)
    a = request("a", [20, 21, 22, PAD, P, 60, 61], max_tokens=6)  # no spans: it takes the only seat
    b = request("b", [25, 26, 27, PAD] + DOC + DOC2 + [P, 60, 62])
    sched.add(a)
    sched.add(b)
    first = step(sched)
    assert [(s.seq.request_id, s.query_ranges) for s in first.scheduled] == [("a", [(0, 7)]), ("b/span1", [(0, 8)])]
    assert b.started_spans == {1}
    second = step(sched)
    assert [(s.seq.request_id, s.query_ranges) for s in second.scheduled] == [("a", [(7, 8)]), ("b/span2", [(0, 8)])]
    run(sched)
    assert b.cached_block_ids == {1, 2, 3, 4} and b.num_output_tokens == 2


def test_a_block_lost_by_eviction_or_a_dropped_pending_one_counts():
    kv = KVCacheManager(3)
    r = request("r", [S, 30, 31, 32, 33, 34, 35, 36, 37])  # two full blocks, then the last token's
    assert kv.allocate_prompt(r) and kv.num_losses == 0
    kv.free(r)  # r computed nothing: its pending blocks are dropped
    assert kv.num_losses == 2
    r2 = request("r2", [S, 30, 31, 32, 33, 34, 35, 36, 37])
    assert kv.allocate_prompt(r2)
    kv.publish(r2, 8)
    kv.free(r2)
    assert kv.num_losses == 2 and kv.allocate_prompt(request("x", [S, 40, 41, 42, 43, 44, 45, 46, 47]))
    assert kv.num_losses == 4  # x's blocks evicted r2's two cached ones
    kv.check_integrity()


@pytest.mark.parametrize("policy", ["isps", "barrier"])
def test_spans_computed_ahead_outlive_blocks_of_requests_that_finished_since_on_a_tight_cache(policy):
    """Five prompts sharing a document, two seats, 18 blocks: spans computed ahead for the waiting prompts were
    computed before the running requests finished; admissions take fresh blocks from the old end of the LRU queue,
    so without keeping those spans young they were evicted and computed again (isps: 107 tokens against 95)."""
    doc = [S, 26, 56, 48, 33, PAD, PAD, PAD]  # in three prompts, twice in one
    prompts = [
        [44, 43, 36, PAD, S, 19, 36, 35, 14, 36, 28, 19, 22, 19, 29, PAD, P, 57, 17, 29],
        [51, 27, 19, 52, *doc, *doc, P, 22, 27, 44],
        [50, 35, PAD, PAD, *doc, P, 36, 41, 59],
        [26, 52, 46, 14, S, 54, 52, 58, 56, 42, 23, PAD, S, 19, 25, 25, *doc, P, 13, 15, 38],
        [18, 17, 54, 33, S, 19, 40, 50, 15, 54, 31, 50, S, 16, 20, 14, P, 58, 35, 34],
    ]
    max_tokens = [2, 5, 3, 4, 2]
    room = dict(num_blocks=18, budget=64, max_num_seqs=2)
    inline = computed_tokens(prompts, max_tokens, "inline", **room)
    assert computed_tokens(prompts, max_tokens, policy, **room) == inline == 95


def computed_tokens(prompts, max_tokens, span_policy, **kwargs) -> int:
    """Every position computed (prefills, span prefills, decodes) while a scheduler of `kwargs` runs the prompts
    to their max_tokens."""
    sched = scheduler(policy=span_policy, **kwargs)
    requests = [request(str(i), p, n) for i, (p, n) in enumerate(zip(prompts, max_tokens, strict=True))]
    for r in requests:
        sched.add(r)
    computed = []
    run(sched, computed)
    assert all(r.num_output_tokens == n for r, n in zip(requests, max_tokens, strict=True))
    return len(computed)


# fmt: off
TIGHT_BATCHES = {
    # four seats, 18 blocks, a budget of 24: the three prompts' spans are computed ahead, then their finals are
    # admitted while the spans of those behind the head wait in the LRU queue
    "spans_of_every_waiting_prompt_kept_young": ([
        [41, 10, 26, 18, 42, PAD, PAD, PAD, S, 20, 37, 29, 52, PAD, PAD, PAD, S, 55, 49, 19, 52, 27, 36, 38, 51, 48,
         PAD, PAD, S, 20, 37, 29, 52, PAD, PAD, PAD, P, 34, 18, 29],
        [53, 16, PAD, PAD, S, 48, 26, 39, 26, 43, 50, 13, 14, 24, 49, 41, 49, PAD, PAD, PAD, S, 15, 22, 26, 53, 52,
         39, 53, 53, 26, 52, 19, P, 31, 23, 23],
        [57, 56, 33, 48, S, 55, 49, 19, 52, 27, 36, 38, 51, 48, PAD, PAD, S, 25, 42, 45, 43, 31, 12, 31, P, 50, 31, 59],
    ], [7, 4, 4], dict(num_blocks=18, budget=24, max_num_seqs=4)),
    # two seats, 19 blocks: one span prefill holds several spans, whose fresh blocks together would take the old end
    # of the LRU queue where the hits of the prompts ahead sit
    "a_units_spans_guarded_together": ([
        [43, 26, PAD, PAD, S, 36, 20, 48, 19, 54, 17, 46, S, 57, 16, 17, 59, PAD, PAD, PAD, S, 36, 20, 48, 19, 54, 17,
         46, S, 59, 43, 15, 30, 46, 29, 18, 20, 42, 16, 32, 45, PAD, PAD, PAD, P, 13, 48, 48],
        [42, PAD, PAD, PAD, S, 51, 58, 15, 14, 26, 39, 55, 56, 54, 28, PAD, S, 57, 16, 17, 59, PAD, PAD, PAD, P, 23,
         36, 22],
        [42, 41, 54, PAD, S, 51, 58, 15, 14, 26, 39, 55, 56, 54, 28, PAD, S, 42, 56, 20, 37, 35, 26, 40, 18, 25, PAD,
         PAD, S, 50, 50, 25, 35, 24, 37, 58, 46, PAD, PAD, PAD, S, 59, 43, 15, 30, 46, 29, 18, 20, 42, 16, 32, 45,
         PAD, PAD, PAD, P, 15, 59, 38],
    ], [8, 9, 9], dict(num_blocks=19, budget=64, max_num_seqs=2)),
}
# fmt: on


@pytest.mark.parametrize("case", TIGHT_BATCHES)
def test_barrier_on_a_tight_cache_computes_no_more_than_inline(case):
    """Prompts sharing documents on a cache that holds little more than them: barrier computes every span ahead
    once, and keeping those spans young (every waiting prompt's, not only the head's) and guarding a span prefill's
    fresh blocks all together (not span by span) leaves nothing to compute again: exactly inline's token count."""
    prompts, max_tokens, kwargs = TIGHT_BATCHES[case]
    assert computed_tokens(prompts, max_tokens, "barrier", **kwargs) == computed_tokens(
        prompts, max_tokens, "inline", **kwargs
    )


@pytest.mark.parametrize("policy", ["isps", "barrier"])
def test_a_span_prefill_never_evicts_a_block_its_own_prompt_would_hit(policy):
    """One seat, 6 blocks, none left unused: a leaves its lead and DOC cached at the old end of the LRU queue behind
    its final block (a request's blocks are freed tail first), c's blocks younger. b hits a's lead and DOC and
    misses DOC2. An inline admission takes its hits out of the free queue before its fresh blocks; b's span prefill
    of DOC2 took the two oldest free blocks, a's final one and one of DOC's, which b then computed again (40 tokens
    computed in all against 36)."""
    prompts = {
        "a": [20, 21, 22, PAD] + DOC + [P, 60, 61],  # blocks 0 (lead), 1-2 (DOC), 3 (final)
        "c": [50, 51, 52, 53, 54, 55, 56],  # blocks 4-5
        "b": [20, 21, 22, PAD] + DOC2 + DOC + [P, 60, 62],
    }

    def computed_by(span_policy):
        sched = scheduler(num_blocks=6, budget=64, max_num_seqs=1, policy=span_policy)
        requests = [request(name, tokens) for name, tokens in prompts.items()]
        for r in requests:
            sched.add(r)
        computed = []
        run(sched, computed)
        assert all(r.num_output_tokens == 2 for r in requests)
        return computed

    computed, inline = computed_by(policy), computed_by("inline")
    # b computes its final block and decodes (20-23), DOC2 (4-11 in b) once, and DOC never again: under barrier in
    # its span prefill; isps admits b whole once it has the seat (its lookahead had no room for b's prompt), as inline
    of_b = [(r, p) for r, p in computed if r.split("/")[0] == "b"]
    inline_b = [("b", p) for p in [*range(4, 12), *range(20, 24)]]
    assert [(r, p) for r, p in inline if r == "b"] == inline_b
    assert of_b == ([("b/span1", p) for p in range(8)] + [("b", p) for p in range(20, 24)] if policy == "barrier"
                    else inline_b)  # fmt: skip
    assert len(computed) == len(inline) == 36


def test_a_running_request_that_needs_a_block_preempts_a_span_prefill_first_and_keeps_its_finished_blocks():
    """isps, one seat, 9 blocks, span prefills capped at one token a step: b's 4-block span is computed ahead while a
    decodes, until a needs a block when none is free. The victim is the span prefill, not a: it is dropped
    ("preempted"), the span blocks it completed stay cached, and b's final computes only what is still missing."""
    long_doc = [S, *range(70, 85)]  # an SSEP span of four blocks
    sched = scheduler(num_blocks=9, budget=8, max_num_seqs=1, policy="isps", span_ahead_tokens=1)
    a = request("a", [20, 21, 22, PAD, P, 60, 61], max_tokens=16)
    b = request("b", [25, 26, 27, PAD, *long_doc, P, 60, 62])
    sched.add(a)
    sched.add(b)
    outs, computed = [], []
    while not outs or not outs[-1].preempted:
        assert len(outs) < 20, "the span prefill was never preempted"
        outs.append(step(sched, computed))
    (unit,) = outs[-1].preempted
    assert unit.request_id == "b/span1" and unit.finish_reason == "preempted" and not sched.span_running
    assert [(s.seq.request_id, s.query_ranges) for s in outs[-1].scheduled] == [("a", [(20, 21)])]
    assert positions_of(computed, "b/span1") == list(range(14))  # 3 of its 4 blocks complete when dropped
    run(sched, computed)
    assert a.num_output_tokens == 16 and b.num_output_tokens == 2
    assert positions_of(computed, "b") == [*range(4), *range(16, 24)]  # its lead, the span's last block, the final


def test_span_prefills_nobody_is_left_to_use_are_dropped():
    """b's span is computed ahead while a decodes; b is aborted, then a finishes: with nobody running or waiting,
    the span prefill stops (aborted) instead of computing blocks no request asked for, and every block is free."""
    sched = scheduler(num_blocks=16, budget=8, max_num_seqs=1, policy="isps", span_ahead_tokens=1)
    a = request("a", [20, 21, 22, PAD, P, 60, 61], max_tokens=3)
    b = request("b", [25, 26, 27, PAD, S, *range(70, 85), P, 60, 62])
    sched.add(a)
    sched.add(b)
    step(sched)
    (unit,) = sched.span_running
    sched.finish(b, "abort")
    assert sched.span_running == [unit]  # a still runs: the span prefill goes on
    computed = []
    run(sched, computed)
    assert unit.finish_reason == "abort" and not sched.span_running and not sched.has_unfinished
    assert positions_of(computed, "b/span1") == [1, 2] and a.num_output_tokens == 3  # after the first step's 0
    assert sched.kv.num_free_blocks == 16
