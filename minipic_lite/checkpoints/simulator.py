"""Replay a request stream against a bounded cache of checkpointed entries and count recurrent recompute.

The life of one request R of L tokens:
1. Its overlap depth with each entry e is t_e = LCP(R[:L−1], e): the last prompt token is always computed
   (its logits start decoding), so no request resumes past L − 1.
2. It resumes from the best entry, at max_e ℓ(t_e; C_e), and recomputes the other L − ℓ tokens; a run
   without a cache computes all L.
3. The entry with the deepest overlap (ties: the most recently used) counts as used (LRU): the entry the
   attention KV would be read from, so the cache's contents do not depend on the placement policy.
4. R becomes a new entry (unless an identical one is cached), with the checkpoints the planner places for
   it; beyond `num_entries` the oldest insertion (FIFO) or least recently used entry (LRU) goes.
5. The planner observes R, its depth and its best entry: plans use only requests seen before.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from minipic_lite.checkpoints.estimators import common_prefix_len
from minipic_lite.checkpoints.planner import Planner

EVICTIONS = ("fifo", "lru")


@dataclass(slots=True, eq=False)
class Entry:
    token_ids: np.ndarray
    checkpoints: np.ndarray  # sorted positions in 1..len(token_ids)
    inserted_at: int
    last_used: int

    def resume_depth(self, depth: int) -> int:
        """ℓ(depth; checkpoints)."""
        k = np.searchsorted(self.checkpoints, depth, side="right")
        return int(self.checkpoints[k - 1]) if k else 0


@dataclass
class SimResult:
    num_requests: int = 0
    num_prompt_tokens: int = 0  # computed without any cache
    num_recomputed_tokens: int = 0  # computed when resuming from checkpoints
    num_checkpoints: int = 0  # saved, over all inserted entries
    num_resumed: int = 0  # requests that resumed from a checkpoint
    recomputed_per_request: list[int] = field(default_factory=list, repr=False)

    @property
    def savings_factor(self) -> float:
        """Tokens a no-cache run computes per token this run computes."""
        return self.num_prompt_tokens / max(self.num_recomputed_tokens, 1)

    @property
    def checkpoints_per_request(self) -> float:
        return self.num_checkpoints / max(self.num_requests, 1)


class CheckpointCache:
    """A bounded set of cached entries, each with its own sparse checkpoints."""

    def __init__(self, num_entries: int, eviction: str = "lru"):
        if num_entries < 1:
            raise ValueError(f"num_entries must be >= 1, got {num_entries}")
        if eviction not in EVICTIONS:
            raise ValueError(f"unknown eviction {eviction!r}; choose from {EVICTIONS}")
        self.num_entries = num_entries
        self.eviction = eviction
        self.entries: list[Entry] = []
        self._clock = 0  # NOTE: one tick per touch or insert, so LRU order has no ties.

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def match(self, token_ids: np.ndarray) -> tuple[int, Entry | None, int]:
        """(resume depth, deepest-overlap entry, its depth) for a request, capped at len − 1."""
        query = token_ids[:-1]
        resume, best, best_depth = 0, None, -1
        for entry in self.entries:
            depth = common_prefix_len(query, entry.token_ids)
            resume = max(resume, entry.resume_depth(depth))
            if (depth, entry.last_used) > (best_depth, best.last_used if best else -1):
                best, best_depth = entry, depth
        return resume, best, max(best_depth, 0)

    def touch(self, entry: Entry) -> None:
        entry.last_used = self._tick()

    def insert(self, token_ids: np.ndarray, checkpoints: Iterable[int]) -> None:
        if len(self.entries) >= self.num_entries:
            key = (lambda e: e.inserted_at) if self.eviction == "fifo" else (lambda e: e.last_used)
            self.entries.remove(min(self.entries, key=key))
        positions = np.asarray(sorted(checkpoints), dtype=np.int64)
        now = self._tick()
        self.entries.append(Entry(token_ids, positions, inserted_at=now, last_used=now))

    def contains(self, token_ids: np.ndarray) -> bool:
        return any(e.token_ids.size == token_ids.size and np.array_equal(e.token_ids, token_ids) for e in self.entries)


def simulate(
    requests: Sequence[Sequence[int]], planner: Planner, *, num_entries: int = 16, eviction: str = "lru"
) -> SimResult:
    """Replay `requests` (token id lists, in arrival order) and count tokens recomputed vs no cache."""
    cache, result = CheckpointCache(num_entries, eviction), SimResult()
    for index, tokens in enumerate(requests):
        token_ids = np.asarray(tokens, dtype=np.int64)
        if token_ids.size == 0:
            raise ValueError(f"request {index} has no tokens")
        resume, best, depth = cache.match(token_ids)
        result.num_requests += 1
        result.num_prompt_tokens += token_ids.size
        result.num_recomputed_tokens += token_ids.size - resume
        result.num_resumed += resume > 0
        result.recomputed_per_request.append(token_ids.size - resume)
        if best is not None:
            cache.touch(best)
        if not cache.contains(token_ids):
            checkpoints = planner.plan(token_ids)
            cache.insert(token_ids, checkpoints)
            result.num_checkpoints += len(checkpoints)
        planner.observe(token_ids, depth, None if best is None else best.token_ids)
    return result
