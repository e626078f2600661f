"""Scheduler paths its other tests leave out, with exact chunks: the budget left after capped span prefills, span
prefills once nothing runs, barrier's wait for running span prefills, one-block spans, the lookahead's edge, bursts
beside waiting requests and at a block boundary, the books kept for finished requests, a span-ahead cap of zero, the
hit guard asked for a partly cached span, the budget of a request waiting for another's blocks and of a span
prefill's last token, and when the lookahead is asked and where it stops."""

from collections import deque

import pytest

from minipic_lite.config import SchedulerConfig
from minipic_lite.kv_cache_manager import KVCacheManager
from minipic_lite.scheduler import Scheduler
from tests.test_span_scheduling import DOC, DOC2, PAD, P, S, request


def scheduler(num_blocks=32, budget=256, max_num_seqs=8, policy="inline", span_ahead_tokens=None, steps=1):
    config = SchedulerConfig(max_num_seqs, budget, 1024, span_policy=policy, span_ahead_tokens=span_ahead_tokens,
                             num_scheduler_steps=steps)  # fmt: skip
    return Scheduler(config, KVCacheManager(num_blocks))


def step(sched):
    """One engine step without a model (token 7 sampled); returns (request id, query ranges) of each chunk."""
    out = sched.schedule()
    sched.postprocess(out, [[7] * out.num_steps if s.do_sample else [] for s in out.scheduled], lambda req: (
        req.num_output_tokens >= req.sampling_params.max_tokens and (sched.finish(req, "length") or True)))  # fmt: skip
    sched.kv.check_integrity()
    return [(s.seq.request_id, s.query_ranges) for s in out.scheduled]


def run(sched, max_steps=100):
    for _ in range(max_steps):
        if not sched.has_unfinished:
            return
        step(sched)
    raise AssertionError("requests did not finish")


def test_capped_span_prefills_leave_the_rest_of_the_budget_to_admissions():
    """isps, two seats, span prefills capped at one token a step: once x finishes, b takes its seat in the same step
    as its own span prefill's next token (b waits at DOC2, which the span prefill is computing)."""
    sched = scheduler(max_num_seqs=2, budget=32, policy="isps", span_ahead_tokens=1)
    a = request("a", [20, 21, 22, PAD, P, 60, 61], max_tokens=8)
    x = request("x", [23, 21, 22, PAD, P, 60, 61], max_tokens=2)
    b = request("b", [25, 26, 27, PAD, *DOC2, P, 60, 62])
    for r in (a, x, b):
        sched.add(r)
    assert step(sched) == [("a", [(0, 7)]), ("x", [(0, 7)]), ("b/span1", [(0, 1)])]
    assert step(sched) == [("a", [(7, 8)]), ("x", [(7, 8)]), ("b/span1", [(1, 2)])]  # x finishes
    assert step(sched) == [("a", [(8, 9)]), ("b/span1", [(2, 3)]), ("b", [(0, 4)])]
    run(sched)
    assert b.num_output_tokens == 2


def test_once_nothing_runs_a_span_prefill_is_no_longer_capped_nor_dropped():
    """The cap holds only in steps where other requests run; when a finishes, b still waits, so its span prefill
    is kept (not aborted) and computes the rest of its span in the next step, beside b's admission."""
    sched = scheduler(max_num_seqs=1, policy="isps", span_ahead_tokens=1)
    a = request("a", [20, 21, 22, PAD, P, 60, 61])
    b = request("b", [25, 26, 27, PAD, *DOC2, P, 60, 62])
    sched.add(a)
    sched.add(b)
    assert step(sched) == [("a", [(0, 7)]), ("b/span1", [(0, 1)])]
    assert step(sched) == [("a", [(7, 8)]), ("b/span1", [(1, 2)])]  # a finishes
    assert a.is_finished and [u.request_id for u in sched.span_running] == ["b/span1"]
    assert step(sched) == [("b/span1", [(2, 8)]), ("b", [(0, 4), (12, 15)])]
    run(sched)
    assert b.cached_block_ids == {1, 2} and b.num_output_tokens == 2


def test_barrier_admits_no_final_while_a_span_prefill_still_runs():
    """Budget 6: the span prefill of DOC takes two steps; in the second it leaves 4 tokens, but a's final waits."""
    sched = scheduler(budget=6, max_num_seqs=2, policy="barrier")
    a = request("a", [20, 21, 22, PAD, *DOC, P, 60, 61])
    sched.add(a)
    assert step(sched) == [("a/span1", [(0, 6)])]
    assert step(sched) == [("a/span1", [(6, 8)])]
    assert step(sched) == [("a", [(0, 4), (12, 14)])]
    run(sched)


