"""The KV-cache manager on the CPU with exact block ids (no model); integrity after every call."""

from minipic_lite.hashing import root_hash
from minipic_lite.kv_cache_manager import KVCacheManager
from minipic_lite.request import Request
from minipic_lite.sampling_params import SamplingParams

B = 4
ROOT = root_hash("test_kv_cache_manager")


def req(request_id, token_ids):
    return Request(request_id, list(token_ids), SamplingParams(), B, ROOT)


def test_admission_shares_hits_allocates_misses_and_never_hits_the_last_token_block():
    kv = KVCacheManager(8)
    a = req("a", range(10))  # blocks 0, 1 full; block 2 partial
    assert kv.allocate_prompt(a) and a.block_table == [0, 1, 2] and a.cached_block_ids == set()
    kv.publish(a, 10)
    assert a.num_published_blocks == 2 and kv.pool.num_cached_blocks == 2
    b = req("b", range(8))  # the same two full blocks; block 1 holds b's last token
    assert kv.allocate_prompt(b)
    assert b.block_table == [0, 3] and b.cached_block_ids == {0} and b.num_cached_tokens == 4
    assert kv.pool.blocks[0].ref_cnt == 2
    kv.check_integrity()


def test_admission_takes_nothing_when_blocks_are_short():
    kv = KVCacheManager(2)
    assert not kv.allocate_prompt(req("a", range(9)))  # needs 3
    assert kv.num_free_blocks == 2 and kv.pool.num_lookups == 2
    kv.check_integrity()


def test_grow_free_and_reuse_of_freed_cached_blocks():
    kv = KVCacheManager(6)
    a = req("a", range(4))
    assert kv.allocate_prompt(a) and a.block_table == [0]
    assert kv.num_missing_blocks(a, 9) == 2 and kv.can_allocate(2)
    kv.grow(a, 9)
    assert a.block_table == [0, 1, 2]
    a.token_ids += [4, 5, 6, 7]
    a._extend_hashes()
    kv.publish(a, 8)
    kv.free(a)
    assert a.block_table == [] and list(kv.pool.free_queue)[-3:] == [2, 1, 0]  # tail first
    b = req("b", [0, 1, 2, 3, 4, 5, 6, 7, 9])  # both full blocks hit, though their owner is gone
    assert kv.allocate_prompt(b) and b.block_table[:2] == [0, 1] and b.cached_block_ids == {0, 1}
    kv.check_integrity()


def test_without_prefix_caching_nothing_is_published_or_hit():
    kv = KVCacheManager(6, enable_prefix_caching=False)
    a = req("a", range(9))
    kv.allocate_prompt(a)
    kv.publish(a, 9)
    assert kv.pool.num_cached_blocks == 0 and a.num_published_blocks == 2
    b = req("b", range(9))
    assert kv.allocate_prompt(b) and b.cached_block_ids == set()
    kv.check_integrity()
