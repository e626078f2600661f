"""The KV-cache manager at the edges its other tests leave out: admission counts with pending blocks, who inherits a
pending block, match() after a reset, a hybrid resuming across host-tier hits; integrity after every call."""

from minipic_lite.checkpoints.planner import CheckpointPlanner
from minipic_lite.config import ControlTokens, SchedulerConfig
from minipic_lite.hashing import root_hash
from minipic_lite.kv_cache_manager import HIT, MISS, PENDING, KVCacheManager
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
