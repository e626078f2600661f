"""BlockPool at its edges: after reset_prefix_cache every block forgets its hash, so each can be published again;
a pool of one block; cache_many given blocks and hashes of different lengths."""

import pytest

from minipic_lite.block_pool import BlockPool, NoFreeBlocksError


def test_after_a_reset_a_block_in_use_can_be_published_again():
    pool = BlockPool(3)
    a, b = pool.allocate(), pool.allocate()
    pool.cache(a, b"h-a")
    pool.cache(b, b"h-b")
    pool.free([b])  # b free but cached, a in use
    pool.reset_prefix_cache()
    assert [blk.block_hash for blk in pool.blocks] == [None, None, None] and pool.num_cached_blocks == 0
    pool.cache(a, b"h-a2")  # its contents were written again (the step is recomputed)
    assert pool.lookup(b"h-a2") == a and pool.cache_many([a], [b"h-a3"]) == []
    pool.check_integrity()


def test_a_pool_of_a_single_block_is_valid_and_recycles_that_block():
    """One block is the smallest positive pool (only 0 or fewer are refused): it hands out block 0, refuses a
    second allocation while it is held, and hands it out again once freed, its old hash forgotten."""
    pool = BlockPool(1)
    assert pool.num_blocks == 1 and pool.num_free_blocks == 1 and pool.can_allocate(1)
    assert pool.allocate() == 0 and not pool.can_allocate(1)
    with pytest.raises(NoFreeBlocksError):
        pool.allocate()
    pool.cache(0, b"h")
    pool.free([0])
    assert pool.allocate() == 0 and pool.peek(b"h") is None
    pool.check_integrity()


@pytest.mark.parametrize(("block_ids", "block_hashes"), [([0, 1], [b"h0"]), ([0], [b"h0", b"h1"])])
def test_cache_many_refuses_blocks_and_hashes_of_different_lengths(block_ids, block_hashes):
    """Each block is published under the hash at its own index: lists of different lengths are a caller's bug
    (a hash for no block, or a block with no hash), refused rather than published in part."""
    pool = BlockPool(2)
    pool.allocate(), pool.allocate()
    with pytest.raises(ValueError, match="zip"):
        pool.cache_many(block_ids, block_hashes)
