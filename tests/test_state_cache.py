"""State slots, the checkpoint store and its planner, without a model: the pure rules with exact expectations,
then the books through the real scheduler and KV-cache manager (exact chunk ends, resumes and copy ops)."""

import numpy as np
import pytest

from minipic_lite.checkpoints.planner import CheckpointPlanner
from minipic_lite.checkpoints.store import (
    Checkpoint,
    admits,
    choose_victim,
    chunk_end,
    is_stale,
    marginal_saving,
    recent_depths,
    resume_blocks,
)
from minipic_lite.config import SchedulerConfig
from minipic_lite.kv_cache_manager import KVCacheManager
from minipic_lite.scheduler import Scheduler
from minipic_lite.state_cache import StateCache
from tests.sched_factory import make_request

B = 4


@pytest.mark.parametrize(
    ("num_computed", "positions", "expected"),
    [
        (0, None, 64),  # attention-only models plan nothing
        (0, [16, 32, 48], 16),
        (16, [16, 32, 48], 32),  # a position already reached is passed
        (40, [16, 32, 48], 48),
        (48, [16, 32, 48], 64),
        (0, [64], 64),  # the whole prompt: the last chunk ends there anyway
        (63, [16], 64),  # decode
    ],
)
def test_chunk_end(num_computed, positions, expected):
    assert chunk_end(num_computed, positions, 64) == expected


def test_resume_blocks_takes_the_deepest_checkpoint_inside_the_hits():
    saved = {3, 7}  # checkpoints after blocks 3 and 7: positions 4·B and 8·B
    assert resume_blocks(10, saved.__contains__) == 8
    assert resume_blocks(7, saved.__contains__) == 4  # block 7 is not a hit
    assert resume_blocks(3, saved.__contains__) == 0
    assert resume_blocks(0, saved.__contains__) == 0


def _ckpt(ckpt_id, position, last_used, ref_cnt=0, reserved_at=0):
    return Checkpoint(ckpt_id, bytes([ckpt_id]), position, reserved_at, last_used, ref_cnt)


def test_lru_evicts_the_least_recently_used_free_written_checkpoint():
    ckpts = [_ckpt(0, 64, last_used=1, ref_cnt=1), _ckpt(1, 16, last_used=2), _ckpt(2, 32, last_used=3),
             _ckpt(3, 48, last_used=0, reserved_at=5)]  # fmt: skip
    # 0 is pinned (a load is pending), 3 is not written yet (reserved in step 5, now step 5)
    assert choose_victim(ckpts, num_steps=5, eviction="lru").ckpt_id == 1
    assert choose_victim(ckpts, num_steps=6, eviction="lru").ckpt_id == 3


def test_flops_eviction_weighs_recency_against_depth():
    # recency scaled to [0, 1] over last_used 10..20, depth over the deepest (256): scores 0+0.25, 0.5+0.125, 1+1
    ckpts = [_ckpt(0, 64, last_used=10), _ckpt(1, 32, last_used=15), _ckpt(2, 256, last_used=20)]
    assert choose_victim(ckpts, num_steps=1, eviction="flops").ckpt_id == 0
    ckpts[0].position = 200  # now 0 scores 0.78 and 1 scores 0.625
    assert choose_victim(ckpts, num_steps=1, eviction="flops").ckpt_id == 1
    assert choose_victim(ckpts, num_steps=1, eviction="lru").ckpt_id == 0


def test_nothing_is_evicted_while_every_checkpoint_is_in_use():
    ckpts = [_ckpt(0, 16, last_used=1, ref_cnt=1), _ckpt(1, 32, last_used=2, ref_cnt=2)]
    assert choose_victim(ckpts, num_steps=9, eviction="lru") is None
    assert choose_victim(ckpts, num_steps=9, eviction="flops") is None


def test_marginal_saving_counts_the_depths_a_checkpoint_moves_and_how_far():
    w = np.zeros(101)
    w[[10, 50, 60, 100]] = [1.0, 2.0, 0.5, 1.0]
    assert marginal_saving(48, [], w) == (2.0 + 0.5 + 1.0) * 48  # depths 50, 60, 100 resume at 48, not 0
    assert marginal_saving(48, [16], w) == (2.0 + 0.5 + 1.0) * 32  # ... instead of at 16
    assert marginal_saving(48, [16, 60], w) == 2.0 * 32  # depths 60 and 100 resume at 60 anyway
    assert marginal_saving(48, [16, 50, 64], w) == 0.0  # only depths 48..49 move: no weight there
    assert marginal_saving(100, [48], w) == 1.0 * 52


