"""Between the scheduler and the block pool: what is cached, which blocks a request gets, what is published.

The scheduler asks questions in requests and tokens ("admit this prompt", "room up to token 57?", "these
tokens are computed"); this manager answers them in blocks and hashes, and the pool keeps the books.

    admission:  | hit | miss | pending | host hit | miss(last token) |   all blocks taken up front
                  hit:      cached on the device: shared (ref + 1)
                  pending:  another request (or an earlier block of this prompt) is computing that hash:
                            shared, and the request waits there until the block is published (dedup)
                  host hit: cached in the host tier: a fresh device block, filled before the step's forward
                  miss:     a fresh block, computed by this request
    growth:     decode tokens past the prompt take one fresh block per block_size tokens
    publish:    a full block is cached under its hash once the step that computes it is scheduled
    free:       tail first, so the LRU queue evicts a request's last blocks before its (more shared) prefix;
                an evicted block goes to the host tier when there is one
"""

from __future__ import annotations

from minipic_lite.block_pool import BlockPool
from minipic_lite.hashing import BlockHash
from minipic_lite.host_tier import BlockCopy, HostTier
from minipic_lite.request import Request

HIT, PENDING, HOST, MISS = "hit", "pending", "host", "miss"


class KVCacheManager:
    def __init__(self, num_blocks: int, enable_prefix_caching: bool = True, num_host_blocks: int = 0):
        self.pool = BlockPool(num_blocks, on_evict=self._evicted)
        self.enable_prefix_caching = enable_prefix_caching
        self.host = HostTier(num_host_blocks) if num_host_blocks and enable_prefix_caching else None
        self.copies: list[BlockCopy] = []  # for the runner, in order, before the next forward
        self.pending: dict[BlockHash, tuple[int, Request]] = {}  # hash -> (block, owner) being computed
        self.waiters: dict[BlockHash, list[tuple[Request, int]]] = {}  # hash -> (request, logical block)
        self.num_host_hits = 0

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    # -- admission ---------------------------------------------------------------------------------------

    def match(self, req: Request) -> list[str]:
        """Where each full prompt block but the last token's would come from (HIT, PENDING, HOST or MISS)."""
        # NOTE: the last token is always computed (its logits are needed), so its block is never a hit; a
        # span prefill samples nothing, so all its blocks may hit.
        num_hittable = len(req.block_hashes) if req.is_span_prefill else (len(req.token_ids) - 1) // req.block_size
        if not self.enable_prefix_caching:
            return [MISS] * num_hittable
        kinds, computing = [], set(self.pending)
        for block_hash in req.block_hashes[:num_hittable]:
            if self.pool.peek(block_hash) is not None:
                kinds.append(HIT)
            elif block_hash in computing:
                kinds.append(PENDING)
            else:
                kinds.append(HOST if self.host is not None and block_hash in self.host else MISS)
                computing.add(block_hash)  # a later copy in this prompt waits for this one
        return kinds

    def allocate_prompt(self, req: Request) -> bool:
        """Give every block of the prompt (see the module doc). False, with nothing taken, if blocks are short."""
        kinds = self.match(req)
        hashes = req.block_hashes
        num_blocks = req.num_blocks_for(len(req.token_ids))
        found = [self.pool.lookup(block_hash) for block_hash in hashes[: len(kinds)]]  # NOTE: counts the lookups
        hits = {i: block_id for i, block_id in enumerate(found) if kinds[i] == HIT}
        num_free_hits = sum(self.pool.blocks[b].ref_cnt == 0 for b in hits.values())
        num_shared = len(hits) + kinds.count(PENDING)
        if not self.pool.can_allocate(num_blocks - num_shared + num_free_hits):
            return False
        req.block_table, req.cached_block_ids, req.waiting_blocks = [], set(), set()
        if self.host is not None:  # NOTE: evictions by this admission must not take the slots it loads from
            self.host.pinned = {hashes[i] for i, kind in enumerate(kinds) if kind == HOST}
        for block_id in hits.values():  # NOTE: first, so that allocating a fresh block never evicts a hit
            self.pool.touch(block_id)
        for i in range(num_blocks):
            kind = kinds[i] if i < len(kinds) else MISS
            if kind == PENDING and hashes[i] not in self.pending:  # a copy of a block loaded from the host above
                kind, hits[i] = HIT, self.pool.peek(hashes[i])
                self.pool.touch(hits[i])
            if kind == HIT:
                block_id = hits[i]
            elif kind == PENDING:
                block_id = self.pending[hashes[i]][0]
                self.pool.touch(block_id)
                self.waiters.setdefault(hashes[i], []).append((req, i))
                req.waiting_blocks.add(i)
            else:
                block_id = self.pool.allocate()
            if kind == HOST:
                self.copies.append(BlockCopy(False, block_id, self.host.load(hashes[i])))
                self.pool.cache(block_id, hashes[i])  # NOTE: filled before the forward that reads it
                self.num_host_hits += 1
            elif kind == MISS and i < len(hashes) and self.enable_prefix_caching:
                self.pending.setdefault(hashes[i], (block_id, req))
            if kind != MISS:
                req.cached_block_ids.add(i)
            req.block_table.append(block_id)
        req.num_cached_tokens = len(req.cached_block_ids) * req.block_size
        if self.host is not None:
            self.host.pinned = set()
        return True

    def is_ready(self, req: Request, block: int) -> bool:
        """A block of `req` taken from the cache holds its K/V (a pending one is not published yet)."""
        return block not in req.waiting_blocks

    # -- growth, publishing, freeing -----------------------------------------------------------------------

    def num_missing_blocks(self, req: Request, num_tokens: int) -> int:
        """Fresh blocks `req` needs to hold tokens [0, num_tokens)."""
        return max(0, req.num_blocks_for(num_tokens) - len(req.block_table))

    def can_allocate(self, num_blocks: int) -> bool:
        return self.pool.can_allocate(num_blocks)

    def grow(self, req: Request, num_tokens: int) -> None:
        """Fresh blocks up to token `num_tokens` (the caller checked `can_allocate`)."""
        req.block_table += [self.pool.allocate() for _ in range(self.num_missing_blocks(req, num_tokens))]

    def publish(self, req: Request, num_tokens: int) -> None:
        """Cache the full blocks of tokens [0, num_tokens) under their hashes (each block once); whoever waits
        for one of them may read it from this step on."""
        # NOTE: called when the step that completes a block is scheduled. Anyone who hits it later in the same
        # step reads it after this step's forward wrote it (K/V are written before attention reads them).
        num_full = num_tokens // req.block_size
        if self.enable_prefix_caching:
            for i in range(req.num_published_blocks, num_full):
                block_hash = req.block_hashes[i]
                self.pool.cache(req.block_table[i], block_hash)
                if self.pending.get(block_hash, (None, None))[1] is req and i not in req.cached_block_ids:
                    del self.pending[block_hash]
                    for waiter, block in self.waiters.pop(block_hash, []):
                        waiter.waiting_blocks.discard(block)
        req.num_published_blocks = max(req.num_published_blocks, num_full)

    def free(self, req: Request) -> None:
        """Drop the request's references, tail first; its blocks stay cached until reused.

        A block it was computing for others passes to the first request waiting for it, which computes it."""
        for block_hash, (block_id, owner) in list(self.pending.items()):
            if owner is req:
                self._hand_over(block_hash, block_id, req)
        for block_hash in {req.block_hashes[block] for block in req.waiting_blocks}:
            waiters = [(w, b) for w, b in self.waiters.pop(block_hash, []) if w is not req]
            if waiters:
                self.waiters[block_hash] = waiters
        req.waiting_blocks = set()
        self.pool.free(reversed(req.block_table))
        req.block_table = []

    def _hand_over(self, block_hash: BlockHash, block_id: int, owner: Request) -> None:
        waiters = [(w, b) for w, b in self.waiters.pop(block_hash, []) if w is not owner]
        if not waiters:
            del self.pending[block_hash]
            return
        (heir, block), rest = waiters[0], waiters[1:]
        heir.waiting_blocks.discard(block)
        heir.cached_block_ids.discard(block)  # NOTE: it cannot have computed past a block it waited for
        heir.num_cached_tokens -= heir.block_size
        self.pending[block_hash] = (block_id, heir)
        if rest:
            self.waiters[block_hash] = rest

    # -- the host tier -------------------------------------------------------------------------------------

    def _evicted(self, block_id: int, block_hash: BlockHash) -> None:
        if self.host is not None:
            slot = self.host.store(block_hash)
            if slot is not None:
                self.copies.append(BlockCopy(True, block_id, slot))

    def take_copies(self) -> list[BlockCopy]:
        copies, self.copies = self.copies, []
        return copies

    def reset_prefix_cache(self) -> None:
        """Forget every hash on the device and in the host tier (after a failed step: contents unknown)."""
        self.pool.reset_prefix_cache()
        if self.host is not None:
            self.host.reset()
        self.copies.clear()

    def check_integrity(self) -> None:
        self.pool.check_integrity()
        if self.host is not None:
            self.host.check_integrity()
        for block_id, owner in self.pending.values():
            assert owner.block_table and block_id in owner.block_table, "a pending block's owner does not hold it"
            assert self.pool.blocks[block_id].ref_cnt > 0, "a pending block is free"
        for block_hash, waiters in self.waiters.items():
            assert block_hash in self.pending or not waiters, "requests wait for a block nobody computes"
            for waiter, block in waiters:
                assert block in waiter.waiting_blocks and waiter.block_table[block] == self.pending[block_hash][0]
