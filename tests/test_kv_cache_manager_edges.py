"""The KV-cache manager at the edges its other tests leave out: admission counts with pending blocks, who inherits a
pending block, match() after a reset, a hybrid resuming across host-tier hits, the host tier's copies and LRU around
admissions and resets; integrity after every call."""

import pytest

from minipic_lite.checkpoints.planner import CheckpointPlanner
from minipic_lite.config import ControlTokens, SchedulerConfig
from minipic_lite.hashing import root_hash
from minipic_lite.host_tier import BlockCopy
from minipic_lite.kv_cache_manager import HIT, HOST, MISS, PENDING, REROTATE, KVCacheManager
from minipic_lite.request import Request
from minipic_lite.sampling_params import SamplingParams
from minipic_lite.scheduler import Scheduler
from minipic_lite.spans import span_layout
from minipic_lite.state_cache import StateCache
from tests.sched_factory import make_request

B = 4
S, P, PAD = 1, 2, 3
CONTROL = ControlTokens(ssep_id=S, pdep_id=P, pad_id=PAD)
ROOT = root_hash("test-kv-cache-manager-edges")
DOC = [S, 30, 31, 32, 33, 34, 35, 36]  # an SSEP span of two blocks


def req(request_id, token_ids):
    token_ids = list(token_ids)
    return Request(request_id, token_ids, SamplingParams(), B, ROOT, span_layout(token_ids, CONTROL, B))


def taken_by_admission(kv, request):
    """(blocks num_blocks_to_admit predicts, blocks allocate_prompt then takes out of the free queue)."""
    predicted, before = kv.num_blocks_to_admit(request), kv.num_free_blocks
    assert kv.allocate_prompt(request)
    kv.check_integrity()
    return predicted, before - kv.num_free_blocks


def test_blocks_to_admit_leave_out_blocks_another_request_is_computing():
    kv = KVCacheManager(16)
    a = req("a", [20, 21, 22, PAD, *DOC, P, 60])
    assert kv.allocate_prompt(a)  # a computes DOC: pending, not published yet
    b = req("b", [25, 26, 27, PAD, *DOC, P, 61])
    assert kv.match(b) == [MISS, PENDING, PENDING]
    assert taken_by_admission(kv, b) == (2, 2)  # its lead and its last block; DOC is shared


def test_blocks_to_admit_count_a_free_cached_block_hit_twice_once():
    """It counted a free hit once per listing (3 here) where the admission takes it once: a lookahead too cautious."""
    kv = KVCacheManager(16)
    a = req("a", [*DOC, P, 60])
    assert kv.allocate_prompt(a)
    kv.publish(a, len(a.token_ids))
    kv.free(a)  # DOC cached and free
    b = req("b", [*DOC, *DOC, P, 61])
    assert kv.match(b) == [HIT, HIT, HIT, HIT]  # the same two blocks, twice
    assert taken_by_admission(kv, b) == (3, 3)  # DOC's two blocks (once each) and the last block


def test_a_pending_block_passes_to_the_first_request_waiting_for_it():
    kv = KVCacheManager(16)
    a, b, c = (req(name, [20 + i, 21, 22, PAD, *DOC, P, 60 + i]) for i, name in enumerate("abc"))
    for r in (a, b, c):
        assert kv.allocate_prompt(r)
    doc_hash = a.block_hashes[1]
    assert kv.pending[doc_hash][1] is a and [w for w, _ in kv.waiters[doc_hash]] == [b, c]
    kv.free(a)  # a goes before computing DOC: b, the first to wait, computes it
    assert kv.pending[doc_hash][1] is b and [w for w, _ in kv.waiters[doc_hash]] == [c]
    assert b.waiting_blocks == set() and c.waiting_blocks == {1, 2}
    kv.check_integrity()


