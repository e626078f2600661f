"""Edges of the checkpoint store (checkpoints/store.py) that test_state_cache leaves open: what counts as a use
for LRU, which checkpoints a save may move, and the prefix a prompt's own block hashes reach past its tokens."""

from minipic_lite.checkpoints.planner import CheckpointPlanner
from minipic_lite.checkpoints.store import CheckpointStore, choose_victim

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