def test_recent_depths_weigh_each_recent_prompt_by_its_age():
    prompt = np.arange(10)
    recent = [np.arange(10), np.array([0, 1, 2, 9, 9]), np.array([5, 5])]  # newest last
    w = recent_depths(prompt, recent, gamma=0.5)
    # the newest shares nothing (age 0), the middle one 3 tokens (age 1), the oldest all but its last (age 2)
    assert w.tolist() == [1.0, 0, 0, 0.5, 0, 0, 0, 0, 0, 0.25, 0]


def test_admission_saves_only_what_is_worth_more_than_its_victim():
    assert admits(3.0, None)  # a free checkpoint: always
    assert admits(3.0, 2.0) and not admits(2.0, 2.0) and not admits(1.0, 2.0)


def test_a_checkpoint_is_stale_once_a_save_leaves_it_worth_nothing_and_its_plan_dropped_it():
    w = np.zeros(33)
    w[[20, 31]] = 1.0  # recent prompts leave this prompt at 20 and 31
    assert is_stale(8, 16, [8], planned=[16], depth_weights=w)  # beside 16, nobody resumes from 8
    assert not is_stale(8, 16, [8], planned=[8, 16], depth_weights=w)  # a plan's hedge stays
    assert not is_stale(16, 12, [16], planned=[12], depth_weights=w)  # 20 and 31 still resume from 16, not 12
    assert not is_stale(8, 4, [8, 24], planned=[4], depth_weights=w)  # 20 resumes from 8 (24 is past it)


def _serve(sched, req):
    sched.add(req)
    while req.num_output_tokens == 0:
        _step(sched)
    sched.finish(req, "length")
    _step(sched)  # NOTE: the step after the last save writes it


def test_a_full_store_declines_a_tail_checkpoint_worth_less_than_its_victim():
    # one checkpoint: a at 16, where b and c left it; d shares nothing and would save at 16 of its own
    states = StateCache(4, 1, 100, CheckpointPlanner("balanced", 1, B, "balanced"))
    sched = Scheduler(SchedulerConfig(4, 256, 1024), KVCacheManager(64, states=states))
    for name, tokens in [("a", range(32)), ("b", list(range(18)) + [99] * 14), ("c", list(range(17)) + [98] * 15)]:
        _serve(sched, make_request(name, tokens, B, max_tokens=1))
    (kept,) = states.by_hash.values()
    assert kept.position == 16 and states.stats.num_saved == 1
    _serve(sched, make_request("d", [5] * 32, B, max_tokens=1))
    # d's 16 is worth 16 (its own request, age 0); a's 16 is worth 16·(γ + γ² + γ³): a, b and c reach it
    assert states.stats.num_declined_saves == 1 and list(states.by_hash.values()) == [kept]
    for i, name in enumerate("ef"):  # d's prefix becomes popular
        _serve(sched, make_request(name, [5] * 30 + [6 + i] * 2, B, max_tokens=1))
    # e's 16: 16·(1 + γ) = 30.4 (e, d) < a's 16·(γ² + γ³ + γ⁴) = 35.1: declined; f's 16: 16·(1 + γ + γ²)
    # = 43.4 (f, e, d) > a's 16·(γ³ + γ⁴ + γ⁵) = 31.6: a's is evicted
    assert states.stats.num_declined_saves == 2 and states.stats.num_evicted == 1
    assert next(iter(states.by_hash.values())) is not kept


