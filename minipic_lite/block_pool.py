"""Physical KV blocks: reference counts, the hash -> block map and the LRU queue of free blocks.

The only owner of block state. A free block keeps its hash (and stays findable by `lookup`) until
`allocate` hands it out again, so a finished request's blocks remain a cache until memory is needed:

    free queue (LRU order):  head -> [least recently freed] ... [most recently freed] <- tail
    allocate() pops the head; free() appends at the tail; touch() on a cached free block pulls it out.

In position-free mode a block holds unrotated keys, so one block serves any request at any offset; the
pool never cares where a block sits in a request.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import compress, islice
from operator import ne

from minipic_lite.hashing import BlockHash


class NoFreeBlocksError(RuntimeError):
    pass


@dataclass(slots=True)
class Block:
    block_id: int
    ref_cnt: int = 0
    block_hash: BlockHash | None = None


class BlockPool:
    def __init__(self, num_blocks: int, on_evict: Callable[[int, BlockHash], None] | None = None):
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        self.on_evict = on_evict  # told (block_id, hash) before a cached block is handed out again
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_queue: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.hash_to_block: dict[BlockHash, int] = {}
        self.num_lookups = 0
        self.num_hits = 0

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def num_cached_blocks(self) -> int:
        return len(self.hash_to_block)

    def lookup(self, block_hash: BlockHash) -> int | None:
        """The block holding `block_hash`, in use or free-but-cached, or None."""
        self.num_lookups += 1
        block_id = self.hash_to_block.get(block_hash)
        self.num_hits += block_id is not None
        return block_id

    def peek(self, block_hash: BlockHash) -> int | None:
        """`lookup` without counting it (planning, not admission)."""
        return self.hash_to_block.get(block_hash)

    def lookup_many(self, block_hashes: Iterable[BlockHash]) -> list[int | None]:
        """`lookup` of each hash, counted as one lookup each (a prompt's thousand blocks in one call)."""
        found = list(map(self.hash_to_block.get, block_hashes))
        self.count_lookups(found)
        return found

    def count_lookups(self, found: list[int | None]) -> None:
        """Count lookups whose answers (`found`, from `peek_many`) the caller already has: `lookup_many` without
        asking the map again."""
        self.num_lookups += len(found)
        self.num_hits += len(found) - found.count(None)

    def peek_many(self, block_hashes: Iterable[BlockHash]) -> list[int | None]:
        """`peek` of each hash."""
        return list(map(self.hash_to_block.get, block_hashes))

    def touch(self, block_id: int) -> None:
        """Take one more reference to a (cached) block, pulling it out of the free queue."""
        block = self.blocks[block_id]
        if block.ref_cnt == 0:
            del self.free_queue[block_id]
        block.ref_cnt += 1

    def touch_many(self, block_ids: Iterable[int]) -> None:
        """`touch` each block, in order."""
        blocks, free_queue = self.blocks, self.free_queue
        for block_id in block_ids:
            block = blocks[block_id]
            if block.ref_cnt == 0:
                del free_queue[block_id]
            block.ref_cnt += 1

    def refresh(self, block_ids: Iterable[int]) -> None:
        """Move those of these blocks that are free to the young end of the free queue (handed out last)."""
        free_queue = self.free_queue
        for block_id in block_ids:
            if block_id in free_queue:
                free_queue.move_to_end(block_id)

    def evicted_by_next(self, num_blocks: int) -> list[int]:
        """The cached blocks among those the next `num_blocks` allocate() calls would hand out (the queue's head)."""
        blocks = self.blocks
        return [block_id for block_id in islice(self.free_queue, num_blocks) if blocks[block_id].block_hash is not None]

    def num_free_distinct(self, block_ids: Iterable[int | None]) -> int:
        """How many distinct blocks among these (None: no block) sit in the free queue: those of ref 0."""
        return len(self.free_queue.keys() & block_ids)  # NOTE: one pass in C (a cached prompt lists a thousand)

    def allocate(self) -> int:
        """A fresh block (ref 1, no hash): the least recently freed one, whose old hash is forgotten."""
        if not self.free_queue:
            raise NoFreeBlocksError("no free KV blocks")
        block_id, _ = self.free_queue.popitem(last=False)
        block = self.blocks[block_id]
        if block.block_hash is not None:  # NOTE: its hash maps to it: cache() never publishes a hash twice
            del self.hash_to_block[block.block_hash]
            if self.on_evict is not None:
                self.on_evict(block_id, block.block_hash)
            block.block_hash = None
        block.ref_cnt = 1
        return block_id

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= len(self.free_queue)

    def free(self, block_ids: Iterable[int]) -> None:
        """Drop one reference each; blocks that reach 0 join the free queue's tail in the given order."""
        blocks, free_queue = self.blocks, self.free_queue
        for block_id in block_ids:
            block = blocks[block_id]
            ref_cnt = block.ref_cnt  # NOTE: read once (a prompt frees a thousand blocks)
            if ref_cnt <= 0:
                raise RuntimeError(f"double free of block {block_id}")
            block.ref_cnt = ref_cnt - 1
            if ref_cnt == 1:
                free_queue[block_id] = None

    def cache(self, block_id: int, block_hash: BlockHash) -> None:
        """Publish a full, computed block under its hash. A hash already published keeps its block."""
        block = self.blocks[block_id]
        if block.block_hash is not None or block_hash in self.hash_to_block:
            return
        block.block_hash = block_hash
        self.hash_to_block[block_hash] = block_id

    def cache_many(self, block_ids: Sequence[int], block_hashes: Sequence[BlockHash]) -> list[BlockHash]:
        """`cache` each block under its hash, in order; returns the hashes it published (the others were already)."""
        blocks, hash_to_block = self.blocks, self.hash_to_block
        # NOTE: a block already published under its hash (a hit) is left alone, as cache() would; found in C
        published = map(ne, map(hash_to_block.get, block_hashes), block_ids)
        cached = []
        for block_id, block_hash in compress(zip(block_ids, block_hashes, strict=True), published):
            block = blocks[block_id]
            if block.block_hash is None and block_hash not in hash_to_block:
                block.block_hash = block_hash
                hash_to_block[block_hash] = block_id
                cached.append(block_hash)
        return cached

    def reset_prefix_cache(self) -> None:
        """Forget every hash (blocks in use keep their contents and refs)."""
        for block in self.blocks:
            block.block_hash = None
        self.hash_to_block.clear()

    def check_integrity(self) -> None:
        """free + in use == total; the free queue holds exactly the ref-0 blocks; the map is consistent."""
        in_use = [b.block_id for b in self.blocks if b.ref_cnt > 0]
        assert all(b.ref_cnt >= 0 for b in self.blocks), "negative ref count"
        assert len(in_use) + len(self.free_queue) == self.num_blocks, "free + in use != total"
        assert set(self.free_queue).isdisjoint(in_use), "a block in use sits in the free queue"
        for block_hash, block_id in self.hash_to_block.items():
            assert self.blocks[block_id].block_hash == block_hash, f"hash map points at block {block_id} wrongly"
        for b in self.blocks:
            assert b.block_hash is None or self.hash_to_block.get(b.block_hash) == b.block_id, (
                f"block {b.block_id}'s hash is not published under it"
            )
