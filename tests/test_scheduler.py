"""Scheduler + block pool on the CPU with exact block ids (no model)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minipic_lite.checkpoints.store import chunk_end
from minipic_lite.chunks import plan_chunk
from minipic_lite.config import SchedulerConfig
from minipic_lite.hashing import root_hash
from minipic_lite.kv_cache_manager import KVCacheManager
from minipic_lite.request import Request
from minipic_lite.sampling_params import SamplingParams
from minipic_lite.scheduler import Scheduler

B = 4
ROOT = root_hash("test")


def make_seq(seq_id, token_ids):
    return Request(seq_id, list(token_ids), SamplingParams(max_tokens=8), B, ROOT)


def make_scheduler(num_blocks=16, max_num_seqs=8, budget=64):
    sched = Scheduler(SchedulerConfig(max_num_seqs, budget, 1024), KVCacheManager(num_blocks))
    return sched, sched.kv.pool


def run_step(sched, token=7):
    out = sched.schedule()
    sched.postprocess(out, [[token] if s.do_sample else [] for s in out.scheduled], lambda seq: False)
    sched.kv.check_integrity()
    return out


def test_plan_chunk_skips_cached_blocks_and_respects_the_budget():
    seq = make_seq(0, range(14))
    seq.cached_block_ids = {0, 2}
    assert plan_chunk(seq, 100) == ([(4, 8), (12, 14)], 14)
    assert plan_chunk(seq, 3) == ([(4, 7)], 7)
    seq.num_computed_tokens = 7
    assert plan_chunk(seq, 2) == ([(7, 8), (12, 13)], 13)


def plain_plan_chunk(seq, budget):
    """`plan_chunk` as first written: one block at a time (the scheduler's version jumps over cached blocks)."""
    block_size, total = seq.block_size, chunk_end(seq.num_computed_tokens, seq.checkpoint_positions, len(seq))
    ranges, pos, num_tokens = [], seq.num_computed_tokens, 0
    while pos < total and num_tokens < budget:
        block = pos // block_size
        if block in seq.cached_block_ids:
            if block in seq.waiting_blocks:
                break
            pos = (block + 1) * block_size
            continue
        end = min(total, (block + 1) * block_size, pos + budget - num_tokens)
        if ranges and ranges[-1][1] == pos:
            ranges[-1] = (ranges[-1][0], end)
        else:
            ranges.append((pos, end))
        num_tokens += end - pos
        pos = end
    return ranges, pos


@settings(max_examples=500, deadline=None)
@given(
    st.integers(1, 40),
    st.sets(st.integers(0, 10)),
    st.sets(st.integers(0, 10)),
    st.integers(0, 40),
    st.integers(1, 50),
    st.one_of(st.none(), st.lists(st.integers(1, 40), max_size=3).map(sorted)),
)
def test_plan_chunk_equals_the_plain_block_by_block_plan(n, cached, waiting, computed, budget, checkpoints):
    seq = make_seq(0, range(n))
    full = n // B  # the partial last block is never cached; waiting blocks are cached ones (KVCacheManager)
    seq.cached_block_ids = {b for b in cached if b < full}
    seq.waiting_blocks = {b for b in waiting if b in seq.cached_block_ids}
    seq.num_computed_tokens = min(computed, n - 1)
    seq.checkpoint_positions = checkpoints
    assert plan_chunk(seq, budget) == plain_plan_chunk(seq, budget)


def test_prefill_is_chunked_under_the_token_budget():
    sched, pool = make_scheduler(budget=6)
    sched.add(make_seq(0, range(10)))
    out = run_step(sched)
    assert [(s.query_ranges, s.kv_len, s.do_sample) for s in out.scheduled] == [([(0, 6)], 6, False)]
    out = run_step(sched)
    assert [(s.query_ranges, s.kv_len, s.do_sample) for s in out.scheduled] == [([(6, 10)], 10, True)]
    seq = sched.running[0]
    assert seq.block_table == [0, 1, 2] and seq.token_ids[-1] == 7
    out = run_step(sched)  # decode: one token at position 10
    assert out.scheduled[0].query_ranges == [(10, 11)]


def test_mixed_step_decodes_running_and_prefills_new_requests():
    sched, pool = make_scheduler(budget=8)
    sched.add(make_seq(0, range(5)))
    run_step(sched)
    sched.add(make_seq(1, range(100, 120)))
    out = run_step(sched)
    assert [(s.seq.request_id, s.query_ranges) for s in out.scheduled] == [(0, [(5, 6)]), (1, [(0, 7)])]
    assert out.num_batched_tokens == 8


def test_second_request_hits_every_full_block_but_the_last_token():
    sched, pool = make_scheduler()
    first = make_seq(0, range(12))
    sched.add(first)
    run_step(sched)
    sched.finish(first, "stop")
    assert list(pool.free_queue)[-3:] == [2, 1, 0]  # freed tail first
    second = make_seq(1, range(12))
    sched.add(second)
    out = run_step(sched)
    # blocks 0 and 1 hit; block 2 holds the last prompt token and is computed
    assert second.cached_block_ids == {0, 1} and second.num_cached_tokens == 8
    assert second.block_table[:2] == [0, 1]
    assert out.scheduled[0].query_ranges == [(8, 12)]


def test_a_cached_block_after_a_missing_one_is_reused():
    sched, pool = make_scheduler(num_blocks=8)
    first = make_seq(0, range(12))
    sched.add(first)
    run_step(sched)
    sched.finish(first, "stop")
    # evict only block 0's copy: drop its hash as if its block were reused
    pool.hash_to_block.pop(first.block_hashes[0])
    pool.blocks[0].block_hash = None
    second = make_seq(1, range(12))
    sched.add(second)
    out = run_step(sched)
    assert second.cached_block_ids == {1}
    assert out.scheduled[0].query_ranges == [(0, 4), (8, 12)]
    assert out.scheduled[0].kv_len == 12


def test_two_requests_admitted_in_one_step_share_published_blocks():
    sched, pool = make_scheduler()
    a, b = make_seq(0, range(9)), make_seq(1, range(9))
    sched.add(a)
    sched.add(b)
    run_step(sched)
    # a's two full blocks are published when scheduled, so b hits them in the same step
    assert b.block_table[:2] == a.block_table[:2]
    assert pool.blocks[a.block_table[0]].ref_cnt == 2


def test_preemption_frees_the_newest_request_and_recomputes_it_later():
    sched, pool = make_scheduler(num_blocks=4, budget=64)
    a, b = make_seq(0, range(8)), make_seq(1, range(50, 57))
    sched.add(a)
    sched.add(b)
    run_step(sched)  # a: blocks 0,1 (+ token 8 sampled); b: blocks 2,3
    assert a.block_table == [0, 1] and b.block_table == [2, 3]
    out = run_step(sched)  # a needs a third block for position 8: b is preempted
    assert out.preempted == [b] and b.num_computed_tokens == 0 and b.block_table == []
    assert list(sched.waiting) == [b] and len(b.token_ids) == 8  # its sampled token is kept
    assert a.block_table == [0, 1, 3]
    sched.finish(a, "stop")
    run_step(sched)
    assert b.num_computed_tokens == 8 and b.num_preemptions == 1


@pytest.mark.parametrize("max_num_seqs", [1, 2])
def test_max_num_seqs_caps_the_running_batch(max_num_seqs):
    sched, _ = make_scheduler(max_num_seqs=max_num_seqs)
    for i in range(3):
        sched.add(make_seq(i, range(i * 10, i * 10 + 3)))
    run_step(sched)
    assert len(sched.running) == max_num_seqs and len(sched.waiting) == 3 - max_num_seqs


def test_waiting_request_that_does_not_fit_waits():
    sched, pool = make_scheduler(num_blocks=3)
    sched.add(make_seq(0, range(8)))
    sched.add(make_seq(1, range(20, 28)))
    run_step(sched)
    assert len(sched.running) == 1 and len(sched.waiting) == 1


# -- bursts (multi-step decode) ---------------------------------------------------------------------------


def make_burst_scheduler(num_blocks=16, steps=4, max_model_len=1024):
    sched = Scheduler(SchedulerConfig(8, 64, max_model_len, num_scheduler_steps=steps), KVCacheManager(num_blocks))
    return sched, sched.kv.pool


def run_burst(sched, tokens=(7, 8, 9, 10, 11, 12, 13, 14), stops=lambda seq: False):
    out = sched.schedule()
    sampled = [list(tokens[: out.num_steps]) if s.do_sample else [] for s in out.scheduled]
    sched.postprocess(out, sampled, stops)
    sched.kv.check_integrity()
    return out


def test_a_burst_takes_the_blocks_of_every_step_up_front_and_advances_by_its_tokens():
    sched, pool = make_burst_scheduler()
    a = make_seq(0, range(6))  # B = 4: blocks 0, 1
    a.sampling_params = SamplingParams(max_tokens=16)
    sched.add(a)
    assert run_burst(sched).num_steps == 1  # a prefill step is never a burst
    assert len(a) == 7 and a.num_computed_tokens == 6 and a.block_table == [0, 1]
    out = run_burst(sched)  # 4 steps: KV of positions 6..9, so blocks for 10 tokens
    assert out.num_steps == 4 and out.num_batched_tokens == 4
    assert a.block_table == [0, 1, 2]
    assert a.output_token_ids == [7, 7, 8, 9, 10] and a.num_computed_tokens == 10 and len(a) == 11
    assert a.num_published_blocks == 2  # tokens 8..10 fill block 2 only up to slot 2


def test_a_burst_publishes_the_blocks_it_completed():
    sched, pool = make_burst_scheduler()
    a = make_seq(0, range(7))
    a.sampling_params = SamplingParams(max_tokens=16)
    sched.add(a)
    run_burst(sched)  # prefill: tokens 0..6 + 7
    run_burst(sched)  # burst: KV of positions 7..10, block 2 = tokens [8, 12) full
    assert a.num_computed_tokens == 11 and a.num_published_blocks == 2
    assert pool.lookup(a.block_hashes[1]) == a.block_table[1]
    run_burst(sched)
    assert a.num_published_blocks == 3 and pool.lookup(a.block_hashes[2]) == a.block_table[2]


def test_a_stop_inside_a_burst_drops_the_rest_and_frees_the_blocks():
    sched, pool = make_burst_scheduler()
    a = make_seq(0, range(6))
    a.sampling_params = SamplingParams(max_tokens=16)
    sched.add(a)
    run_burst(sched)

    def stop_at_nine(seq):
        if seq.token_ids[-1] == 9:
            sched.finish(seq, "stop")
            return True
        return False

    run_burst(sched, stops=stop_at_nine)
    assert a.output_token_ids == [7, 7, 8, 9] and a.is_finished
    assert pool.num_free_blocks == 16


@pytest.mark.parametrize(
    ("max_tokens", "max_model_len", "expected"),
    [(3, 1024, 2), (16, 9, 2), (16, 8, 1), (2, 1024, 1)],
    ids=["max_tokens", "context", "context_full", "one_token_left"],
)
def test_a_burst_never_passes_max_tokens_or_the_context(max_tokens, max_model_len, expected):
    sched, _ = make_burst_scheduler(max_model_len=max_model_len)
    a = make_seq(0, range(6))
    a.sampling_params = SamplingParams(max_tokens=max_tokens)
    sched.add(a)
    run_burst(sched)  # 1 output token, len 7
    assert sched.schedule().num_steps == expected
    assert a.block_table == [0, 1]  # the KV it writes (positions 6 .. 6 + expected - 1 <= 7) and no block more


@pytest.mark.parametrize("steps", [1, 2, 3])
def test_a_burst_is_num_scheduler_steps_long_where_nothing_caps_it(steps):
    """A decode step of a lone request with tokens, context and blocks to spare runs exactly num_scheduler_steps
    steps (1: every step is an ordinary one)."""
    sched, _ = make_burst_scheduler(steps=steps)
    a = make_seq(0, range(6))
    a.sampling_params = SamplingParams(max_tokens=16)
    sched.add(a)
    run_burst(sched)  # the prefill step
    assert sched.schedule().num_steps == steps


def test_no_burst_while_a_request_waits_or_blocks_are_short():
    sched, pool = make_burst_scheduler(num_blocks=4)
    a, b = make_seq(0, range(6)), make_seq(1, range(20, 26))
    for seq in (a, b):
        seq.sampling_params = SamplingParams(max_tokens=16)
    sched.add(a)
    run_burst(sched)
    sched.add(b)
    assert run_burst(sched).num_steps == 1  # b waited: it is admitted in this ordinary step
    assert len(a.block_table) == 2 and len(b.block_table) == 2 and pool.num_free_blocks == 0
    out = run_burst(sched)  # a needs block 3 for position 8 at step 2: none free, so no burst (no preemption)
    assert out.num_steps == 1 and not out.preempted


# -- continuations (async scheduling) --------------------------------------------------------------------


def two_decoding(max_tokens=16, num_blocks=16):
    """a (6 prompt tokens) and b (7) prefilled, each with its first token: a on blocks [0, 1], b on [2, 3]."""
    sched, pool = make_burst_scheduler(num_blocks=num_blocks)
    a, b = make_seq(0, range(6)), make_seq(1, range(10, 17))
    for seq in (a, b):
        seq.sampling_params = SamplingParams(max_tokens=max_tokens)
        sched.add(seq)
    run_burst(sched)
    assert (a.block_table, b.block_table, len(a), len(b)) == ([0, 1], [2, 3], 7, 8)
    return sched, pool, a, b


def test_a_continuation_is_planned_before_the_last_bursts_tokens_are_in():
    sched, pool, a, b = two_decoding()
    last = sched.schedule()  # 4 steps: KV of a's positions 6..9 (blocks for 10 tokens), b's 7..10
    assert last.num_steps == 4 and (a.block_table, b.block_table) == ([0, 1, 4], [2, 3, 5])
    nxt = sched.plan_continuation(last)  # a will hold 11 tokens, b 12: KV of a's 10..13, b's 11..14
    assert nxt.num_steps == 4 and nxt.is_decode_only
    assert [(s.seq, s.query_ranges, s.kv_len) for s in nxt.scheduled] == [(a, [(10, 11)], 11), (b, [(11, 12)], 12)]
    assert (a.block_table, b.block_table) == ([0, 1, 4, 6], [2, 3, 5, 7])
    sched.postprocess(last, [[7, 8, 9, 10]] * 2, lambda seq: False)
    sched.postprocess(nxt, [[11, 12, 13, 14]] * 2, lambda seq: False)
    sched.kv.check_integrity()
    assert a.output_token_ids == [7, 7, 8, 9, 10, 11, 12, 13, 14] and (len(a), a.num_computed_tokens) == (15, 14)
    assert (len(b), b.num_computed_tokens) == (16, 15)
    assert a.num_published_blocks == 3 and pool.lookup(a.block_hashes[2]) == a.block_table[2]


def test_a_continuation_stops_at_max_tokens_counting_the_last_bursts_tokens():
    sched, _, a, b = two_decoding(max_tokens=7)
    last = sched.schedule()  # outputs 1 -> 5
    assert last.num_steps == 4
    assert sched.plan_continuation(last).num_steps == 2  # 2 left of 7
    sched, _, a, b = two_decoding(max_tokens=6)
    assert sched.plan_continuation(sched.schedule()).num_steps == 1  # a continuation of one step: 1 left of 6
    sched, _, a, b = two_decoding(max_tokens=5)
    assert sched.plan_continuation(sched.schedule()) is None  # the burst ends them both


def test_no_continuation_after_a_finish_an_arrival_or_with_blocks_short():
    sched, pool, a, b = two_decoding()
    last = sched.schedule()
    sched.finish(b, "abort")  # an abort between the launch and the plan
    assert sched.plan_continuation(last) is None
    sched, pool, a, b = two_decoding()
    last = sched.schedule()
    sched.add(make_seq(2, range(30, 35)))  # it waits: the next step admits it
    assert sched.plan_continuation(last) is None
    sched, pool, a, b = two_decoding(num_blocks=7)  # the burst takes blocks 4 and 5; 6 is the last free one
    last = sched.schedule()
    assert sched.plan_continuation(last) is None and pool.num_free_blocks == 1
    sched.kv.check_integrity()


def test_no_continuation_after_a_step_that_prefills():
    """A continuation only continues a decode step: with nothing waiting and every running request scheduled, a step
    of a prompt's first chunk (budget 64 of 70 tokens: nothing sampled) or of its last chunk (its first token sampled)
    gets none, and takes no block for one."""
    sched, pool = make_burst_scheduler(num_blocks=32)
    a = make_seq(0, range(70))
    a.sampling_params = SamplingParams(max_tokens=16)
    sched.add(a)
    for query_range, do_sample in [((0, 64), False), ((64, 70), True)]:
        last = sched.schedule()
        assert [(s.query_ranges, s.do_sample) for s in last.scheduled] == [([query_range], do_sample)]
        assert not sched.waiting and sched.running == [a] and not last.preempted
        free = pool.num_free_blocks
        assert sched.plan_continuation(last) is None and pool.num_free_blocks == free
        sched.postprocess(last, [[7] if do_sample else []], lambda seq: False)
    assert sched.plan_continuation(sched.schedule()) is not None  # its first decode step is continued
    sched.kv.check_integrity()
