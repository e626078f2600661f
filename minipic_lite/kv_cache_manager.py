"""Between the scheduler and the block pool: what is cached, which blocks a request gets, what is published.

The scheduler asks questions in requests and tokens ("admit this prompt", "room up to token 57?", "these
tokens are computed"); this manager answers them in blocks and hashes, and the pool keeps the books.
A hybrid model's recurrent-state slots and checkpoints (state_cache.py) plug in here: admission, publish, free.

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

from dataclasses import dataclass
from functools import partial
from itertools import chain, compress, filterfalse
from operator import is_not

from minipic_lite.block_pool import BlockPool
from minipic_lite.hashing import BlockHash
from minipic_lite.host_tier import BlockCopy, HostTier
from minipic_lite.request import Request
from minipic_lite.spans import indices_of
from minipic_lite.state_cache import StateCache, StateOps

HIT, PENDING, HOST, MISS, REROTATE = "hit", "pending", "host", "miss", "rerotate"
MAX_CHANGED_LOG = 1 << 16  # hashes logged for match()'s memo before it starts over


is_found = partial(is_not, None)  # a block id, not None (block 0 is falsy: `filter(None, ...)` would drop it)


def blocks_of_kind(kinds: list[str], kind: str, found: list[int | None]) -> list[int | None]:
    """found[i] for every block i of `kind` (HIT or REROTATE), None elsewhere: aligned with the prompt's blocks."""
    # NOTE: a block of those kinds is always a found one; so when as many are of `kind` as were found, they are
    # exactly the found ones (a cached prompt: a thousand hits), and no Python loop visits them
    if kinds.count(kind) == len(found) - found.count(None):
        return found[:]
    return [block_id if k == kind else None for k, block_id in zip(kinds, found, strict=True)]


@dataclass(slots=True)
class MatchEntry:
    """A remembered match() of a waiting prompt (KVCacheManager.match_memo)."""

    checked: int  # len(KVCacheManager.changed) when last found to hold
    num_hittable: int
    hashes: list[BlockHash]
    kinds: list[str]
    found: list[int | None]
    hash_set: frozenset[BlockHash] | None = None  # the hashes as a set, made when first checked (an admission
    # made in the step of its first match drops its entry unchecked)

    def holds(self, changed: list[BlockHash]) -> bool:
        """None of its hashes changed since it was last checked (and from now on, only later changes count)."""
        if self.hash_set is None:
            self.hash_set = frozenset(self.hashes)
        if not self.hash_set.isdisjoint(changed[self.checked :]):
            return False
        self.checked = len(changed)
        return True


@dataclass(frozen=True, slots=True)
class Rerotate:
    """The copy-rerotate baseline: copy block `src` to `dst`, its (rotated) keys turned by `delta` positions."""

    src: int
    dst: int
    delta: int