def test_a_save_moves_a_stale_checkpoint_of_its_prefix_even_while_rows_are_free():
    # balanced, M = 1: a (32 tokens) saves at 16; b shares 28 tokens and plans 24, where a and b now leave
    states = StateCache(4, 2, 100, CheckpointPlanner("balanced", 1, B, "balanced"))
    sched = Scheduler(SchedulerConfig(4, 256, 1024), KVCacheManager(64, states=states))
    a, b = (
        make_request("a", range(32), B, max_tokens=1),
        make_request("b", list(range(28)) + [99] * 20, B, max_tokens=1),
    )
    _serve(sched, a)
    (old,) = states.by_hash.values()
    _serve(sched, b)
    assert b.num_resumed_tokens == 16 and b.saved_checkpoints == [24]
    # nobody resumes from 16 beside 24, and b's plan dropped it: 24 takes its row, the free row stays free
    (new,) = states.by_hash.values()
    assert (new.position, new.ckpt_id) == (24, old.ckpt_id) and list(states.free_ckpt_ids) == [1]
    assert states.stats.num_moved == 1 and states.stats.num_evicted == 0
    c = make_request("c", list(range(28)) + [98] * 20, B, max_tokens=1)
    _serve(sched, c)
    assert c.num_resumed_tokens == 24  # the moved checkpoint serves the next request of the prefix


def test_a_save_moves_the_stale_checkpoint_its_own_request_loads_in_the_same_step():
    # one checkpoint: b loads a's 16 and saves 24 in one step; the load runs before the save, so 24 takes 16's row
    states = StateCache(4, 1, 100, CheckpointPlanner("balanced", 1, B, "balanced"))
    sched = Scheduler(SchedulerConfig(4, 256, 1024), KVCacheManager(64, states=states))
    _serve(sched, make_request("a", range(32), B, max_tokens=1))
    (old,) = states.by_hash.values()
    b = make_request("b", list(range(28)) + [99] * 20, B, max_tokens=1)
    sched.add(b)
    out = _step(sched)
    assert out.state_ops.load == [(old.ckpt_id, b.state_slot)] and out.state_ops.save == [(b.state_slot, old.ckpt_id)]
    assert [c.position for c in states.by_hash.values()] == [24] and states.stats.num_skipped_saves == 0


def test_a_plan_keeps_its_own_hedges_in_a_full_store():
    states = StateCache(4, 3, 100, CheckpointPlanner("balanced", 3, B, "balanced"))
    sched = Scheduler(SchedulerConfig(4, 256, 1024), KVCacheManager(64, states=states))
    _serve(sched, make_request("a", range(32), B, max_tokens=1))
    # nobody but a itself reaches 8..24 yet, but all three are a's plan: none moves the one before it
    assert sorted(c.position for c in states.by_hash.values()) == [8, 16, 24] and states.stats.num_moved == 0


def test_dp_plans_with_its_prior_until_traffic_says_something_about_the_prompt():
    planner = CheckpointPlanner("dp", budget=2, bin_size=B, prior="balanced")
    first = list(range(100, 164))
    assert planner.plan(first) == [20, 40]  # balanced: ⌊i·65/3⌋ = 21, 43, on the grid of 4
    planner.observe(first)
    second = first[:40] + list(range(24))
    planner.observe(second)  # it leaves the first at depth 40
    assert 40 in planner.plan(first[:40] + list(range(500, 524)))  # dp puts a checkpoint where requests leave


def test_dp_moves_its_prior_plan_up_to_the_prompts_branch_points():
    start = 1  # the turn-start token
    prompt = [start] + list(range(100, 137)) + [start] + list(range(200, 220)) + [start] + [300, 301, 302, 303]
    assert len(prompt) == 64 and [i for i, t in enumerate(prompt) if t == start] == [0, 38, 59]
    turns = CheckpointPlanner("dp", budget=2, bin_size=B, prior="balanced", turn_start_id=start)
    plain = CheckpointPlanner("dp", budget=2, bin_size=B, prior="balanced")
    assert plain.plan(prompt) == [20, 40]  # balanced
    assert turns.plan(prompt) == [36, 40]  # the user turn starts at 38: 20 moves up to 36 on the grid of 4


# -- the books through the scheduler and the KV-cache manager ----------------------------------------------


def _scheduler(num_checkpoints=8, policy="balanced", budget=3, num_blocks=64, max_num_seqs=4, eviction="lru"):
    states = StateCache(max_num_seqs, num_checkpoints, 100, CheckpointPlanner(policy, budget, B, "balanced"), eviction)
    kv = KVCacheManager(num_blocks, states=states)
    return Scheduler(SchedulerConfig(max_num_seqs, 256, 1024), kv), states


def _step(sched, token_id=7):
    out = sched.schedule()
    sched.postprocess(out, [[token_id] if s.do_sample else [] for s in out.scheduled], lambda req: False)
    running = [r.state_slot for r in sched.running]
    sched.kv.check_integrity()
    sched.kv.states.check_integrity(running)
    return out