def test_match_after_a_reset_finds_nothing_it_found_before():
    kv = KVCacheManager(8)
    a = req("a", range(10, 20))
    assert kv.allocate_prompt(a)
    kv.publish(a, 10)
    kv.free(a)
    b = req("b", list(range(10, 18)) + [99])
    assert kv.match(b) == [HIT, HIT]  # remembered in the memo
    kv.reset_prefix_cache()  # after a failed step: the contents are unknown
    assert kv.match(b) == [MISS, MISS] and kv.hit_block_ids(b) == []
    assert kv.allocate_prompt(b) and b.cached_block_ids == set()
    kv.check_integrity()


def test_a_hybrid_resumes_past_blocks_that_come_back_from_the_host_tier():
    states = StateCache(4, 8, 100, CheckpointPlanner("balanced", 3, B, "balanced"), "lru")
    kv = KVCacheManager(20, num_host_blocks=32, states=states)
    sched = Scheduler(SchedulerConfig(4, 256, 1024), kv)

    def run_to_end(request):
        sched.add(request)
        while sched.has_unfinished:
            out = sched.schedule()
            sched.postprocess(out, [[7] if s.do_sample else [] for s in out.scheduled], lambda r: bool(
                sched.finish(r, "length") or True))  # fmt: skip
            kv.check_integrity()

    first = make_request("a", range(64), B, max_tokens=1)
    run_to_end(first)
    assert first.saved_checkpoints == [16, 32, 48]
    run_to_end(make_request("b", range(1000, 1064), B, max_tokens=1))  # evicts most of a's blocks to the host
    second = make_request("c", list(range(40)) + list(range(100, 124)), B, max_tokens=1)  # shares 10 blocks
    assert kv.match(second)[:10] == [HIT] * 4 + ["host"] * 6
    sched.add(second)
    out = sched.schedule()
    assert second.num_resumed_tokens == 32 and kv.num_host_hits == 4  # through blocks 4-7, loaded from the host
    assert out.scheduled[-1].query_ranges == [(32, 48)]
    kv.check_integrity()


def test_a_hybrid_admission_is_counted_as_it_computes_hits_past_its_resume_point_again():
    """num_blocks_to_admit left out that a hybrid recomputes the hits past its deepest saved state: a prompt that
    shares 10 blocks with a running request (checkpoints after 16, 32 and 48 tokens) resumes at 32 and takes 2 more
    fresh blocks than its 10 hits suggest; predicted 6 where it took 8."""
    states = StateCache(4, 8, 100, CheckpointPlanner("balanced", 3, B, "balanced"), "lru")
    kv = KVCacheManager(40, states=states)
    sched = Scheduler(SchedulerConfig(4, 256, 1024), kv)
    first = make_request("a", range(64), B, max_tokens=50)
    sched.add(first)
    while first.num_output_tokens < 2:  # its prefill (chunks cut at the checkpoints), then a decode step
        out = sched.schedule()
        sched.postprocess(out, [[7] if s.do_sample else [] for s in out.scheduled], lambda r: False)
    assert first.saved_checkpoints == [16, 32, 48] and first in sched.running  # its blocks stay in use
    second = make_request("c", list(range(40)) + list(range(100, 124)), B, max_tokens=1)
    assert kv.match(second)[:11] == [HIT] * 10 + [MISS]
    assert taken_by_admission(kv, second) == (8, 8)
    assert second.num_resumed_tokens == 32


def run_and_free(kv, request):
    """Admit `request`, compute (publish) its whole prompt and free it: its full blocks stay cached (tail first)."""
    assert kv.allocate_prompt(request)
    kv.publish(request, len(request.token_ids))
    kv.free(request)
    kv.check_integrity()


