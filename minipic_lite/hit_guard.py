"""Span prefills started ahead must not evict what the prompts ahead of them in the queue would hit.

An inline admission takes its prompt's hits out of the free queue before it takes fresh blocks, so it never evicts
its own hits. A span prefill (isps, barrier) takes only its span's blocks: the fresh ones come off the old end of
the LRU queue, where the other cached blocks of its own prompt, and of the prompts before it in the queue, may sit:

    free queue:  old -> [ hit of W0 | hit of W1 | nobody's | hit of W0 ] <- young      span prefill of W1 takes 2
    unguarded:   evicts the hits of W0 and W1 (computed again later by their finals)
    guarded:     those hits move to the young end first; it takes nobody's block and one more, or waits

A span prefill of W_k may start only if the fresh blocks it takes are none of the cached blocks that W_0..W_k would
hit; while the blocks it would take hold none of them, the queue's order is left as it is. Once one is refused, no
later one starts in that step (spans start in queue order, as finals are admitted), and the head's spans always fit
once nothing runs: all blocks are then free, and those it does not hit are at least its misses.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator

from minipic_lite.kv_cache_manager import KVCacheManager
from minipic_lite.request import Request


class HitGuard:
    """For one step: the hits of the waiting prompts from the head up to the one whose span prefill starts."""

    def __init__(self, kv: KVCacheManager, waiting: Collection[Request]):
        self.kv, self.waiting = kv, waiting
        self.queue: Iterator[Request] | None = None  # the waiting queue when first asked, walked once
        self.walked: set[Request] = set()
        self.block_ids: dict[int, None] = {}  # hits of the walked prompts, the head's first
        self.has_refused = False  # a span prefill was refused: the later ones wait too (spans start in queue order)

    def lets(self, req: Request, num_blocks: int) -> bool:
        """Whether a span prefill of waiting prompt `req` may take `num_blocks` fresh blocks now."""
        pool = self.kv.pool
        victims = pool.evicted_by_next(num_blocks)
        if not victims:
            return True  # NOTE: evicts nothing (a roomy cache): nothing walked, the queue's order untouched
        protected = self._hits_through(req)
        if protected.keys().isdisjoint(victims):
            return True
        pool.refresh(reversed(protected))  # NOTE: the head's hits youngest: a final admitted later evicts them last
        self.has_refused = not protected.keys().isdisjoint(pool.evicted_by_next(num_blocks))
        return not self.has_refused

    def _hits_through(self, req: Request) -> dict[int, None]:
        # NOTE: a snapshot, so that one walk serves the step's questions even if the queue changes between them
        self.queue = iter(list(self.waiting)) if self.queue is None else self.queue
        for waiting in self.queue if req not in self.walked else ():
            self.walked.add(waiting)
            self.block_ids.update(dict.fromkeys(self.kv.hit_block_ids(waiting)))
            if waiting is req:
                break
        return self.block_ids
