"""Preemption on the CPU with exact queues: who goes back to the waiting queue, where, and what the step that
preempted does next (no model). Block size 4; every request's tokens differ, so no request hits another's blocks.

The rules (scheduler.py, README step 5): when blocks run out, the newest running request is preempted, its
blocks are freed and it goes back to the HEAD of the waiting queue, before requests that never ran, so waiting
order stays arrival order; the step that preempted admits nobody, and does not even look waiting requests up.
"""

from tests.sched_factory import finish, make_request, make_scheduler, pool_of, run_step

B = 4


def request(request_id: int, num_tokens: int):
    return make_request(request_id, range(100 * request_id, 100 * request_id + num_tokens), B)


def scheduled_ids(out) -> list[int]:
    return [s.seq.request_id for s in out.scheduled]


def waiting_ids(sched) -> list[int]:
    return [seq.request_id for seq in sched.waiting]


def test_a_preempted_request_waits_ahead_of_requests_that_never_ran_and_is_admitted_first():
    sched = make_scheduler(num_blocks=5, block_size=B, max_num_seqs=2, max_num_batched_tokens=64)
    a, b, w1, w2 = request(0, 8), request(1, 7), request(2, 3), request(3, 3)
    for seq in (a, b, w1, w2):
        sched.add(seq)
    assert scheduled_ids(run_step(sched)) == [0, 1]  # a: 2 blocks, b: 2 blocks; w1, w2 wait (max_num_seqs)
    run_step(sched)  # a's token at position 8 takes the last free block
    assert pool_of(sched).num_free_blocks == 0

    lookups = pool_of(sched).num_lookups
    out = run_step(sched)  # b's token at position 8 needs a block: b, the newest, is preempted
    assert out.preempted == [b] and scheduled_ids(out) == [0]
    assert waiting_ids(sched) == [1, 2, 3]  # at the head, then the requests that never ran, in arrival order
    assert b.block_table == [] and b.num_computed_tokens == 0 and len(b) == 9  # its sampled tokens are kept
    # the same step admits nobody, and does not look anyone up (a failed try would count toward the hit rate).
    # NOTE: with the queue in this order, no admission could succeed here anyway: the requests that took
    # blocks in this step took them from the victims, so the oldest victim (the head) is short of exactly those.
    assert pool_of(sched).num_lookups == lookups
    assert pool_of(sched).num_free_blocks == 2

    out = run_step(sched)  # b needs 3 blocks, 2 are free: it waits, and w1 (which would fit) waits behind it
    assert scheduled_ids(out) == [0] and waiting_ids(sched) == [1, 2, 3]
    finish(sched, a)
    out = run_step(sched)
    assert scheduled_ids(out) == [1, 2] and waiting_ids(sched) == [3]  # b first, then w1 (max_num_seqs = 2)
    assert sorted(b.cached_block_ids) == [0, 1]  # b's own blocks, published before it was preempted


def test_requests_preempted_in_one_step_go_back_in_arrival_order():
    sched = make_scheduler(num_blocks=4, block_size=B, max_num_seqs=8, max_num_batched_tokens=64)
    r1, r2, v1, v2, w = request(0, 4), request(1, 4), request(2, 3), request(3, 3), request(4, 2)
    for seq in (r1, r2, v1, v2, w):
        sched.add(seq)
    assert scheduled_ids(run_step(sched)) == [0, 1, 2, 3]  # one block each; w waits for a block
    out = run_step(sched)  # r1 and r2 cross into their second block: v2 goes first, then v1
    assert out.preempted == [v2, v1] and scheduled_ids(out) == [0, 1]
    assert waiting_ids(sched) == [2, 3, 4]
    finish(sched, r1)  # frees 2 blocks
    out = run_step(sched)
    assert scheduled_ids(out) == [1, 2, 3] and waiting_ids(sched) == [4]
