import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minipic_lite.block_pool import BlockPool, NoFreeBlocksError
from minipic_lite.hashing import chain_hashes, hash_block, root_hash


def test_allocate_hands_out_blocks_in_lru_order():
    pool = BlockPool(4)
    assert [pool.allocate() for _ in range(4)] == [0, 1, 2, 3]
    with pytest.raises(NoFreeBlocksError):
        pool.allocate()
    pool.free([2, 0])
    assert list(pool.free_queue) == [2, 0]
    assert pool.allocate() == 2
    pool.check_integrity()


def test_free_block_keeps_its_hash_until_reused():
    pool = BlockPool(3)
    a, b = pool.allocate(), pool.allocate()
    pool.cache(a, b"h-a")
    pool.cache(b, b"h-b")
    pool.free([b, a])  # b evicted first
    assert pool.lookup(b"h-a") == a and pool.lookup(b"h-b") == b
    assert pool.allocate() == 2  # never-used block first
    assert pool.allocate() == b  # then the LRU head: b's hash is dropped
    assert pool.lookup(b"h-b") is None and pool.lookup(b"h-a") == a
    assert pool.num_hits == 3 and pool.num_lookups == 4
    pool.check_integrity()


def test_evicted_by_next_names_the_cached_blocks_at_the_head_of_the_free_queue():
    pool = BlockPool(4)
    a, b, c = pool.allocate(), pool.allocate(), pool.allocate()
    pool.cache(a, b"h-a")
    pool.cache(c, b"h-c")
    pool.free([c, b, a])  # free queue: 3 (never used), c, b (no hash), a
    assert pool.evicted_by_next(1) == [] and pool.evicted_by_next(3) == [c] and pool.evicted_by_next(9) == [c, a]
    pool.refresh([c])  # to the young end: handed out last
    assert list(pool.free_queue) == [3, b, a, c] and pool.evicted_by_next(3) == [a]
    pool.check_integrity()


def test_num_free_distinct_counts_each_free_block_once():
    """An admission's hits may list a block twice (a document twice in one prompt) and hold None where nothing was
    found: each free block counts once, blocks in use and None not at all."""
    pool = BlockPool(5)
    ids = [pool.allocate() for _ in range(4)]
    pool.free([ids[1], ids[3]])  # free queue: 4 (never used), 1, 3
    assert pool.num_free_distinct([ids[1], None, ids[1], ids[0], ids[3], ids[2]]) == 2
    assert pool.num_free_distinct(iter([None, ids[0]])) == 0 and pool.num_free_distinct([]) == 0
    assert pool.num_free_distinct(range(5)) == pool.num_free_blocks == 3


def test_touch_pulls_a_cached_free_block_back_into_use():
    pool = BlockPool(2)
    a = pool.allocate()
    pool.cache(a, b"x")
    pool.free([a])
    assert pool.num_free_blocks == 2
    pool.touch(a)
    pool.touch(a)
    assert pool.blocks[a].ref_cnt == 2 and pool.num_free_blocks == 1
    pool.free([a])
    assert pool.num_free_blocks == 1  # still one reference
    pool.free([a])
    assert list(pool.free_queue) == [1, a]
    pool.check_integrity()


def test_double_free_raises():
    pool = BlockPool(2)
    a = pool.allocate()
    pool.free([a])
    with pytest.raises(RuntimeError, match="double free of block 0"):
        pool.free([a])


def test_a_published_hash_keeps_its_first_block():
    pool = BlockPool(2)
    a, b = pool.allocate(), pool.allocate()
    pool.cache(a, b"same")
    pool.cache(b, b"same")  # same content computed twice: the first copy stays the cached one
    assert pool.lookup(b"same") == a and pool.blocks[b].block_hash is None
    pool.check_integrity()


def test_hash_chain_depends_on_every_earlier_token():
    root = root_hash("ns")
    base = chain_hashes(root, list(range(40)), 16)
    assert len(base) == 2  # the partial tail block has no hash
    assert base[0] == hash_block(root, list(range(16)))
    assert base[1] == hash_block(base[0], list(range(16, 32)))
    changed = chain_hashes(root, [99] + list(range(1, 40)), 16)
    assert changed[0] != base[0] and changed[1] != base[1]
    assert chain_hashes(root_hash("other"), list(range(40)), 16)[0] != base[0]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["alloc", "free", "cache", "hit"]), st.integers(0, 7)), max_size=80))
def test_random_operations_never_leak_or_double_free(ops):
    pool = BlockPool(6)
    held: list[int] = []  # one entry per reference we own
    for op, arg in ops:
        if op == "alloc" and pool.can_allocate(1):
            held.append(pool.allocate())
        elif op == "free" and held:
            pool.free([held.pop(arg % len(held))])
        elif op == "cache" and held:
            pool.cache(held[arg % len(held)], bytes([arg]))
        elif op == "hit":
            block_id = pool.lookup(bytes([arg]))
            if block_id is not None:
                pool.touch(block_id)
                held.append(block_id)
        pool.check_integrity()
        for block in pool.blocks:
            assert block.ref_cnt == held.count(block.block_id)
    pool.free(held)
    assert pool.num_free_blocks == 6
    pool.check_integrity()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 3)), max_size=12))
def test_cache_many_and_count_lookups_equal_the_one_block_calls(pairs):
    """cache_many returns exactly the hashes whose cache() published them; count_lookups of peek_many's answers
    counts as lookup_many does."""
    fast, plain = BlockPool(6), BlockPool(6)
    for pool in (fast, plain):
        for _ in range(6):
            pool.allocate()
    block_ids, block_hashes = [b for b, _ in pairs], [bytes([h]) for _, h in pairs]
    published = []
    for block_id, block_hash in pairs:
        before = dict(plain.hash_to_block)
        plain.cache(block_id, bytes([block_hash]))
        published += [bytes([block_hash])] if plain.hash_to_block != before else []
    assert fast.cache_many(block_ids, block_hashes) == published
    assert [(b.ref_cnt, b.block_hash) for b in fast.blocks] == [(b.ref_cnt, b.block_hash) for b in plain.blocks]
    fast.count_lookups(fast.peek_many(block_hashes))
    assert plain.lookup_many(block_hashes) == fast.peek_many(block_hashes)
    assert (fast.num_lookups, fast.num_hits) == (plain.num_lookups, plain.num_hits)


@pytest.mark.parametrize("size", [0, -3])
def test_a_pool_or_host_tier_of_no_blocks_is_refused_naming_the_size(size):
    from minipic_lite.host_tier import HostTier

    with pytest.raises(ValueError, match=f"num_blocks must be positive, got {size}"):
        BlockPool(size)
    with pytest.raises(ValueError, match=f"the host tier needs at least one slot, got {size}"):
        HostTier(size)