def test_a_block_evicted_again_while_the_host_tier_still_holds_it_is_not_copied_again():
    """3 blocks, 4 host slots: a's two blocks go to the host (two copies), come back to the device for a2 (two loads)
    and are evicted again by c. The host still holds them, so c's evictions copy nothing: no copy without a slot."""
    kv = KVCacheManager(3, num_host_blocks=4)
    run_and_free(kv, req("a", range(10, 19)))  # blocks 0, 1 cached; 2 holds the partial tail
    run_and_free(kv, req("b", range(50, 59)))  # evicts a's blocks 1, then 0, to slots 0, 1
    assert kv.take_copies() == [BlockCopy(True, 1, 0), BlockCopy(True, 0, 1)]
    a2 = req("a2", range(10, 19))
    assert kv.match(a2) == [HOST, HOST]
    run_and_free(kv, a2)  # loads them into blocks 0, 1; evicts b's block 1 (slot 2), then block 2 (slot 3)
    assert kv.take_copies() == [BlockCopy(False, 0, 1), BlockCopy(True, 1, 2), BlockCopy(False, 1, 0)] + [
        BlockCopy(True, 2, 3)
    ]
    assert kv.allocate_prompt(req("c", range(70, 79)))  # evicts a's blocks 1 and 0 again: the host has them
    assert kv.take_copies() == [] and kv.host.num_stored == 4
    assert kv.match(req("a3", range(10, 19))) == [HOST, HOST]
    kv.check_integrity()


def test_host_slots_an_admission_loaded_from_are_evictable_once_it_is_done():
    """While x's admission loads a0 from the host, a0's slot is pinned (its own evictions take another); after it the
    slot is an ordinary least recently used one: the next eviction takes it, not the younger b0's."""
    kv = KVCacheManager(3, num_host_blocks=2)
    a, b = req("a", range(10, 19)), req("b", range(50, 59))
    run_and_free(kv, a)
    run_and_free(kv, b)  # the host holds a1, a0 (oldest first)
    x = req("x", [10, 11, 12, 13, 90, 91, 92, 93, 94])  # a's first block, then a block of its own
    assert kv.match(x) == [HOST, MISS]
    run_and_free(kv, x)  # loads a0; its evictions of b1 and b0 pass over the pinned a0: the host holds a0, b0
    assert a.block_hashes[0] in kv.host and b.block_hashes[0] in kv.host and not kv.host.pinned
    assert kv.allocate_prompt(req("y", range(200, 206)))  # evicts x's own block: the oldest slot goes, a0's
    assert x.block_hashes[1] in kv.host and b.block_hashes[0] in kv.host and a.block_hashes[0] not in kv.host
    kv.check_integrity()


def test_a_reset_forgets_the_host_tier_and_the_copies_queued_by_the_failed_step():
    """After a failed step no hash may name anything, on the device or in the host tier, and the copies it queued
    are not run; the reset counts as a loss (the scheduler's note of prompts with nothing missing goes stale)."""
    kv = KVCacheManager(3, num_host_blocks=4)
    a = req("a", range(10, 19))
    run_and_free(kv, a)
    run_and_free(kv, req("b", range(50, 59)))  # a's blocks go to the host: two copies queued
    num_losses = kv.num_losses
    kv.reset_prefix_cache()
    assert kv.take_copies() == [] and kv.num_losses > num_losses
    assert a.block_hashes[0] not in kv.host and kv.match(req("a2", range(10, 19))) == [MISS, MISS]
    kv.check_integrity()


def test_a_request_holding_more_blocks_than_a_range_needs_misses_none():
    """num_missing_blocks is never negative: the scheduler sums it over a burst's requests, where one request's
    spare blocks must not offset another's need."""
    kv = KVCacheManager(8)
    a = req("a", range(10, 19))
    assert kv.allocate_prompt(a) and len(a.block_table) == 3  # the whole prompt's blocks, taken up front
    assert [kv.num_missing_blocks(a, n) for n in (0, 4, 12, 13, 17)] == [0, 0, 0, 1, 2]
    kv.check_integrity()


