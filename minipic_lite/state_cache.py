"""Recurrent state of hybrid models: live slots, a checkpoint store, and where checkpoints go.

A hybrid's linear-attention layers carry a state that depends on every token before it, so a request can
reuse cached attention KV only up to a position where a saved state exists. This module keeps the books; the
tensors live in the runner (`StateTensors`, allocated and copied by model_runner.py):

    live slots:   one per running request (conv window + recurrent state), zeroed or loaded at admission
    checkpoints:  saved states keyed by the block hash of the prefix they follow (position p = k·B: the
                  hash of block k−1 names tokens [0, p)), within a memory budget, evicted LRU or by a
                  FLOP-aware score, never while a request is about to load one; a save that must evict is
                  admitted only if it is worth more than its victim (`marginal_saving` over recent prompts)
    the planner:  `checkpoints.plan` positions for each new prompt (`CheckpointPlanner`); chunked prefill
                  ends a chunk at each planned position, so the state there is saved by that same step

    admission:  | hit | hit | hit | hit | miss | ...      KV hits [0, 64), checkpoints at 32 and 48
                resume = 48 (deepest checkpoint inside the contiguous hits); blocks 3.. are computed again
    one step:   take_ops() → zero / load slots → forward → save slots into reserved checkpoints

A checkpoint reserved in step k is written by step k's forward, so it is found (and may be evicted) only
from step k + 1 on; a checkpoint pinned by an admission is unpinned once that step's ops are taken (the
load runs before anything can evict it).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from minipic_lite.checkpoints import EntryHistory, Planner
from minipic_lite.checkpoints.estimators import common_prefix_len
from minipic_lite.hashing import BlockHash

if TYPE_CHECKING:
    from minipic_lite.request import Request

FLOPS_RECENCY_WEIGHT = 1.0  # "flops" eviction: recency and depth (tokens a resume skips) weigh the same
ADMISSION_GAMMA = 0.9  # admission: a recent prompt's depth weighs γ^age (age: prompts served after it)
PLANNER_WINDOW = 512  # recent prompts the overlap estimate and the depth of a new prompt look at


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


@dataclass(slots=True, eq=False)
class Checkpoint:
    ckpt_id: int  # row of the runner's checkpoint tensors
    block_hash: BlockHash  # the hash of the prefix's last block
    position: int  # tokens the state has seen
    reserved_at: int  # StateCache.num_steps when its save was planned; ready once a step later
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


# -- the books -------------------------------------------------------------------------------------------


@dataclass
class StateOps:
    """What the runner does for one step: before the forward zero/load, after it save (slot, checkpoint ids)."""

    zero: list[int] = field(default_factory=list)  # live slots that start from the empty prefix
    load: list[tuple[int, int]] = field(default_factory=list)  # (checkpoint, slot)
    save: list[tuple[int, int]] = field(default_factory=list)  # (slot, checkpoint)


@dataclass
class StateStats:
    num_saved: int = 0
    num_evicted: int = 0
    num_resumed: int = 0  # admissions that loaded a checkpoint
    num_skipped_saves: int = 0  # planned saves with no free checkpoint (every one pinned or unwritten)
    num_declined_saves: int = 0  # planned saves worth less than the checkpoint they would evict


class CheckpointPlanner:
    """`checkpoints.plan` positions for each new prompt; `dp` learns overlap depths from the engine's requests.

    While the estimator knows nothing about a new prompt (no recent request shares a token with it and no
    request has yet left a cached prompt at some depth), `dp` plans with `prior`, a policy that needs no
    traffic: the DP's own prior would put every checkpoint near the end, past where a second request with the
    same long prefix and its own long suffix leaves; with `balanced` that request already resumes at depth > 0.
    For the same reason the estimator spreads a prompt's own request uniformly (what `balanced` assumes) past
    the part recent prompts share with it until some request has left a prompt there
    (`EntryHistory(uniform_until_observed=True)`): a short shared header is evidence about the header only.
    """

    def __init__(self, policy: str, budget: int, bin_size: int, prior: str, window: int = PLANNER_WINDOW):
        estimator = EntryHistory(window=window, uniform_until_observed=True) if policy == "dp" else None
        self.planner = Planner(policy, budget, estimator, bin_size=bin_size)
        self.prior = Planner(prior, budget, None, bin_size=bin_size) if policy == "dp" else None
        self.recent: deque[np.ndarray] = deque(maxlen=window)

    def has_evidence(self, token_ids: np.ndarray) -> bool:
        """The estimate for this prompt rests on traffic, not only on priors."""
        estimator = self.planner.estimator
        return estimator.suffix.num_observations > 0 or bool(estimator.history_weights(token_ids)[1:].any())

    def plan(self, token_ids) -> list[int]:
        ids = np.asarray(token_ids, dtype=np.int64)
        use_prior = self.prior is not None and not self.has_evidence(ids)
        return (self.prior if use_prior else self.planner).plan(ids)

    def observe(self, token_ids) -> None:
        """A served prompt and its overlap depth with the recent prompt it shares most with (as simulator.py)."""
        ids = np.asarray(token_ids, dtype=np.int64)
        best, depth = None, 0
        for entry in self.recent:
            d = common_prefix_len(ids[:-1], entry)
            if d > depth:
                best, depth = entry, d
        self.planner.observe(ids, depth, best)
        self.recent.append(ids)


class StateCache:
    """Live state slots and the checkpoint store of a hybrid model (bookkeeping only; see module doc)."""

    def __init__(self, num_slots: int, num_checkpoints: int, checkpoint_bytes: int, planner: CheckpointPlanner,
                 eviction: str = "lru"):  # fmt: skip
        self.free_slots = deque(range(num_slots))
        self.num_slots = num_slots
        self.num_checkpoints = num_checkpoints
        self.checkpoint_bytes = checkpoint_bytes
        self.planner = planner
        self.eviction = eviction
        self.by_hash: dict[BlockHash, Checkpoint] = {}
        self.free_ckpt_ids = deque(range(num_checkpoints))
        self.ops = StateOps()
        self._pinned: list[Checkpoint] = []  # loaded by this step's admissions
        self.num_steps = 0  # take_ops() calls: one per scheduled step
        self._clock = 0
        self.stats = StateStats()
        self.block_size = 1  # the requests' (set by plan_saves)

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

    # -- admission and release (KVCacheManager) ----------------------------------------------------------

    def resume_point(self, req: Request, num_cached_blocks: int) -> int:
        """Tokens the request can skip: the deepest checkpoint inside its first `num_cached_blocks` (KV hits)."""
        k = resume_blocks(num_cached_blocks, lambda i: self.lookup(req.block_hashes[i]) is not None)
        return k * req.block_size

    def attach(self, req: Request, resume: int) -> None:
        """Give an admitted request a live slot, loaded from the checkpoint at `resume` (or zeroed)."""
        if req.checkpoint_positions is None:  # NOTE: planned once; a re-admission keeps its plan
            req.checkpoint_positions = self.planner.plan(req.prompt_token_ids)
            self.planner.observe(req.prompt_token_ids)
        req.state_slot = self.free_slots.popleft()
        req.num_resumed_tokens = resume
        req.num_computed_tokens = resume
        if resume == 0:
            self.ops.zero.append(req.state_slot)
            return
        ckpt = self.lookup(req.block_hashes[resume // req.block_size - 1])
        ckpt.ref_cnt += 1
        self._pinned.append(ckpt)
        ckpt.last_used = self._tick()
        self.ops.load.append((ckpt.ckpt_id, req.state_slot))
        self.stats.num_resumed += 1

    def release(self, req: Request) -> None:
        if req.state_slot is not None:
            self.free_slots.append(req.state_slot)
            req.state_slot = None

    # -- saves (KVCacheManager.publish: the step that computes up to `num_tokens` is scheduled) ----------

    def plan_saves(self, req: Request, num_tokens: int) -> None:
        """Reserve a checkpoint when this step's chunk ends at one of the request's planned positions."""
        # NOTE: only while the chunk is being scheduled (it ends past num_computed_tokens): after the step
        # (postprocess publishes too) the slot moves on with the next token, so saving then would be wrong.
        if (
            num_tokens <= req.num_computed_tokens
            or req.state_slot is None
            or num_tokens not in (req.checkpoint_positions or ())
        ):
            return
        if num_tokens in req.saved_checkpoints or num_tokens % req.block_size:
            return
        block_hash = req.block_hashes[num_tokens // req.block_size - 1]
        if block_hash in self.by_hash:  # NOTE: saved before (maybe by another request): just used again
            self.by_hash[block_hash].last_used = self._tick()
            return
        tokens = np.asarray(req.prompt_token_ids, dtype=np.int64)
        self.block_size = req.block_size
        ckpt_id = self._free_ckpt_id(lambda: self._value(num_tokens, tokens, req.block_hashes, None))
        if ckpt_id is None:
            return
        now = self._tick()
        self.by_hash[block_hash] = Checkpoint(ckpt_id, block_hash, num_tokens, self.num_steps, now,
                                              token_ids=tokens, block_hashes=req.block_hashes)  # fmt: skip
        self.ops.save.append((req.state_slot, ckpt_id))
        req.saved_checkpoints.append(num_tokens)
        self.stats.num_saved += 1

    def _value(self, position: int, tokens: np.ndarray, block_hashes, itself: Checkpoint | None) -> float:
        """marginal_saving of a checkpoint at `position` of this prompt over the planner's recent prompts."""
        n = min(len(block_hashes), len(tokens) // self.block_size)
        others = [(k + 1) * self.block_size for k in range(n)
                  if (c := self.by_hash.get(block_hashes[k])) is not None and c is not itself]  # fmt: skip
        return marginal_saving(position, others, recent_depths(tokens, self.planner.recent))

    def _free_ckpt_id(self, new_value=None) -> int | None:
        if self.free_ckpt_ids:
            return self.free_ckpt_ids.popleft()
        victim = choose_victim(self.by_hash.values(), self.num_steps, self.eviction)
        if victim is None:
            self.stats.num_skipped_saves += 1
            return None
        if new_value is not None and victim.token_ids is not None:
            victim_value = self._value(victim.position, victim.token_ids, victim.block_hashes, victim)
            if not admits(new_value(), victim_value):
                self.stats.num_declined_saves += 1
                return None
        del self.by_hash[victim.block_hash]
        self.stats.num_evicted += 1
        return victim.ckpt_id

    def take_ops(self) -> StateOps:
        """This step's copies; loads taken now run before any later eviction, so their pins drop."""
        ops, self.ops = self.ops, StateOps()
        for ckpt in self._pinned:
            ckpt.ref_cnt -= 1
        self._pinned.clear()
        self.num_steps += 1
        return ops

    def reset(self) -> None:
        """Forget every checkpoint (a failed step may have left some unwritten); live slots stay."""
        self.free_ckpt_ids.extend(c.ckpt_id for c in self.by_hash.values())
        self.by_hash.clear()
        self.ops, self._pinned = StateOps(), []

    def check_integrity(self, live_slots=()) -> None:
        """Slots: free + live == total, no slot twice. Checkpoints: ids unique, free + used == total, budget."""
        live = list(live_slots)
        assert len(set(live)) == len(live), "a live state slot is held twice"
        assert set(live).isdisjoint(self.free_slots), "a live state slot is in the free list"
        assert len(self.free_slots) + len(live) == self.num_slots, "free + live state slots != total"
        used = [c.ckpt_id for c in self.by_hash.values()]
        assert len(set(used)) == len(used) and set(used).isdisjoint(self.free_ckpt_ids), "checkpoint id reused"
        assert len(used) + len(self.free_ckpt_ids) == self.num_checkpoints, "free + used checkpoints != total"
        assert all(c.ref_cnt >= 0 for c in self.by_hash.values()), "negative checkpoint ref count"
        assert all(h == c.block_hash for h, c in self.by_hash.items()), "checkpoint map is inconsistent"
        assert self.num_used_bytes <= self.budget_bytes, "the checkpoint store exceeds its budget"


# -- the tensors (owned by the runner) ---------------------------------------------------------------------


class StateTensors:
    """Live slots and checkpoints of every linear layer, on the device; conv in the model dtype, states fp32."""

    def __init__(self, shapes, num_slots: int, budget_bytes: int, dtype: torch.dtype, device):
        conv_shape, ssm_shape = shapes  # per slot: [linear_layers, ...]
        self.checkpoint_bytes = int(np.prod(conv_shape)) * dtype.itemsize + int(np.prod(ssm_shape)) * 4
        self.num_checkpoints = int(budget_bytes // self.checkpoint_bytes)

        def alloc(shape, n, dt):  # (linear_layers, n, ...)
            return torch.zeros(shape[0], n, *shape[1:], dtype=dt, device=device)

        self.conv, self.ssm = alloc(conv_shape, num_slots, dtype), alloc(ssm_shape, num_slots, torch.float32)
        self.ckpt_conv = alloc(conv_shape, self.num_checkpoints, dtype)
        self.ckpt_ssm = alloc(ssm_shape, self.num_checkpoints, torch.float32)

    def before_forward(self, ops: StateOps | None) -> None:
        if ops is None:
            return
        for slot in ops.zero:
            self.conv[:, slot].zero_()
            self.ssm[:, slot].zero_()
        for ckpt_id, slot in ops.load:
            self.conv[:, slot].copy_(self.ckpt_conv[:, ckpt_id])
            self.ssm[:, slot].copy_(self.ckpt_ssm[:, ckpt_id])

    def after_forward(self, ops: StateOps | None) -> None:
        for slot, ckpt_id in ops.save if ops is not None else ():
            self.ckpt_conv[:, ckpt_id].copy_(self.conv[:, slot])
            self.ckpt_ssm[:, ckpt_id].copy_(self.ssm[:, slot])
