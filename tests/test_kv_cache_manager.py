"""The KV-cache manager on the CPU with exact block ids (no model); integrity after every call."""

from hypothesis import example, given, settings
from hypothesis import strategies as st

from minipic_lite.config import ControlTokens
from minipic_lite.hashing import root_hash
from minipic_lite.host_tier import BlockCopy
from minipic_lite.kv_cache_manager import (
    HIT,
    HOST,
    MISS,
    PENDING,
    REROTATE,
    KVCacheManager,
    Rerotate,
    blocks_of_kind,
)
from minipic_lite.request import Request
from minipic_lite.sampling_params import SamplingParams
from minipic_lite.spans import span_layout

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


# -- the fast admission, publishing and freeing, held to the plain per-block statement ------------------------


class PlainKVCacheManager(KVCacheManager):
    """match / allocate_prompt / publish / free as they were written first: one block at a time, one pool call
    each. The manager's versions visit only the blocks that are not plain hits; the states must be the same."""

    def match(self, req):
        num_hittable = len(req.block_hashes) if req.is_span_prefill else (len(req.token_ids) - 1) // req.block_size
        if not self.enable_prefix_caching:
            return [MISS] * num_hittable
        kinds, computed_here, B = [], set(), req.block_size
        for i, block_hash in enumerate(req.block_hashes[:num_hittable]):
            block_id = self.pool.peek(block_hash)
            if block_id is not None:
                kinds.append(REROTATE if self.rerotate and self.block_start.get(block_id) != i * B else HIT)
            elif (block_hash in self.pending or block_hash in computed_here) and not self.rerotate:
                kinds.append(PENDING)
            else:
                kinds.append(HOST if self.host is not None and block_hash in self.host else MISS)
                computed_here.add(block_hash)
        return kinds

    def allocate_prompt(self, req):
        kinds, hashes = self.match(req), req.block_hashes
        num_blocks = req.num_blocks_for(len(req.token_ids))
        found = [self.pool.lookup(block_hash) for block_hash in hashes[: len(kinds)]]
        for attempt in ("copies", "no copies"):  # copies and their sources never fit: compute them again
            if attempt == "no copies":
                kinds = [MISS if kind == REROTATE else kind for kind in kinds]
            hits = {i: block_id for i, block_id in enumerate(found) if kinds[i] == HIT}
            sources = {i: found[i] for i, kind in enumerate(kinds) if kind == REROTATE}
            num_taken_free = sum(self.pool.blocks[b].ref_cnt == 0 for b in {*hits.values(), *sources.values()})
            num_shared = len(hits) + kinds.count(PENDING)
            if num_blocks - num_shared + num_taken_free <= self.pool.num_blocks:
                break
        if not self.pool.can_allocate(num_blocks - num_shared + num_taken_free):
            return False
        req.block_table, req.cached_block_ids, req.waiting_blocks = [], set(), set()
        if self.host is not None:
            self.host.pinned = {hashes[i] for i, kind in enumerate(kinds) if kind == HOST}
        for block_id in [*hits.values(), *sources.values()]:
            self.pool.touch(block_id)
        for i in range(num_blocks):
            kind = kinds[i] if i < len(kinds) else MISS
            if kind == PENDING and hashes[i] not in self.pending:
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
            if kind == REROTATE:
                src = sources[i]
                self.copies.append(Rerotate(src, block_id, i * req.block_size - self.block_start[src]))
                self.num_rerotated += 1
            elif kind == HOST:
                self.copies.append(BlockCopy(False, block_id, self.host.load(hashes[i])))
                self.pool.cache(block_id, hashes[i])
                self.num_host_hits += 1
            elif kind == MISS and i < len(hashes) and self.enable_prefix_caching:
                self.pending.setdefault(hashes[i], (block_id, req))
            if kind != MISS:
                req.cached_block_ids.add(i)
            req.block_table.append(block_id)
        req.num_cached_tokens = len(req.cached_block_ids) * req.block_size
        self.pool.free(sources.values())
        if self.host is not None:
            self.host.pinned = set()
        return True

    def publish(self, req, num_tokens):
        num_full = num_tokens // req.block_size
        if self.enable_prefix_caching:
            for i in range(req.num_published_blocks, num_full):
                block_hash = req.block_hashes[i]
                self.pool.cache(req.block_table[i], block_hash)
                if self.rerotate and self.pool.peek(block_hash) == req.block_table[i]:
                    self.block_start[req.block_table[i]] = i * req.block_size
                if self.pending.get(block_hash, (None, None))[1] is req and i not in req.cached_block_ids:
                    del self.pending[block_hash]
                    for waiter, block in self.waiters.pop(block_hash, []):
                        waiter.waiting_blocks.discard(block)
        req.num_published_blocks = max(req.num_published_blocks, num_full)

    def free(self, req):
        for i, block_hash in enumerate(req.block_hashes[: len(req.block_table)]):
            if self.pending.get(block_hash, (None, None))[1] is req and i not in req.cached_block_ids:
                self._hand_over(block_hash, req.block_table[i], req)
        for block_hash in {req.block_hashes[block] for block in req.waiting_blocks}:
            waiters = [(w, b) for w, b in self.waiters.pop(block_hash, []) if w is not req]
            if waiters:
                self.waiters[block_hash] = waiters
        req.waiting_blocks = set()
        self.pool.free(reversed(req.block_table))
        req.block_table = []


