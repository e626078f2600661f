"""Scheduler paths no other test reaches, with exact chunks: barrier's head admitted inline once a span computed ahead
for it was evicted (and only the head), the order spans computed ahead keep in the LRU queue while the seats are full,
and span prefills of spans that are partly cached, partly being computed or partly in the host tier."""

from minipic_lite.kv_cache_manager import HIT, HOST, MISS
from tests.test_scheduler_edges import run, step
from tests.test_span_scheduling import DOC, DOC2, PAD, P, S, request, scheduler

DOC_B = [S, 30, 31, 32, 43, 44, 45, 46]  # DOC's first block (an SSEP block hashes from the root), another second one


def test_the_head_of_the_queue_whose_span_computed_ahead_was_evicted_computes_it_in_its_own_prefill():
    """barrier, 6 blocks: w's span is computed ahead, then a's prompt takes the whole budget and w waits for blocks
    while a decodes; a's last block evicts DOC's first one. w, the head, is then admitted as it is and computes that
    block in its own prefill. Waiting until all of its spans are cached at once would compute the span ahead again."""
    sched = scheduler(num_blocks=6, budget=8, max_num_seqs=2, policy="barrier")
    a = request("a", range(10, 18), max_tokens=10)
    w = request("w", [25, 26, 27, PAD, *DOC, P, 60, 61])  # blocks: lead, DOC (2), final
    sched.add(a)
    sched.add(w)
    assert step(sched) == [("w/span1", [(0, 8)])]  # a waits too: the batch's spans first
    assert step(sched) == [("a", [(0, 8)])]  # the whole budget: w waits
    for position in range(8, 16):  # w needs 4 blocks, never that many free while a runs
        assert step(sched) == [("a", [(position, position + 1)])]
    assert sched.kv.match(w) == [MISS, HIT, HIT]
    assert step(sched) == [("a", [(16, 17)])]  # a's fifth block: DOC's first block goes; a finishes
    assert w.started_spans == {1} and sched.kv.match(w) == [MISS, MISS, HIT]
    assert step(sched) == [("w", [(0, 8)])]  # inline: its lead and DOC's first block, DOC's second a hit
    assert step(sched) == [("w", [(12, 15)])]
    assert step(sched) == [("w", [(15, 16)])]
    assert not sched.has_unfinished and sched.kv.num_free_blocks == 6


def test_a_request_behind_the_head_whose_span_computed_ahead_was_evicted_waits_for_the_barrier():
    """barrier, three seats, 9 blocks: r2 and then r1 are preempted while r0 decodes, so r1 heads the queue before r2.
    r1's span is still cached; r2's, computed ahead before its first admission, was evicted. When r0 finishes, r2's
    span is computed ahead again (the barrier holds r1 back for it), and both are admitted together: only the head of
    the queue is admitted with a span computed ahead missing again, r2 does not overtake r1."""
    sched = scheduler(num_blocks=9, budget=16, max_num_seqs=3, policy="barrier")
    r0 = request("r0", [20, 21, 22, PAD, P, 60, 61], max_tokens=9)
    r1 = request("r1", [25, 26, 27, PAD, *DOC2, P, 61, 61], max_tokens=7)
    r2 = request("r2", [25, 26, 27, PAD, S, 50, 51, 52, P, 62, 61], max_tokens=3)
    for r in (r0, r1, r2):
        sched.add(r)
    assert step(sched) == [("r1/span1", [(0, 8)]), ("r2/span1", [(0, 4)])]
    assert step(sched) == [("r0", [(0, 7)]), ("r1", [(0, 4), (12, 15)]), ("r2", [(8, 10)])]
    assert step(sched) == [("r0", [(7, 8)]), ("r1", [(15, 16)]), ("r2", [(10, 11)])]
    for _ in range(7):
        step(sched)
    assert not sched.running and list(sched.waiting) == [r1, r2]  # both preempted, r2 first
    assert r1.started_spans == {1} and sched.kv.match(r1) == [HIT, HIT, HIT, HIT, HIT]
    assert r2.started_spans == {1} and sched.kv.match(r2) == [HIT, MISS]
    assert step(sched) == [("r2/span1", [(0, 4)])]
    assert step(sched) == [("r1", [(20, 21)]), ("r2", [(8, 12)])]
    assert step(sched) == [("r2", [(12, 13)])]
    assert not sched.has_unfinished
    assert [r.num_output_tokens for r in (r0, r1, r2)] == [9, 7, 3] and sched.kv.num_free_blocks == 9