def test_barrier_computes_a_one_block_span_ahead():
    sched = scheduler(policy="barrier")
    a = request("a", [20, 21, 22, PAD, S, 40, 41, 42, P, 60, 61])
    sched.add(a)
    assert step(sched) == [("a/span1", [(0, 4)])]
    assert step(sched) == [("a", [(0, 4), (8, 11)])]
    run(sched)
    assert a.cached_block_ids == {1}


def test_a_span_another_prompt_computes_ahead_counts_as_started():
    """barrier: c's DOC2 is computed by b's span prefill in the same step; c's own span prefill holds DOC alone,
    and both of c's spans are marked started (a started span missing again sends the head inline)."""
    sched = scheduler(max_num_seqs=2, policy="barrier")
    b = request("b", [25, 26, 27, PAD, *DOC2, P, 60, 62])
    c = request("c", [28, 29, 30, PAD, *DOC2, *DOC, P, 60, 63])
    sched.add(b)
    sched.add(c)
    assert step(sched) == [("b/span1", [(0, 8)]), ("c/span2", [(0, 8)])]
    assert b.started_spans == {1} and c.started_spans == {1, 2}
    run(sched)


@pytest.mark.parametrize(
    ("w2_tokens", "w2_blocks", "taken"),
    [([200, 201, 202], 1, 3), (range(200, 205), 2, 2)],
    ids=["exact-fit", "one-block-past"],
)
def test_the_lookahead_takes_prompts_while_their_fresh_blocks_fit_the_free_ones(w2_tokens, w2_blocks, taken):
    """7 free blocks: w0 takes 4 fresh, w1 2 (its first 2 are r's, held); w2 fits the last one exactly with 1 fresh
    block, and with 2 the lookahead ends at w1."""
    sched = scheduler(num_blocks=10, max_num_seqs=4, policy="isps")
    r = request("r", range(10, 19))  # 3 blocks, 2 of them full and published, all held
    assert sched.kv.allocate_prompt(r)
    sched.kv.publish(r, 9)
    w0 = request("w0", range(100, 116))  # 4 fresh blocks
    w1 = request("w1", [*range(10, 18), 90, 91, 92, 93, 94])  # 4 blocks: r's 2 (held) and 2 fresh
    w2 = request("w2", w2_tokens)
    sched.waiting = deque([w0, w1, w2])
    assert sched.kv.num_free_blocks == 7
    assert [sched.kv.num_blocks_to_admit(w) for w in (w0, w1, w2)] == [4, 2, w2_blocks]
    assert sched._lookahead() == [w0, w1, w2][:taken]


def test_no_burst_while_a_request_waits():
    sched = scheduler(max_num_seqs=1, steps=4)
    a = request("a", range(10, 16), max_tokens=16)
    b = request("b", range(20, 26))
    sched.add(a)
    sched.add(b)
    step(sched)  # a's prefill
    out = sched.schedule()  # a decodes; b waits for the seat: one step, so that b is admitted soon
    assert out.num_steps == 1 and [s.seq.request_id for s in out.scheduled] == ["a"]


def test_a_burst_whose_last_step_opens_a_block_takes_that_block():
    sched = scheduler(steps=3)
    a = request("a", range(10, 16), max_tokens=16)  # 6 tokens: blocks 0, 1
    sched.add(a)
    step(sched)  # prefill: 7 tokens, KV of 0..5
    out = sched.schedule()  # 3 steps: KV of positions 6, 7, 8; position 8 opens block 2
    assert out.num_steps == 3 and len(a.block_table) == 3
    sched.kv.check_integrity()


def test_a_finished_waiting_request_leaves_no_books_behind():
    sched = scheduler(max_num_seqs=1, policy="isps")
    a = request("a", [20, 21, 22, PAD, P, 60, 61], max_tokens=4)
    b = request("b", [25, 26, 27, PAD, *DOC2, P, 60, 62])
    sched.add(a)
    sched.add(b)
    step(sched)  # b's span computed ahead
    step(sched)  # b seen with nothing missing
    assert set(sched.complete_ahead) == {b}
    sched.finish(b, "abort")  # aborted while waiting
    assert sched.complete_ahead == {}
    run(sched)


def test_a_span_ahead_cap_of_zero_computes_no_span_ahead_while_another_request_runs():
    """isps with span_ahead_tokens=0: while a runs, b's span is not started ahead (not even one token); once a
    finishes, b takes the seat and computes its span in its own prefill."""
    sched = scheduler(max_num_seqs=1, policy="isps", span_ahead_tokens=0)
    a = request("a", [20, 21, 22, PAD, P, 60, 61], max_tokens=2)
    b = request("b", [25, 26, 27, PAD, *DOC2, P, 60, 62])
    sched.add(a)
    sched.add(b)
    assert step(sched) == [("a", [(0, 7)])]
    assert step(sched) == [("a", [(7, 8)])]  # a finishes
    assert step(sched) == [("b", [(0, 15)])]
    run(sched)
    assert b.cached_block_ids == set()