def manager_state(kv, requests):
    """Everything the manager and its pool hold, with requests named by their index."""
    name = {id(r): i for i, r in enumerate(requests)}
    pool = kv.pool
    return {
        "requests": [
            (r.block_table, r.cached_block_ids, r.waiting_blocks, r.num_cached_tokens, r.num_published_blocks)
            for r in requests
        ],
        "pending": [(h, b, name[id(owner)]) for h, (b, owner) in kv.pending.items()],
        "waiters": [(h, [(name[id(w)], b) for w, b in ws]) for h, ws in kv.waiters.items()],
        "free_queue": list(pool.free_queue),
        "hash_to_block": list(pool.hash_to_block.items()),
        "blocks": [(b.ref_cnt, b.block_hash) for b in pool.blocks],
        "counts": (pool.num_lookups, pool.num_hits, kv.num_host_hits, kv.num_rerotated),
        "copies": kv.copies,
        "block_start": kv.block_start,
        "host": None if kv.host is None else (list(kv.host.slots.items()), kv.host.free_slots, kv.host.num_loaded),
    }


SPANS = ControlTokens(ssep_id=1, pdep_id=2, pad_id=3)


@st.composite
def cache_scripts(draw):
    """Prompts of a few shared blocks, as SSEP spans or a plain prefix (repeats inside one prompt too), and
    what happens to them: admissions (again after a free), publishing, freeing."""
    pieces = [[1, 10 + p, 10 + p, 10 + p] for p in range(4)] + [[10, 11, 12, 13], [13, 12, 11, 10]]
    prompts = []
    for _ in range(draw(st.integers(1, 5))):
        blocks = draw(st.lists(st.integers(0, 5), min_size=1, max_size=6))
        tail = draw(st.lists(st.integers(20, 22), max_size=B))
        prompts.append([t for b in blocks for t in pieces[b]] + tail or [20])
    ops = st.tuples(st.sampled_from(["admit", "admit", "publish", "free"]), st.integers(0, 4))
    return prompts, draw(st.lists(ops, min_size=8, max_size=40)), draw(st.integers(3, 16)), draw(st.sampled_from(MODES))


MODES = ["plain", "host", "rerotate", "off"]