def test_while_the_seats_are_full_spans_computed_ahead_keep_the_order_their_span_prefill_freed_them_in():
    """isps, one seat, 5 blocks: b's span prefill frees DOC2 tail first, so while a holds the seat, a's growth evicts
    DOC2's second block. The spans computed ahead become the youngest blocks only once a final could take a seat:
    moved before every step, in the prompt's order, DOC2's first block would go instead."""
    sched = scheduler(num_blocks=5, max_num_seqs=1, policy="isps")
    a = request("a", [25, 26, 27, PAD, P, 60, 61], max_tokens=7)
    b = request("b", [25, 26, 27, PAD, *DOC2, P, 61, 62])  # a's lead (shared), DOC2, final
    sched.add(a)
    sched.add(b)
    assert step(sched) == [("a", [(0, 7)]), ("b/span1", [(0, 8)])]
    assert list(sched.kv.pool.free_queue) == [4, 3, 2]  # DOC2 in blocks 2, 3: freed tail first
    for position in range(7, 13):
        assert step(sched) == [("a", [(position, position + 1)])]  # a takes blocks 4, then 3
    assert sched.kv.match(b) == [HIT, HIT, MISS]
    assert step(sched) == [("b", [(8, 15)])]  # DOC2's second block and the final
    assert step(sched) == [("b", [(15, 16)])]
    assert not sched.has_unfinished


def test_a_span_partly_being_computed_is_left_for_a_later_step_and_the_spans_after_it_start():
    """barrier: DOC_B's first block is DOC's, which the same span prefill computes (pending), so DOC_B waits for the
    next step, where its first block is a hit; DOC2 after it is not held back."""
    sched = scheduler(policy="barrier")
    w = request("w", [20, 21, 22, PAD, *DOC, *DOC_B, *DOC2, P, 60, 61])
    sched.add(w)
    assert step(sched) == [("w/span1,3", [(0, 16)])]
    assert w.started_spans == {1, 3}
    assert step(sched) == [("w/span2", [(4, 8)])]  # DOC_B's second block only
    assert step(sched) == [("w", [(0, 4), (28, 31)])]
    assert step(sched) == [("w", [(31, 32)])]
    assert not sched.has_unfinished


def test_a_span_partly_cached_counts_only_its_missing_blocks_against_the_budget():
    """barrier, budget 8: DOC is cached, so DOC_B misses one block (4 tokens): DOC2 joins the same span prefill."""
    sched = scheduler(budget=8, policy="barrier")
    a = request("a", [20, 21, 22, PAD, *DOC, P, 60, 61])
    sched.add(a)
    run(sched, max_steps=4)
    w = request("w", [25, 26, 27, PAD, *DOC_B, *DOC2, P, 60, 62])
    sched.add(w)
    assert sched.kv.match(w) == [MISS, HIT, MISS, MISS, MISS]
    assert step(sched) == [("w/span1,2", [(4, 12)])]
    assert step(sched) == [("w/span1,2", [(12, 16)])]
    assert step(sched) == [("w", [(0, 4), (20, 23)])]
    assert step(sched) == [("w", [(23, 24)])]
    assert not sched.has_unfinished


def test_a_span_prefill_counts_a_block_loaded_from_the_host_tier_as_a_fresh_one_for_the_hit_guard():
    """barrier, 4 blocks, a host tier: w hits its lead (block 3, second in the free queue), and of DOC_B, DOC's first
    block comes back from the host tier and the second is missing. Its span prefill takes two fresh blocks, so the
    guard moves the lead to the young end first: the lead stays on the device (counting the host block as no fresh
    block, the span prefill would have evicted it to the host tier)."""
    sched = scheduler(num_blocks=4, policy="barrier", num_host_blocks=4)
    kv = sched.kv
    x = request("x", [*DOC, 71])
    assert kv.allocate_prompt(x)  # blocks 0-2
    kv.publish(x, 8)
    kv.free(x)
    r = request("r", [20, 21, 22, PAD, 72])
    assert kv.allocate_prompt(r)  # blocks 3, 2
    kv.publish(r, 4)
    kv.free(r)
    y = request("y", [80, 81, 82, 83, 84])
    assert kv.allocate_prompt(y)  # blocks 1, 0: DOC goes to the host tier
    kv.free(y)
    kv.take_copies()
    assert list(kv.pool.free_queue) == [2, 3, 0, 1] and kv.host.num_stored == 2
    w = request("w", [20, 21, 22, PAD, *DOC_B, P, 60, 61])
    sched.add(w)
    assert kv.match(w) == [HIT, HOST, MISS]
    assert step(sched) == [("w/span1", [(4, 8)])]
    assert kv.host.num_stored == 2 and kv.match(w) == [HIT, HIT, HIT]
    assert step(sched) == [("w", [(12, 15)])]
    assert step(sched) == [("w", [(15, 16)])]
    assert not sched.has_unfinished and kv.num_free_blocks == 4