def test_chunks_end_at_planned_positions_and_save_there():
    sched, states = _scheduler()
    req = make_request("a", range(64), B)
    sched.add(req)
    outs = [_step(sched) for _ in range(4)]
    assert req.checkpoint_positions == [16, 32, 48]
    assert [o.scheduled[0].query_ranges for o in outs] == [[(0, 16)], [(16, 32)], [(32, 48)], [(48, 64)]]
    assert [(o.state_ops.zero, o.state_ops.load, o.state_ops.save) for o in outs] == [
        ([0], [], [(0, 0)]),
        ([], [], [(0, 1)]),
        ([], [], [(0, 2)]),
        ([], [], []),
    ]
    assert req.saved_checkpoints == [16, 32, 48] and states.stats.num_saved == 3


def test_a_new_request_resumes_from_the_deepest_checkpoint_inside_its_hits():
    sched, states = _scheduler()
    first = make_request("a", range(64), B)
    sched.add(first)
    for _ in range(5):
        _step(sched)
    second = make_request("b", list(range(40)) + list(range(100, 124)), B)  # shares 40 tokens = 10 blocks
    sched.add(second)
    out = _step(sched)
    assert second.num_resumed_tokens == 32 and second.num_cached_tokens == 32
    assert second.cached_block_ids == set(range(8))  # the KV hits past the resume point are recomputed
    assert out.scheduled[-1].query_ranges == [(32, 48)]  # it resumes at 32 and stops at its own 48
    assert out.state_ops.load == [(1, second.state_slot)] and out.state_ops.save == [(second.state_slot, 3)]


def test_a_checkpoint_is_found_only_after_the_step_that_writes_it():
    sched, states = _scheduler(budget=1)
    sched.add(make_request("a", range(32), B))  # balanced, M = 1: position 16
    sched.add(make_request("b", range(32), B))  # admitted in the same step: no checkpoint written yet
    out = _step(sched)
    assert [r.num_resumed_tokens for r in sched.running] == [0, 0]
    assert out.state_ops.save == [(0, 0)]  # b's save at 16 finds a's reservation: one copy
    sched.add(make_request("c", range(32), B))
    _step(sched)
    assert sched.running[-1].num_resumed_tokens == 16


def test_the_store_never_exceeds_its_budget_and_pinned_states_survive():
    sched, states = _scheduler(num_checkpoints=2, budget=3)
    for i in range(6):
        sched.add(make_request(f"r{i}", [i] * 5 + list(range(59)), B, max_tokens=2))
        for _ in range(3):
            _step(sched)
            assert len(states.by_hash) <= 2 and states.num_used_bytes <= states.budget_bytes
    assert states.stats.num_evicted > 0
    # a request that will load a checkpoint pins it: saves in the same step cannot take its place
    states2 = StateCache(4, 1, 100, CheckpointPlanner("balanced", 1, B, "balanced"))
    sched2 = Scheduler(SchedulerConfig(4, 256, 1024), KVCacheManager(64, states=states2))
    sched2.add(make_request("a", range(32), B, max_tokens=1))
    _step(sched2), _step(sched2), _step(sched2)
    (kept,) = states2.by_hash.values()
    sched2.add(make_request("b", list(range(16)) + [99] * 16, B, max_tokens=1))  # resumes at 16 from `kept`
    sched2.add(make_request("c", [5] * 32, B, max_tokens=1))  # wants to save at 16: the one slot is pinned
    out = _step(sched2)
    assert out.state_ops.load == [(kept.ckpt_id, 1)] and out.state_ops.save == []
    assert states2.stats.num_skipped_saves == 1 and list(states2.by_hash.values()) == [kept]


def test_slots_are_freed_on_finish_and_preemption():
    sched, states = _scheduler(num_blocks=20, budget=0)
    reqs = [make_request(f"r{i}", range(i, i + 30), B, max_tokens=30) for i in range(3)]
    for req in reqs:
        sched.add(req)
    num_preempted = 0
    while sched.has_unfinished:
        out = _step(sched)
        num_preempted += len(out.preempted)
        for req in out.preempted:
            assert req.state_slot is None
        for s in list(sched.running):
            if s.num_output_tokens >= 30:
                sched.finish(s, "length")
    assert num_preempted > 0 and len(states.free_slots) == 4
