"""Edges of the checkpoint store (checkpoints/store.py) that test_state_cache leaves open: what counts as a use
for LRU, which checkpoints a save may move, and the prefix a prompt's own block hashes reach past its tokens; what a
checkpoint is worth beside the others of its prefix (at admission and for a move), the shallowest resume point, the
flops score's scaling, the resume count and the integrity checks of ids and ref counts."""

import numpy as np
import pytest

from minipic_lite.checkpoints.planner import CheckpointPlanner
from minipic_lite.checkpoints.store import (
    Checkpoint,
    CheckpointStore,
    choose_victim,
    is_stale,
    marginal_saving,
    resume_blocks,
)

B = 4
TOKENS = list(range(100, 112))  # three blocks
HASHES = [b"h0", b"h1", b"h2"]


def store(num_checkpoints: int = 4) -> CheckpointStore:
    return CheckpointStore(num_checkpoints, 100, CheckpointPlanner("balanced", 1, B, "balanced"))


def lru_victim(s: CheckpointStore) -> int:
    return choose_victim(s.by_hash.values(), s.num_steps, "lru").position


def test_loading_a_checkpoint_is_a_use_for_lru():
    s = store()
    s.reserve(4, TOKENS, HASHES, B, planned=[4, 8])
    s.reserve(8, TOKENS, HASHES, B, planned=[4, 8])
    s.end_step()
    assert lru_victim(s) == 4
    s.pin(b"h0")  # an admission loads the checkpoint at 4
    s.end_step()
    assert lru_victim(s) == 8


def test_saving_a_checkpoint_again_is_a_use_for_lru():
    s = store()
    s.reserve(4, TOKENS, HASHES, B, planned=[4, 8])
    s.reserve(8, TOKENS, HASHES, B, planned=[4, 8])
    s.end_step()
    assert s.reserve(4, TOKENS, HASHES, B, planned=[4, 8]) is None  # saved before: used again
    assert lru_victim(s) == 8


def test_a_save_does_not_move_a_checkpoint_reserved_in_the_same_step():
    # request a saves at 4; request b, on the same prefix and planning only 8, saves at 8 in the same step
    s = store()
    assert s.reserve(4, TOKENS, HASHES, B, planned=[4]) == 0
    assert s.reserve(8, TOKENS, HASHES, B, planned=[8]) == 1
    assert s.stats.num_moved == 0 and sorted(c.position for c in s.by_hash.values()) == [4, 8]


def test_a_prompts_prefix_ends_at_its_tokens_even_where_its_hashes_go_further():
    s = store()
    s.reserve(12, TOKENS, HASHES, B, planned=[12])  # a 12-token prompt saves at its end
    s.end_step()
    # a prompt of its first 8 tokens, whose request generated the next 4 (its hashes reach block 2)
    assert s.reserve(4, TOKENS[:8], HASHES, B, planned=[4]) == 1
    assert s.stats.num_moved == 0 and b"h2" in s.by_hash


def test_the_store_reports_the_bytes_its_checkpoints_use():
    s = store()
    assert (s.num_used_bytes, s.budget_bytes) == (0, 400)
    s.reserve(4, TOKENS, HASHES, B, planned=[4])
    assert s.num_used_bytes == 100


def test_a_checkpoint_saves_the_distance_from_the_next_shallower_one_not_the_shallowest():
    """Depth 50 resumes from 16 without a checkpoint at 48 (8 is further back): 48 saves it 48 - 16 tokens."""
    w = np.zeros(65)
    w[50] = 1.0
    assert marginal_saving(48, [8, 16], w) == 32.0


def test_each_load_counts_as_one_resume():
    s = store()
    s.reserve(4, TOKENS, HASHES, B, planned=[4])
    s.end_step()
    assert s.stats.num_resumed == 0
    s.pin(b"h0")
    s.pin(b"h0")  # two admissions of the same step load it
    assert s.stats.num_resumed == 2


def test_a_checkpoint_after_the_first_block_is_a_resume_point():
    """The shallowest resume: past block 0 (k = 1), when only the first block's checkpoint is saved."""
    assert resume_blocks(3, {0}.__contains__) == 1
    assert resume_blocks(0, {0}.__contains__) == 0  # no hit: nothing to resume past


def test_check_integrity_catches_a_checkpoint_id_both_in_use_and_free():
    s = store()
    ckpt_id = s.reserve(4, TOKENS, HASHES, B, planned=[4])
    s.check_integrity()
    s.free_ckpt_ids.append(ckpt_id)
    with pytest.raises(AssertionError, match="checkpoint id reused"):
        s.check_integrity()


def test_check_integrity_catches_a_negative_ref_count():
    s = store()
    s.reserve(4, TOKENS, HASHES, B, planned=[4])
    s.by_hash[b"h0"].ref_cnt = -1  # one unpin too many
    with pytest.raises(AssertionError, match="negative checkpoint ref count"):
        s.check_integrity()


def ckpt(ckpt_id: int, position: int, last_used: int) -> Checkpoint:
    return Checkpoint(ckpt_id, bytes([ckpt_id]), position, reserved_at=0, last_used=last_used)


def test_flops_eviction_scales_recency_over_the_candidates_own_range():
    """Recency spans [0, 1] from the oldest to the newest candidate, however close their uses: used at 1 and 2, a
    checkpoint at 32 scores 0 + 32/32 and one at 12 scores 1 + 12/32, so the older, deeper one goes."""
    assert choose_victim([ckpt(0, 32, last_used=1), ckpt(1, 12, last_used=2)], 1, "flops").ckpt_id == 0
    # used at 10 and 20: 0 + 256/256 against 1 + 16/256
    assert choose_victim([ckpt(0, 256, last_used=10), ckpt(1, 16, last_used=20)], 1, "flops").ckpt_id == 0


def test_flops_eviction_of_candidates_used_at_once_goes_by_depth():
    """No recency spread (a lone candidate, or uses at the same tick): the shallowest goes."""
    assert choose_victim([ckpt(0, 32, last_used=5), ckpt(1, 16, last_used=5)], 1, "flops").ckpt_id == 1
    assert choose_victim([ckpt(2, 8, last_used=5)], 1, "flops").ckpt_id == 2


def test_a_checkpoint_is_stale_once_a_deeper_one_of_its_prefix_serves_its_requests():
    """Recent prompts leave at 20; beside 4 (the save) and 12 (kept), 8 serves depths 8..11, where nobody leaves."""
    w = np.zeros(33)
    w[20] = 1.0
    assert is_stale(8, 4, [8, 12], planned=[4], depth_weights=w)


def test_a_full_store_evicts_a_checkpoint_that_a_deeper_one_of_its_prefix_makes_worth_nothing():
    """X's two recent requests leave it at 11, where X's 8 serves them: X's 4 is worth nothing beside 8, so another
    prompt's 4 (worth 4 to its own request) takes its row, however popular X is."""
    s = store(num_checkpoints=2)
    s.reserve(4, TOKENS, HASHES, B, planned=[4, 8])
    s.reserve(8, TOKENS, HASHES, B, planned=[4, 8])
    s.end_step()
    other, other_hashes = list(range(200, 212)), [b"g0", b"g1", b"g2"]
    for prompt in (TOKENS, TOKENS, other):
        s.planner.observe(prompt)
    assert s.reserve(4, other, other_hashes, B, planned=[4]) == 0  # X's 4's row
    assert s.stats.num_evicted == 1 and s.stats.num_declined_saves == 0
    assert sorted(s.by_hash) == [b"g0", b"h1"]
