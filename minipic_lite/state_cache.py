"""Recurrent state of hybrid models: live slots over a checkpoint store, and the state tensors.

A hybrid's linear-attention layers carry a state that depends on every token before it, so a request can
reuse cached attention KV only up to a position where a saved state exists. This module keeps the books; the
tensors live in the runner (`StateTensors`, allocated and copied by model_runner.py):

    live slots:   one per running request (conv window + recurrent state), zeroed or loaded at admission
    checkpoints:  saved states by prefix hash, within a budget (`checkpoints.store.CheckpointStore`)
    the planner:  `checkpoints.plan` positions for each new prompt (`CheckpointPlanner`); chunked prefill
                  ends a chunk at each planned position, so the state there is saved by that same step

    admission:  | hit | hit | hit | hit | miss | ...      KV hits [0, 64), checkpoints at 32 and 48
                resume = 48 (deepest checkpoint inside the contiguous hits); blocks 3.. are computed again
    one step:   take_ops() → zero / load slots → forward → save slots into reserved checkpoints
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from minipic_lite.checkpoints.planner import CheckpointPlanner
from minipic_lite.checkpoints.store import CheckpointStore, resume_blocks

if TYPE_CHECKING:
    from minipic_lite.request import Request


@dataclass
class StateOps:
    """What the runner does for one step: before the forward zero/load, after it save (slot, checkpoint ids)."""

    zero: list[int] = field(default_factory=list)  # live slots that start from the empty prefix
    load: list[tuple[int, int]] = field(default_factory=list)  # (checkpoint, slot)
    save: list[tuple[int, int]] = field(default_factory=list)  # (slot, checkpoint)


class StateCache(CheckpointStore):
    """Live state slots over the checkpoint store of a hybrid model (bookkeeping only; see module doc)."""

    def __init__(self, num_slots: int, num_checkpoints: int, checkpoint_bytes: int, planner: CheckpointPlanner,
                 eviction: str = "lru"):  # fmt: skip
        super().__init__(num_checkpoints, checkpoint_bytes, planner, eviction)
        self.free_slots = deque(range(num_slots))
        self.num_slots = num_slots
        self.ops = StateOps()

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
        ckpt_id = self.pin(req.block_hashes[resume // req.block_size - 1])
        self.ops.load.append((ckpt_id, req.state_slot))

    def release(self, req: Request) -> None:
        if req.state_slot is not None:
            self.free_slots.append(req.state_slot)
            req.state_slot = None

    # -- saves (KVCacheManager.publish: the step that computes up to `num_tokens` is scheduled) ----------

    def plan_saves(self, req: Request, num_tokens: int) -> None:
        """Reserve a checkpoint when this step's chunk ends at one of the request's planned positions."""
        # NOTE: only while the chunk is being scheduled (it ends past num_computed_tokens): after the step
        # (postprocess publishes too) the slot moves on with the next token, so saving then would be wrong.
        # A request computing a planned position again (re-admitted after preemption) saves it again if the store
        # has forgotten it meanwhile: the state is at hand for one copy; `reserve` skips one still saved.
        if (
            num_tokens <= req.num_computed_tokens
            or req.state_slot is None
            or num_tokens not in (req.checkpoint_positions or ())
            or num_tokens % req.block_size
        ):
            return
        ckpt_id = self.reserve(
            num_tokens, req.prompt_token_ids, req.block_hashes, req.block_size, req.checkpoint_positions
        )
        if ckpt_id is not None:
            self.ops.save.append((req.state_slot, ckpt_id))
            if num_tokens not in req.saved_checkpoints:
                req.saved_checkpoints.append(num_tokens)

    def take_ops(self) -> StateOps:
        """This step's copies; loads taken now run before any later eviction, so their pins drop."""
        ops, self.ops = self.ops, StateOps()
        self.end_step()
        return ops

    def reset(self) -> None:
        """Forget every checkpoint (a failed step may have left some unwritten) and pending ops; live slots stay."""
        super().reset()
        self.ops = StateOps()

    def check_integrity(self, live_slots=()) -> None:
        """Slots: free + live == total, no slot twice; then the store's checks."""
        live = list(live_slots)
        assert len(set(live)) == len(live), "a live state slot is held twice"
        assert set(live).isdisjoint(self.free_slots), "a live state slot is in the free list"
        assert len(self.free_slots) + len(live) == self.num_slots, "free + live state slots != total"
        super().check_integrity()


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
