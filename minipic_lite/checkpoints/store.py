"""The engine's checkpoint store: saved recurrent states, their budget, eviction and admission (no tensors).

    checkpoints:  saved states keyed by the block hash of the prefix they follow (position p = k·B: the
                  hash of block k−1 names tokens [0, p)), within a memory budget, evicted LRU or by a
                  FLOP-aware score, never while a request is about to load one; a save that must evict is
                  admitted only if it is worth more than its victim (`marginal_saving` over recent prompts);
                  a save first takes the place of a stale checkpoint on its own prefix (`is_stale`), even
                  one this step loads (a step's loads run before its saves): the prefix's checkpoint moves
                  to where its requests now leave it

The tensors live in the runner (`state_cache.StateTensors`); `state_cache.StateCache` adds the live slots of
running requests and turns admissions and scheduled chunks into `pin` / `reserve` calls here.

A checkpoint reserved in step k is written by step k's forward, so it is found (and may be evicted) only
from step k + 1 on; a checkpoint pinned by an admission is unpinned once that step ends (`end_step`: the
load runs before anything can evict it).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from minipic_lite.checkpoints.estimators import common_prefix_len
from minipic_lite.checkpoints.planner import CheckpointPlanner
from minipic_lite.hashing import BlockHash

FLOPS_RECENCY_WEIGHT = 1.0  # "flops" eviction: recency and depth (tokens a resume skips) weigh the same
ADMISSION_GAMMA = 0.9  # admission: a recent prompt's depth weighs γ^age (age: prompts served after it)


# -- pure functions ----------------------------------------------------------------------------------------


def chunk_end(num_computed: int, checkpoint_positions, num_tokens: int) -> int:
    """Where the next chunk must end at the latest: the first planned position past `num_computed`."""
    for position in checkpoint_positions or ():
        if num_computed < position < num_tokens:
            return position
    return num_tokens


def resume_blocks(num_contiguous_hits: int, has_checkpoint) -> int:
    """Blocks to resume past: the deepest k ≤ num_contiguous_hits with a checkpoint after block k − 1 (0: none)."""
    for k in range(num_contiguous_hits, 0, -1):
        if has_checkpoint(k - 1):
            return k
    return 0


def marginal_saving(position: int, others, depth_weights) -> float:
    """Tokens per request a checkpoint at `position` saves, given the other checkpoints on the same prefix.

    depth_weights[t]: weight of requests that share the prefix to depth t. Adding `position` moves the resume
    of depths position ≤ t < next (the next deeper other checkpoint) from prev (the next shallower one, or 0)
    to `position`: Σ_{position ≤ t < next} w_t · (position − prev).
    """
    prev = max((c for c in others if c < position), default=0)
    nxt = min((c for c in others if c > position), default=len(depth_weights))
    return float(np.sum(depth_weights[position:nxt])) * (position - prev)


def recent_depths(token_ids: np.ndarray, recent, gamma: float = ADMISSION_GAMMA) -> np.ndarray:
    """[N + 1] Σ_i γ^age_i · [LCP(recent prompt i without its last token, token_ids) = t] (newest last)."""
    weights = np.zeros(len(token_ids) + 1)
    for age, prompt in enumerate(reversed(recent)):
        weights[common_prefix_len(prompt[:-1], token_ids)] += gamma**age
    return weights


def admits(new_value: float, victim_value: float | None) -> bool:
    """Value-aware admission: a save that must evict is made only if it is worth more than what it evicts."""
    return victim_value is None or new_value > victim_value


def is_stale(position: int, new_position: int, others, planned, depth_weights) -> bool:
    """A checkpoint at `position` on a prompt's prefix is stale once a save at `new_position` leaves it worth
    nothing (no recent prompt would resume from it: `marginal_saving` 0 beside the new one and the prefix's
    `others`) and the prompt's plan no longer has it (a plan's own hedges stay)."""
    rest = [c for c in others if c != position] + [new_position]
    return position not in planned and marginal_saving(position, rest, depth_weights) == 0


@dataclass(slots=True, eq=False)
class Checkpoint:
    ckpt_id: int  # row of the runner's checkpoint tensors
    block_hash: BlockHash  # the hash of the prefix's last block
    position: int  # tokens the state has seen
    reserved_at: int  # CheckpointStore.num_steps when its save was planned; ready once a step later
    last_used: int
    ref_cnt: int = 0  # admissions whose load has not run yet
    token_ids: np.ndarray | None = None  # the prompt that saved it (admission values it on its prefix)
    block_hashes: list | None = None  # that prompt's block hashes (its other checkpoints in the store)


def choose_victim(checkpoints, num_steps: int, eviction: str) -> Checkpoint | None:
    """The checkpoint to evict: never a pinned one nor one not written yet; None if every one is in use.

    lru: least recently used. flops (Marconi-like): lowest recency + depth, each scaled to [0, 1] over the
    candidates: a deep checkpoint saves more recompute per byte (all checkpoints are the same size).
    """
    candidates = [c for c in checkpoints if c.ref_cnt == 0 and c.reserved_at < num_steps]
    if not candidates:
        return None
    if eviction == "lru":
        return min(candidates, key=lambda c: (c.last_used, c.ckpt_id))
    oldest, newest = min(c.last_used for c in candidates), max(c.last_used for c in candidates)
    deepest = max(c.position for c in candidates)

    def score(c: Checkpoint) -> float:
        recency = (c.last_used - oldest) / max(newest - oldest, 1)
        return FLOPS_RECENCY_WEIGHT * recency + c.position / max(deepest, 1)

    return min(candidates, key=lambda c: (score(c), c.last_used, c.ckpt_id))


# -- the store ---------------------------------------------------------------------------------------------


@dataclass
class StateStats:
    num_saved: int = 0
    num_evicted: int = 0
    num_resumed: int = 0  # admissions that loaded a checkpoint
    num_skipped_saves: int = 0  # planned saves with no free checkpoint (every one pinned or unwritten)
    num_declined_saves: int = 0  # planned saves worth less than the checkpoint they would evict
    num_moved: int = 0  # saves that took the place of a stale checkpoint on their own prefix (is_stale)


class CheckpointStore:
    """Checkpoints by prefix hash within `num_checkpoints` rows of `checkpoint_bytes`, and their planner."""

    def __init__(self, num_checkpoints: int, checkpoint_bytes: int, planner: CheckpointPlanner, eviction="lru"):
        self.num_checkpoints = num_checkpoints
        self.checkpoint_bytes = checkpoint_bytes
        self.planner = planner
        self.eviction = eviction
        self.by_hash: dict[BlockHash, Checkpoint] = {}
        self.free_ckpt_ids = deque(range(num_checkpoints))
        self._pinned: list[Checkpoint] = []  # loaded by this step's admissions
        self.num_steps = 0  # end_step() calls: one per scheduled step
        self._clock = 0
        self.stats = StateStats()
        self.block_size = 1  # the prompts' (set by reserve)

    @property
    def num_used_bytes(self) -> int:
        return len(self.by_hash) * self.checkpoint_bytes

    @property
    def budget_bytes(self) -> int:
        return self.num_checkpoints * self.checkpoint_bytes

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def lookup(self, block_hash: BlockHash) -> Checkpoint | None:
        """A written checkpoint after the block with this hash, or None."""
        ckpt = self.by_hash.get(block_hash)
        return ckpt if ckpt is not None and ckpt.reserved_at < self.num_steps else None

    def pin(self, block_hash: BlockHash) -> int:
        """The id of the written checkpoint after this block, kept from eviction until this step ends."""
        ckpt = self.lookup(block_hash)
        ckpt.ref_cnt += 1
        self._pinned.append(ckpt)
        ckpt.last_used = self._tick()
        self.stats.num_resumed += 1
        return ckpt.ckpt_id

    def reserve(self, position: int, token_ids, block_hashes, block_size: int, planned=()) -> int | None:
        """A checkpoint id for this step to save the state after `position` tokens of a prompt into; None when
        it is saved already (then it is just used again) or no checkpoint is free or worth evicting.
        `planned`: the prompt's planned positions (its checkpoints elsewhere on its prefix may be stale)."""
        block_hash = block_hashes[position // block_size - 1]
        if block_hash in self.by_hash:  # NOTE: saved before (maybe by another request): just used again
            self.by_hash[block_hash].last_used = self._tick()
            return None
        tokens = np.asarray(token_ids, dtype=np.int64)
        self.block_size = block_size
        ckpt_id = self._moved_ckpt_id(position, tokens, block_hashes, planned)
        if ckpt_id is None:
            ckpt_id = self._free_ckpt_id(lambda: self._value(position, tokens, block_hashes, None))
        if ckpt_id is None:
            return None
        now = self._tick()
        self.by_hash[block_hash] = Checkpoint(ckpt_id, block_hash, position, self.num_steps, now,
                                              token_ids=tokens, block_hashes=block_hashes)  # fmt: skip
        self.stats.num_saved += 1
        return ckpt_id

    def _on_prefix(self, tokens: np.ndarray, block_hashes) -> dict[int, Checkpoint]:
        """The checkpoints on this prompt's prefix, by position."""
        n = min(len(block_hashes), len(tokens) // self.block_size)
        return {(k + 1) * self.block_size: c for k in range(n) if (c := self.by_hash.get(block_hashes[k])) is not None}

    def _value(self, position: int, tokens: np.ndarray, block_hashes, itself: Checkpoint | None) -> float:
        """marginal_saving of a checkpoint at `position` of this prompt over the planner's recent prompts."""
        others = [p for p, c in self._on_prefix(tokens, block_hashes).items() if c is not itself]
        return marginal_saving(position, others, recent_depths(tokens, self.planner.recent))

    def _moved_ckpt_id(self, position: int, tokens: np.ndarray, block_hashes, planned) -> int | None:
        """The id of a stale written checkpoint on this prompt's prefix, dropped for the save at `position`; None."""
        on_prefix = self._on_prefix(tokens, block_hashes)
        weights = recent_depths(tokens, self.planner.recent)
        for other, ckpt in on_prefix.items():
            # NOTE: a pinned one may move: pins are this step's loads, and a step's loads run before its saves
            if ckpt.reserved_at < self.num_steps and is_stale(other, position, on_prefix, planned, weights):
                del self.by_hash[ckpt.block_hash]
                self.stats.num_moved += 1
                return ckpt.ckpt_id
        return None

    def _free_ckpt_id(self, new_value) -> int | None:
        """A free checkpoint id, or a victim's if the new save (`new_value()`) is worth more than it; None."""
        if self.free_ckpt_ids:
            return self.free_ckpt_ids.popleft()
        victim = choose_victim(self.by_hash.values(), self.num_steps, self.eviction)
        if victim is None:
            self.stats.num_skipped_saves += 1
            return None
        if victim.token_ids is not None:
            victim_value = self._value(victim.position, victim.token_ids, victim.block_hashes, victim)
            if not admits(new_value(), victim_value):
                self.stats.num_declined_saves += 1
                return None
        del self.by_hash[victim.block_hash]
        self.stats.num_evicted += 1
        return victim.ckpt_id

    def end_step(self) -> None:
        """The step's loads are taken (they run before any later eviction): their pins drop."""
        for ckpt in self._pinned:
            ckpt.ref_cnt -= 1
        self._pinned.clear()
        self.num_steps += 1

    def reset(self) -> None:
        """Forget every checkpoint (a failed step may have left some unwritten)."""
        self.free_ckpt_ids.extend(c.ckpt_id for c in self.by_hash.values())
        self.by_hash.clear()
        self._pinned = []

    def check_integrity(self) -> None:
        """Ids unique, free + used == total, ref counts ≥ 0, the map consistent, the store within its budget."""
        used = [c.ckpt_id for c in self.by_hash.values()]
        assert len(set(used)) == len(used) and set(used).isdisjoint(self.free_ckpt_ids), "checkpoint id reused"
        assert len(used) + len(self.free_ckpt_ids) == self.num_checkpoints, "free + used checkpoints != total"
        assert all(c.ref_cnt >= 0 for c in self.by_hash.values()), "negative checkpoint ref count"
        assert all(h == c.block_hash for h, c in self.by_hash.items()), "checkpoint map is inconsistent"
        assert self.num_used_bytes <= self.budget_bytes, "the checkpoint store exceeds its budget"
