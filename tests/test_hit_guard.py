"""HitGuard on its own, with exact free-queue orders: which span prefills it lets take fresh blocks, which hits it
moves to the young end of the LRU queue (and in what order), and what it leaves alone."""

from collections import deque

import pytest

from minipic_lite.hashing import root_hash
from minipic_lite.hit_guard import HitGuard
from minipic_lite.kv_cache_manager import KVCacheManager
from minipic_lite.request import Request
from minipic_lite.sampling_params import SamplingParams

B = 4
ROOT = root_hash("test-hit-guard")


def waiting_prompts():
    """Three waiting prompts of two hittable blocks each, every block cached and free. The free queue (old -> young):
    0: w2's, 1: w0's, 2: nobody's, 3: w1's, 4: w0's, 5: w1's, 6: w2's, 7: nobody's."""
    kv = KVCacheManager(8)
    w0, w1, w2 = (Request(name, list(range(start, start + 9)), SamplingParams(), B, ROOT)
                  for name, start in (("w0", 100), ("w1", 200), ("w2", 300)))  # fmt: skip
    block_ids = [kv.pool.allocate() for _ in range(8)]
    for block_id, (req, i) in {0: (w2, 0), 1: (w0, 0), 3: (w1, 0), 4: (w0, 1), 5: (w1, 1), 6: (w2, 1)}.items():
        kv.pool.cache(block_id, req.block_hashes[i])
    kv.pool.free(block_ids)
    assert [kv.hit_block_ids(w) for w in (w0, w1, w2)] == [[1, 4], [3, 5], [0, 6]]
    return kv, deque([w0, w1, w2]), (w0, w1, w2)


def test_a_span_prefill_that_evicts_no_hit_ahead_of_it_leaves_the_queue_as_it_is():
    kv, waiting, (_, w1, _) = waiting_prompts()
    guard = HitGuard(kv, waiting)
    assert guard.lets(w1, 1)  # takes block 0: w2's, a prompt behind w1
    assert list(kv.pool.free_queue) == [0, 1, 2, 3, 4, 5, 6, 7] and not guard.has_refused
    kv.check_integrity()


def test_hits_ahead_move_to_the_young_end_the_heads_youngest_and_the_prefill_then_goes():
    kv, waiting, (_, w1, _) = waiting_prompts()
    guard = HitGuard(kv, waiting)
    assert guard.lets(w1, 2)  # would take block 1, w0's hit: the hits of w0 and w1 move, the head's last
    assert list(kv.pool.free_queue) == [0, 2, 6, 7, 5, 3, 4, 1] and not guard.has_refused
    kv.check_integrity()


def test_a_prefill_that_would_still_evict_a_hit_is_refused_and_the_refusal_sticks():
    kv, waiting, (_, w1, _) = waiting_prompts()
    guard = HitGuard(kv, waiting)
    assert not guard.lets(w1, 7)  # 7 of 8 blocks: some hit of w0 or w1 goes whatever the order
    assert guard.has_refused  # the scheduler starts no later span prefill in this step
    kv.check_integrity()


def test_asked_again_for_the_same_prompt_it_protects_no_prompt_behind_it():
    kv, waiting, (_, w1, _) = waiting_prompts()
    guard = HitGuard(kv, waiting)
    assert guard.lets(w1, 2)
    queue = list(kv.pool.free_queue)
    assert guard.lets(w1, 3)  # takes 0, 2, 6: w2's blocks and nobody's, none of w0's or w1's hits
    assert list(kv.pool.free_queue) == queue
    kv.check_integrity()


def test_the_waiting_queue_is_walked_as_it_was_when_first_asked():
    kv, waiting, (w0, w1, _) = waiting_prompts()
    guard = HitGuard(kv, waiting)
    assert guard.lets(w0, 2)  # walks w0 only
    waiting.popleft()  # w0 admitted: it leaves the queue
    try:
        assert guard.lets(w1, 2)
    except RuntimeError as err:  # pragma: no cover - the failure the snapshot avoids
        pytest.fail(f"the guard walked the live queue: {err}")
    kv.check_integrity()


def test_a_prompt_put_ahead_after_the_first_question_is_not_protected_in_that_step():
    """The walk goes on through the queue as it was when first asked: w2, put back at the head since (as a preempted
    request is), is behind w1 in that snapshot, so its hits are not moved and w1's span prefill may evict them."""
    kv, waiting, (w0, w1, w2) = waiting_prompts()
    guard = HitGuard(kv, waiting)
    assert guard.lets(w0, 2)  # would take block 1, w0's hit: w0's hits move
    assert list(kv.pool.free_queue) == [0, 2, 3, 5, 6, 7, 4, 1]
    waiting.remove(w2)
    waiting.appendleft(w2)
    assert guard.lets(w1, 3)  # would take block 3, w1's hit: w1's hits move, w2's stay and go (blocks 0, 6)
    assert list(kv.pool.free_queue) == [0, 2, 6, 7, 5, 3, 4, 1] and not guard.has_refused
    kv.check_integrity()