def test_a_span_prefill_asks_the_hit_guard_for_the_fresh_blocks_of_its_missing_blocks_only():
    """A span prefill asks the hit guard for one fresh block per missing block of its span, none for its cached ones:
    b's DOC has its first block cached (a computed it), so its span prefill takes one fresh block, the never-cached
    one at the old end of the free queue, and starts (asked for three, the guard would hold it back for b's hit)."""
    sched = scheduler(num_blocks=3, policy="barrier")
    a = request("a", [20, 21, 22, PAD, *DOC])  # blocks 0 (lead), 1 (DOC's first), 2 (DOC's second)
    assert sched.kv.allocate_prompt(a)
    sched.kv.publish(a, 8)  # a's lead and DOC's first block cached
    sched.kv.free(a)  # tail first: the free queue is 2 (never cached), 1, 0
    b = request("b", [*DOC, P, 60, 62])
    sched.add(b)
    assert step(sched) == [("b/span0", [(4, 8)])]
    assert step(sched) == [("b", [(8, 11)])]
    assert b.block_table == [1, 2, 0]  # DOC's cached block, the span prefill's fresh one, then the final's
    run(sched)
    assert b.cached_block_ids == {0, 1}


def test_a_request_waiting_for_blocks_another_computes_leaves_the_whole_budget_to_the_next():
    """isps, three seats, span prefills capped at one token a step: b's span DOC2 is computed ahead while a, x and y
    run. When x and y finish, b takes a seat but computes nothing (its first blocks are the span prefill's, not
    written yet) and takes none of the budget: c, admitted after it, gets all 8 tokens that a and the span left."""
    sched = scheduler(budget=10, max_num_seqs=3, policy="isps", span_ahead_tokens=1)
    a = request("a", [20, 21], max_tokens=8)
    x = request("x", [23, 24])
    y = request("y", [25, 26])
    b = request("b", [*DOC2, P, 60, 62])
    c = request("c", range(70, 79))  # 9 tokens: one more than the budget left to it
    for r in (a, x, y, b, c):
        sched.add(r)
    assert step(sched) == [("a", [(0, 2)]), ("x", [(0, 2)]), ("y", [(0, 2)]), ("b/span0", [(0, 1)])]
    assert step(sched) == [("a", [(2, 3)]), ("x", [(2, 3)]), ("y", [(2, 3)]), ("b/span0", [(1, 2)])]  # x, y finish
    assert step(sched) == [("a", [(3, 4)]), ("b/span0", [(2, 3)]), ("c", [(0, 8)])]
    assert b in sched.running and b.waiting_blocks == {0, 1}
    run(sched)
    assert b.cached_block_ids == {0, 1} and b.num_output_tokens == 2


def count_lookaheads(sched):
    """The calls of `sched._lookahead` from now on (a list that grows by one a call)."""
    calls, lookahead = [], sched._lookahead
    sched._lookahead = lambda: calls.append(1) or lookahead()
    return calls


def test_isps_asks_no_lookahead_in_a_step_that_leaves_no_budget():
    """a's prefill takes the whole budget: no span prefill could start, so the lookahead (a match of each waiting
    prompt) is not asked; the next step's budget left starts b's span prefill."""
    sched = scheduler(budget=7, max_num_seqs=1, policy="isps")
    a = request("a", [20, 21, 22, PAD, P, 60, 61], max_tokens=4)
    b = request("b", [25, 26, 27, PAD, *DOC2, P, 60, 62])
    sched.add(a)
    sched.add(b)
    calls = count_lookaheads(sched)
    assert step(sched) == [("a", [(0, 7)])] and calls == []
    assert step(sched) == [("a", [(7, 8)]), ("b/span1", [(0, 6)])] and calls == [1]


def test_barrier_asks_the_lookahead_once_in_a_step_that_admits_nobody():
    """Only an admission changes what the lookahead depends on: in a step that admits no final (b misses a span),
    the lookahead asked at the step's start is the one its span prefills start from."""
    sched = scheduler(policy="barrier")
    b = request("b", [25, 26, 27, PAD, *DOC2, P, 60, 62])
    sched.add(b)
    calls = count_lookaheads(sched)
    assert step(sched) == [("b/span1", [(0, 8)])] and calls == [1]


def test_the_last_token_of_budget_a_span_prefill_leaves_starts_the_next_prompts_span_prefill():
    """barrier, budget 9: b's span prefill computes its 8 tokens, and the one token left goes to c's span prefill."""
    sched = scheduler(budget=9, policy="barrier")
    b = request("b", [25, 26, 27, PAD, *DOC2, P, 60, 62])
    c = request("c", [28, 29, 30, PAD, *DOC, P, 60, 63])
    sched.add(b)
    sched.add(c)
    assert step(sched) == [("b/span1", [(0, 8)]), ("c/span1", [(0, 1)])]
    run(sched)
    assert b.cached_block_ids == c.cached_block_ids == {1, 2}