def test_copy_rerotate_goes_by_where_a_reused_block_was_computed_last():
    """Copy-rerotate keeps rotated keys, so a hit is plain only at the offset its block was computed at. Block 2 held
    DOC's second block at token 8, then (evicted, taken again) span E's second block at token 4: E is a plain hit at
    offsets 0 and 4, and must be copied and turned at offsets 4 and 8."""
    kv = KVCacheManager(4, rerotate=True)
    run_and_free(kv, req("a", [20, 21, 22, PAD, *DOC, P, 60]))  # lead, DOC at 4 and 8 in blocks 0, 1, 2
    span_e = [S, 40, 41, 42, 43, 44, 45, 46]
    b = req("b", [*span_e, P, 61])
    run_and_free(kv, b)  # E at 0 and 4: takes block 3, then blocks 2 and 1 (DOC evicted)
    assert kv.pool.peek(b.block_hashes[1]) == 2  # E's second block in block 2, DOC's second block before
    assert kv.match(req("c", [*span_e, P, 62])) == [HIT, HIT]
    assert kv.match(req("d", [20, 21, 22, PAD, *span_e, P, 63])) == [HIT, REROTATE, REROTATE]
    kv.check_integrity()


def test_a_second_match_with_nothing_changed_is_answered_from_the_memo_without_asking_the_pool():
    """The memo exists to spare the pool's map a waiting prompt's thousand lookups every step: while no hash was
    logged as changed, match() answers from the entry it made, and the pool is asked again only after a change."""
    kv = KVCacheManager(8)
    asked = []
    peek_many = kv.pool.peek_many
    kv.pool.peek_many = lambda hashes: asked.append(len(hashes)) or peek_many(hashes)
    a = req("a", range(10, 19))
    assert kv.match(a) == [MISS, MISS] and asked == [2]
    assert kv.match(a) == [MISS, MISS] and kv.hit_block_ids(a) == [] and asked == [2]  # from the memo
    run_and_free(kv, req("b", range(10, 19)))  # publishes a's two hashes: logged as changed
    asked.clear()
    assert kv.match(a) == [HIT, HIT] and asked == [2]  # the memo's entry no longer holds: the pool is asked
    kv.check_integrity()


def two_requests_sharing_doc(kv):
    """a computes DOC's two blocks (pending); b admitted after it waits for them."""
    a, b = req("a", [20, 21, 22, PAD, *DOC, P, 60]), req("b", [25, 26, 27, PAD, *DOC, P, 61])
    assert kv.allocate_prompt(a) and kv.allocate_prompt(b)
    assert b.waiting_blocks == {1, 2}
    kv.check_integrity()
    return a, b


def test_integrity_check_catches_a_pending_block_its_owner_does_not_hold():
    kv = KVCacheManager(16)
    a, _ = two_requests_sharing_doc(kv)
    a.block_table = a.block_table[3:]  # still holds a block, but none of those it computes for others
    with pytest.raises(AssertionError, match="a pending block's owner does not hold it"):
        kv.check_integrity()


def test_integrity_check_catches_a_pending_block_that_is_free():
    kv = KVCacheManager(16)
    a, _ = two_requests_sharing_doc(kv)
    kv.pool.free([a.block_table[0]])  # a's lead block (pending on a, nobody waits) loses its only reference
    kv.pool.check_integrity()  # the pool's own books still add up
    with pytest.raises(AssertionError, match="a pending block is free"):
        kv.check_integrity()


def test_integrity_check_catches_requests_waiting_for_a_block_nobody_computes():
    kv = KVCacheManager(16)
    a, _ = two_requests_sharing_doc(kv)
    del kv.pending[a.block_hashes[1]]  # b still waits for it
    with pytest.raises(AssertionError, match="requests wait for a block nobody computes"):
        kv.check_integrity()


def test_integrity_check_catches_a_waiter_that_does_not_know_it_waits():
    kv = KVCacheManager(16)
    _, b = two_requests_sharing_doc(kv)
    b.waiting_blocks.discard(1)  # listed as a waiter of DOC's first block, but would read it before it is computed
    with pytest.raises(AssertionError):
        kv.check_integrity()