class KVCacheManager:
    def __init__(self, num_blocks: int, enable_prefix_caching: bool = True, num_host_blocks: int = 0,
                 states: StateCache | None = None, rerotate: bool = False):  # fmt: skip
        self.pool = BlockPool(num_blocks, on_evict=self._evicted)
        self.enable_prefix_caching = enable_prefix_caching
        self.host = HostTier(num_host_blocks) if num_host_blocks and enable_prefix_caching else None
        self.copies: list[BlockCopy] = []  # for the runner, in order, before the next forward
        self.pending: dict[BlockHash, tuple[int, Request]] = {}  # hash -> (block, owner) being computed
        self.waiters: dict[BlockHash, list[tuple[Request, int]]] = {}  # hash -> (request, logical block)
        self.num_host_hits = 0
        self.states = states  # hybrid models: state slots and checkpoints (state_cache.py)
        # the copy-rerotate baseline: where each published block's first token sat when it was computed
        self.rerotate, self.block_start, self.num_rerotated = rerotate, {}, 0
        # match() of waiting prompts, kept across steps. An entry holds while none of its hashes was cached,
        # evicted or made (not) pending since: `changed` logs every hash whose entry in the pool's map or in
        # `pending` changed.
        self.match_memo: dict[Request, MatchEntry] = {}
        self.changed: list[BlockHash] = []
        # blocks a prompt could lose since start-up (evicted, a pending one dropped, a reset): only these turn a
        # block a waiting prompt had (cached or being computed) back into a miss
        self.num_losses = 0

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    # -- admission ---------------------------------------------------------------------------------------

    def match(self, req: Request) -> list[str]:
        """Where each full prompt block but the last token's would come from (HIT, PENDING, HOST or MISS)."""
        return self._match(req)[0]

    def _match(self, req: Request) -> tuple[list[str], list[int | None]]:
        """match() and the blocks found for those kinds, from the memo where it still holds."""
        # NOTE: the last token is always computed (its logits are needed), so its block is never a hit; a
        # span prefill samples nothing, so all its blocks may hit.
        num_hittable = len(req.block_hashes) if req.is_span_prefill else (len(req.token_ids) - 1) // req.block_size
        if not self.enable_prefix_caching or req.reads_no_cache:
            return [MISS] * num_hittable, [None] * num_hittable
        hashes = req.block_hashes[:num_hittable]
        # NOTE: a host tier's LRU and the rerotate offsets change without a log entry: no memo there
        use_memo = self.host is None and not self.rerotate and not req.is_span_prefill
        entry = self.match_memo.get(req) if use_memo else None
        if entry is not None and entry.num_hittable == num_hittable and entry.holds(self.changed):
            return entry.kinds[:], entry.found[:]
        found = self.pool.peek_many(hashes)
        kinds = self._kinds(hashes, found, req.block_size)
        if use_memo:
            if len(self.changed) > MAX_CHANGED_LOG:  # NOTE: older than every entry: all of them start over
                self.changed.clear()
                self.match_memo.clear()
            self.match_memo[req] = MatchEntry(len(self.changed), num_hittable, hashes, kinds[:], found[:])
        return kinds, found

    def _kinds(self, hashes: list[BlockHash], found: list[int | None], B: int) -> list[str]:
        kinds = [HIT] * len(found)  # NOTE: a cached prompt is a thousand hits: only the others are visited
        if self.rerotate:
            kinds = [HIT if self.block_start.get(b) == i * B else REROTATE for i, b in enumerate(found)]
        computed_here: set[BlockHash] = set()
        for i in list(indices_of(found, None)):
            if (hashes[i] in self.pending or hashes[i] in computed_here) and not self.rerotate:
                kinds[i] = PENDING
            else:
                kinds[i] = HOST if self.host is not None and hashes[i] in self.host else MISS
                computed_here.add(hashes[i])  # a later copy in this prompt waits for this one
        return kinds

    def hit_block_ids(self, req: Request) -> list[int]:
        """The cached blocks a waiting prompt would hit (in use or free), in the prompt's order."""
        return [block_id for block_id in self._match(req)[1] if block_id is not None]

    def keep_for(self, req: Request) -> None:
        """The cached blocks a waiting prompt would hit move to the young end of the LRU queue: fresh blocks taken
        before its admission evict older ones first."""
        self.pool.refresh(self.hit_block_ids(req))

    def num_blocks_to_admit(self, req: Request) -> int:
        """Blocks that admitting `req` now would take out of the free queue (what `allocate_prompt` takes): all of
        its prompt's blocks but those other requests hold (hits in use, pending), a free hit listed twice once."""
        kinds, found, _ = self._usable_match(req)
        return self._plan_admission(kinds, found, req.num_blocks_for(len(req.token_ids)))[3]

    def _usable_match(self, req: Request) -> tuple[list[str], list[int | None], int | None]:
        """match() as an admission may use it, and a hybrid's resume point (None for others): a hybrid reuses KV only
        up to a saved recurrent state, and computes every block past it again."""
        kinds, found = self._match(req)
        if self.states is None:
            return kinds, found, None
        num_usable = next((i for i, kind in enumerate(kinds) if kind not in (HIT, HOST)), len(kinds))
        resume = self.states.resume_point(req, num_usable)
        return kinds[: resume // req.block_size], found[: resume // req.block_size], resume

    def allocate_prompt(self, req: Request) -> bool:
        """Give every block of the prompt (see the module doc). False, with nothing taken, if blocks are short."""
        kinds, found, resume = self._usable_match(req)
        hashes = req.block_hashes
        num_blocks = req.num_blocks_for(len(req.token_ids))
        self.pool.count_lookups(found)  # NOTE: match() found them, and nothing changed since (its memo holds)
        kinds, hits, sources, num_to_take = self._plan_admission(kinds, found, num_blocks)
        if not self.pool.can_allocate(num_to_take):
            return False
        req.waiting_blocks = set()
        if self.host is not None:  # NOTE: evictions by this admission must not take the slots it loads from
            self.host.pinned = {hashes[i] for i, kind in enumerate(kinds) if kind == HOST}
        hit_ids = hits if None not in hits else [*filter(is_found, hits)]  # NOTE: a cached prompt's are all found
        self.pool.touch_many(chain(hit_ids, filter(is_found, sources)))  # NOTE: first: a fresh block never evicts them
        table = hits + [None] * (num_blocks - len(hits))  # the hits in place, None elsewhere
        # NOTE: a cached prompt's blocks are all hits: their indices need no pass over them
        cached = set(range(len(hits)) if len(hit_ids) == len(hits) else compress(range(len(hits)), map(is_found, hits)))
        for i in list(indices_of(table, None)):  # in order: fresh blocks are taken in the order of the prompt
            kind = kinds[i] if i < len(kinds) else MISS
            if kind == PENDING and hashes[i] not in self.pending:  # a copy of a block loaded from the host above
                kind, block_id = HIT, self.pool.peek(hashes[i])
                self.pool.touch(block_id)
            elif kind == PENDING:
                block_id = self.pending[hashes[i]][0]
                self.pool.touch(block_id)
                self.waiters.setdefault(hashes[i], []).append((req, i))
                req.waiting_blocks.add(i)
            else:
                block_id = self.pool.allocate()
            if kind == REROTATE:
                src = sources[i]
                self.copies.append(Rerotate(src, block_id, i * req.block_size - self.block_start[src]))
                self.num_rerotated += 1
            elif kind == HOST:
                self.copies.append(BlockCopy(False, block_id, self.host.load(hashes[i])))
                self.pool.cache(block_id, hashes[i])  # NOTE: filled before the forward that reads it
                self.changed.append(hashes[i])
                self.num_host_hits += 1
            elif kind == MISS and i < len(hashes) and self.enable_prefix_caching:
                self.pending.setdefault(hashes[i], (block_id, req))
                self.changed.append(hashes[i])
            if kind != MISS:
                cached.add(i)
            table[i] = block_id
        req.block_table, req.cached_block_ids = table, cached
        self.match_memo.pop(req, None)
        req.num_cached_tokens = len(cached) * req.block_size
        self.pool.free(filter(is_found, sources))  # NOTE: read by their copies before any forward overwrites them
        if self.host is not None:
            self.host.pinned = set()
        if self.states is not None:
            self.states.attach(req, resume)
        return True

    def _plan_admission(self, kinds: list[str], found: list[int | None], num_blocks: int):
        """The kinds the admission goes by, its hits and copy sources (the block of each prompt block of that kind,
        None elsewhere), and how many blocks it takes out of the free queue: fresh ones, and hits and sources that
        sit there."""
        hits, sources, num_to_take = self._count_admission(kinds, found, num_blocks)
        if num_to_take > self.pool.num_blocks:
            # NOTE: a copy holds its source until the forward, so a prompt of documents cached at other offsets
            # can need more blocks than the whole cache: it would wait forever. Computing them again fits any
            # cache that holds the request.
            kinds = [MISS if kind == REROTATE else kind for kind in kinds]
            hits, sources, num_to_take = self._count_admission(kinds, found, num_blocks)
        return kinds, hits, sources, num_to_take

    def _count_admission(self, kinds: list[str], found: list[int | None], num_blocks: int):
        hits = blocks_of_kind(kinds, HIT, found)
        sources = blocks_of_kind(kinds, REROTATE, found) if self.rerotate else []
        # NOTE: hits and copy sources leave the free queue while this admission allocates its fresh blocks
        num_taken_free = self.pool.num_free_distinct(chain(hits, sources))
        num_shared = kinds.count(HIT) + kinds.count(PENDING)
        return hits, sources, num_blocks - num_shared + num_taken_free

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
        # NOTE: only the blocks it computes: the others are published (hits, host loads) or will be by the request
        # that computes them, before this one's chunk passes them (a chunk stops at a block it waits for). A cached
        # prompt's thousand hits are skipped in C. Copy-rerotate's copies are published too: their source may have
        # been evicted since the admission (a copy is a block of its own, its keys rotated for this offset).
        first, num_full = req.num_published_blocks, num_tokens // req.block_size
        if self.enable_prefix_caching and first < num_full:
            blocks = range(first, num_full)
            computed = list(blocks if self.rerotate else filterfalse(req.cached_block_ids.__contains__, blocks))
            table, hashes = req.block_table, req.block_hashes
            self.changed += self.pool.cache_many([table[i] for i in computed], [hashes[i] for i in computed])
            for i in range(first, num_full) if self.rerotate else ():
                if self.pool.peek(req.block_hashes[i]) == req.block_table[i]:
                    self.block_start[req.block_table[i]] = i * req.block_size
            for i in computed if self.pending else ():  # NOTE: only blocks it computes can be pending on it
                block_hash = req.block_hashes[i]
                if self.pending.get(block_hash, (None, None))[1] is req:
                    del self.pending[block_hash]
                    self.changed.append(block_hash)
                    for waiter, block in self.waiters.pop(block_hash, []):
                        waiter.waiting_blocks.discard(block)
        req.num_published_blocks = max(req.num_published_blocks, num_full)
        if self.states is not None:
            self.states.plan_saves(req, num_tokens)

    def free(self, req: Request) -> None:
        """Drop the request's references, tail first; its blocks stay cached until reused.

        A block it was computing for others passes to the first request waiting for it, which computes it."""
        num_hashed = min(len(req.block_hashes), len(req.block_table))
        computed = filterfalse(req.cached_block_ids.__contains__, range(num_hashed)) if self.pending else ()
        for i in computed:  # NOTE: only blocks it computes can be pending on it (a cached prompt has few)
            if self.pending.get(req.block_hashes[i], (None, None))[1] is req:
                self._hand_over(req.block_hashes[i], req.block_table[i], req)
        for block_hash in {req.block_hashes[block] for block in req.waiting_blocks}:
            waiters = [(w, b) for w, b in self.waiters.pop(block_hash, []) if w is not req]
            if waiters:
                self.waiters[block_hash] = waiters
        req.waiting_blocks = set()
        self.match_memo.pop(req, None)
        self.pool.free(reversed(req.block_table))
        req.block_table = []
        if self.states is not None:
            self.states.release(req)

    def take_state_ops(self) -> StateOps | None:
        """The state copies of the step just scheduled (None: not a hybrid model)."""
        return self.states.take_ops() if self.states is not None else None

    def _hand_over(self, block_hash: BlockHash, block_id: int, owner: Request) -> None:
        self.changed.append(block_hash)
        waiters = [(w, b) for w, b in self.waiters.pop(block_hash, []) if w is not owner]
        if not waiters:
            del self.pending[block_hash]
            self.num_losses += 1
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
        self.changed.append(block_hash)
        self.num_losses += 1
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
        self.match_memo.clear()
        self.num_losses += 1
        if self.host is not None:
            self.host.reset()
        self.copies.clear()
        if self.states is not None:  # ... and every recurrent-state checkpoint
            self.states.reset()

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