HOST_HITS = (  # two prompts of two full blocks evict each other into the host tier and come back from it
    [[10, 11, 12, 13, 14, 15, 16, 17, 20], [1, 11, 11, 11, 1, 12, 12, 12, 20]],
    [("admit", 0), ("publish", 0), ("free", 0), ("admit", 1), ("publish", 1), ("free", 1), ("admit", 0)]
    + [("admit", 1), ("publish", 0), ("free", 0), ("admit", 0), ("publish", 1), ("free", 1), ("admit", 1)],
    4,
    "host",
)


REROTATE_FALLBACK = (  # two spans cached at 0 and 4, asked at 4 and 0 on 3 blocks: copies + sources never fit
    [[1, 10, 10, 10, 1, 11, 11, 11, 20], [1, 11, 11, 11, 1, 10, 10, 10, 20]],
    [("admit", 0), ("publish", 0), ("free", 0), ("admit", 1), ("publish", 1), ("free", 1), ("admit", 0)],
    3,
    "rerotate",
)


REROTATE_PUBLISH = (  # spans copied (rotated) to new offsets, their source evicted before they are published
    [
        [1, 12, 12, 12, 1, 11, 11, 11, 20],
        [1, 10, 10, 10],
        [1, 10, 10, 10] * 4 + [20],
        [1, 11, 11, 11] * 4 + [1, 10, 10, 10],
    ],
    [("admit", 1), ("admit", 3), ("publish", 3), ("free", 3), ("admit", 2), ("admit", 0), ("publish", 2)],
    10,
    "rerotate",
)


@settings(max_examples=400, deadline=None)
@given(cache_scripts())
@example(HOST_HITS)
@example(REROTATE_FALLBACK)
@example(REROTATE_PUBLISH)
def test_fast_admission_publish_and_free_equal_the_plain_per_block_versions(script):
    prompts, ops, num_blocks, mode = script
    options = {"num_host_blocks": 6 if mode == "host" else 0, "rerotate": mode == "rerotate"}
    managers = [cls(num_blocks, mode != "off", **options) for cls in (KVCacheManager, PlainKVCacheManager)]
    layouts = [span_layout(p, SPANS, B) for p in prompts]
    runs = [[Request(str(i), list(p), SamplingParams(), B, ROOT, layouts[i]) for i, p in enumerate(prompts)]]
    runs.append([Request(str(i), list(p), SamplingParams(), B, ROOT, layouts[i]) for i, p in enumerate(prompts)])
    states = [[None] * len(prompts) for _ in managers]  # None (waiting), "in" (admitted) or "out" (freed)
    for op, k in ops:
        k %= len(prompts)
        results = []
        for kv, requests, state in zip(managers, runs, states, strict=True):
            r = requests[k]
            if op == "admit" and state[k] != "in":
                if state[k] == "out":
                    r.reset_for_recompute()
                results.append(kv.allocate_prompt(r))
                state[k] = "in" if results[-1] else state[k]
            elif op == "publish" and state[k] == "in":
                # NOTE: as a scheduler would with a chunk that ends there, or at the first block it waits for
                kv.publish(r, min([len(r.token_ids), *(b * B for b in r.waiting_blocks)]))
            elif op == "free" and state[k] == "in":
                kv.free(r)
                state[k] = "out"
            kv.check_integrity()
        assert len(set(results)) <= 1
        assert manager_state(managers[0], runs[0]) == manager_state(managers[1], runs[1])


@given(st.lists(st.sampled_from([HIT, REROTATE, PENDING, HOST, MISS]), max_size=12), st.data())
def test_blocks_of_kind_equals_the_plain_list(kinds, data):
    """Its C-level branch (every block found is of the kind) and its loop give what a plain loop gives."""
    found = [data.draw(st.integers(0, 9)) if k in (HIT, REROTATE) else None for k in kinds]
    for kind in (HIT, REROTATE):
        assert blocks_of_kind(kinds, kind, found) == [found[i] if k == kind else None for i, k in enumerate(kinds)]
