"""Between the scheduler and the block pool: what is cached, which blocks a request gets, what is published.

The scheduler asks questions in requests and tokens ("admit this prompt", "room up to token 57?", "these
tokens are computed"); this manager answers them in blocks and hashes, and the pool keeps the books. This is
the seam where a host offload tier (fed by evictions) and recurrent-state checkpoints plug in.

    admission:  | hit | miss | hit | miss(last token) |   hits shared (ref + 1), misses fresh, all up front
    growth:     decode tokens past the prompt take one fresh block per block_size tokens
    publish:    a full block is cached under its hash once the step that computes it is scheduled
    free:       tail first, so the LRU queue evicts a request's last blocks before its (more shared) prefix
"""

from __future__ import annotations

from minipic_lite.block_pool import BlockPool
from minipic_lite.request import Request
from minipic_lite.state_cache import StateCache, StateOps


class KVCacheManager:
    def __init__(self, num_blocks: int, enable_prefix_caching: bool = True, states: StateCache | None = None):
        self.pool = BlockPool(num_blocks)
        self.enable_prefix_caching = enable_prefix_caching
        self.states = states  # hybrid models: state slots and checkpoints (state_cache.py)

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    def allocate_prompt(self, req: Request) -> bool:
        """Give every block of the prompt: cache hits are shared, misses fresh. False (nothing taken) if short."""
        # NOTE: the last token is always computed (its logits are needed), so its block is never a hit.
        num_hittable = (len(req.token_ids) - 1) // req.block_size if self.enable_prefix_caching else 0
        hits = {i: self.pool.lookup(req.block_hashes[i]) for i in range(num_hittable)}
        hits = {i: b for i, b in hits.items() if b is not None}
        resume = 0
        if self.states is not None:  # NOTE: a hybrid reuses KV only up to a saved recurrent state
            resume = self.states.resume_point(req, hits)
            hits = {i: b for i, b in hits.items() if i < resume // req.block_size}
        num_blocks = req.num_blocks_for(len(req.token_ids))
        num_free_hits = sum(self.pool.blocks[b].ref_cnt == 0 for b in hits.values())
        if not self.pool.can_allocate(num_blocks - len(hits) + num_free_hits):
            return False
        for block_id in hits.values():
            self.pool.touch(block_id)
        req.block_table = [hits[i] if i in hits else self.pool.allocate() for i in range(num_blocks)]
        req.cached_block_ids = set(hits)
        req.num_cached_tokens = len(hits) * req.block_size
        if self.states is not None:
            self.states.attach(req, resume)
        return True

    def num_missing_blocks(self, req: Request, num_tokens: int) -> int:
        """Fresh blocks `req` needs to hold tokens [0, num_tokens)."""
        return max(0, req.num_blocks_for(num_tokens) - len(req.block_table))

    def can_allocate(self, num_blocks: int) -> bool:
        return self.pool.can_allocate(num_blocks)

    def grow(self, req: Request, num_tokens: int) -> None:
        """Fresh blocks up to token `num_tokens` (the caller checked `can_allocate`)."""
        req.block_table += [self.pool.allocate() for _ in range(self.num_missing_blocks(req, num_tokens))]

    def publish(self, req: Request, num_tokens: int) -> None:
        """Cache the full blocks of tokens [0, num_tokens) under their hashes (each block once)."""
        # NOTE: called when the step that completes a block is scheduled. Anyone who hits it later in the same
        # step reads it after this step's forward wrote it (K/V are written before attention reads them).
        num_full = num_tokens // req.block_size
        if self.enable_prefix_caching:
            for i in range(req.num_published_blocks, num_full):
                self.pool.cache(req.block_table[i], req.block_hashes[i])
        req.num_published_blocks = max(req.num_published_blocks, num_full)
        if self.states is not None:
            self.states.plan_saves(req, num_tokens)

    def free(self, req: Request) -> None:
        """Drop the request's references, tail first; its blocks stay cached until reused."""
        self.pool.free(reversed(req.block_table))
        req.block_table = []
        if self.states is not None:
            self.states.release(req)

    def take_state_ops(self) -> StateOps | None:
        """The state copies of the step just scheduled (None: not a hybrid model)."""
        return self.states.take_ops() if self.states is not None else None

    def check_integrity(self) -> None:
        self.pool.check_integrity()
