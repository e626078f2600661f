"""BlockPool after reset_prefix_cache: every block forgets its hash, so each can be published again."""

from minipic_lite.block_pool import BlockPool


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
