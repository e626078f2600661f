"""The CPU's decode fast path: a contiguous copy of each running request's keys (rotated once) and values.

On the GPU the Triton op reads paged keys and rotates them in registers. On the CPU the op's vectorized path
gathers every key of every request into a padded tensor and rotates it, every step (ops/torch_impl.py), several
times slower than attention over contiguous keys (`docs/CPU.md`, "The CPU decode mirror"). Within one
request key j always sits at position j, so its rotated copy stays valid for the request's life: the mirror
rotates each key once, a decode step appends one key per request and attends over all slots in one call: the C kernel
of models/native.py where it runs (copies in a bf16 model's dtype), else SDPA over a mask (copies in float32).

The paged cache stays the truth. The mirror copies from it what it lacks (a prefill, cache hits, steps it did
not serve), and a request that is absent from a decode step (finished, preempted) gives its slot back.

    slot s:  [ k_rot 0 | k_rot 1 | ... | k_rot n-1 | free capacity ]      n = entry.num_mirrored
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from minipic_lite.config import ModelConfig
from minipic_lite.models import native
from ops.rope import RotationTables, rotate_with_rows

# NOTE: the first allocation; both then grow by doubling. One slot first: a lone long request takes one slot's
# bytes (8 slots of 8,192 keys put SmolLM2's float32 mirror past its 2 GiB budget at 6,000 tokens, and the op served)
MIN_SLOTS, MIN_CAPACITY = 1, 64


@dataclass(slots=True)
class MirrorEntry:
    slot: int
    num_mirrored: int  # keys [0, num_mirrored) of the request are in its slot
    num_preemptions: int  # a recomputed request is mirrored again from scratch


@dataclass(slots=True)
class MirrorStep:
    """One decode step served by the mirror (carried in StepMetadata.decode_mirror)."""

    mirror: DecodeMirror
    slots: torch.Tensor  # [num_seqs] slot of each decode token
    positions: torch.Tensor  # [num_seqs]: the last key each query sees (its own)
    visible_start: torch.Tensor  # [num_seqs] int64: the first
    rope: RotationTables  # the rotation at the step's positions, built once a step for every layer's q and k
    mask: torch.Tensor | None  # [num_slots, 1, 1, length] bool: key j visible from the slot's query (SDPA only)
    num_slots: int
    length: int
    in_order: bool  # slots are 0, 1, ..., num_slots - 1: the queries need no scatter into slot order, nor back

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        """x [n, heads, D] rotated at the step's positions, in float32."""
        return self.rope.rotate(x)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        return self.mirror.attend(self, layer, q, k, v, scale)


class DecodeMirror:
    def __init__(self, cfg: ModelConfig, position_free: bool, max_bytes: int, dtype: torch.dtype = torch.float32):
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.position_free = position_free
        self.max_bytes = max_bytes
        # NOTE: the C kernel (models/native.py) where it runs and takes these heads, else SDPA over a mask. The
        # kernel reads a bf16 model's keys and values in bf16 (rotated in float32, then rounded: half the bytes of a
        # step's largest read at long contexts); SDPA's CPU kernel is slower in bf16, so its mirror is float32.
        self.can_native = native.load() is not None and native.supports_attention(
            cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        )
        self.dtype = dtype
        # NOTE: a hybrid's attention layers only (its linear ones keep recurrent state)
        self.k = torch.empty(cfg.num_attention_layers, 0, cfg.num_kv_heads, 0, cfg.head_dim)  # (L, slots, KVH, cap, D)
        self.v = torch.empty_like(self.k)
        self.entries: dict[str, MirrorEntry] = {}  # request_id -> its slot
        self.use_native(True)

    def use_native(self, on: bool) -> None:
        """Attend through the C kernel (where it can run) or through SDPA from the next step on, the copies kept in
        the type that path reads (tests and benchmarks compare the two in one engine)."""
        self.native = on and self.can_native
        store = self.dtype if self.native and self.dtype in native.DTYPES else torch.float32
        self.k, self.v = self.k.to(store), self.v.to(store)

    @property
    def token_bytes(self) -> int:
        return 2 * self.k.shape[0] * self.num_kv_heads * self.head_dim * self.k.element_size()

    # -- before a step ---------------------------------------------------------------------------------

    def prepare(self, out, kv_cache: torch.Tensor, cos_sin: torch.Tensor, visible_start: torch.Tensor):
        """Sync the mirror with a decode-only step; None when it cannot hold it (the op serves the step)."""
        seqs = [s.seq for s in out.scheduled]
        present = {seq.request_id for seq in seqs}
        self.entries = {i: entry for i, entry in self.entries.items() if i in present}
        for seq in seqs:
            entry = self.entries.get(seq.request_id)
            if entry is None or entry.num_preemptions != seq.num_preemptions:
                self.entries[seq.request_id] = MirrorEntry(self._free_slot(), 0, seq.num_preemptions)
        slots = [self.entries[seq.request_id].slot for seq in seqs]
        num_slots, length = max(slots) + 1, max(s.kv_len for s in out.scheduled)
        if not self._reserve(num_slots, length):
            return None
        block_size = kv_cache.shape[3]
        for s in out.scheduled:
            entry = self.entries[s.seq.request_id]
            self._copy_from_cache(entry, s.seq.block_table, s.kv_len - 1, kv_cache, cos_sin, block_size)
            entry.num_mirrored = s.kv_len  # the step's own key is appended by attend()
        slot_ids = torch.tensor(slots)
        positions = torch.tensor([s.kv_len - 1 for s in out.scheduled])
        visible_start = visible_start.long().contiguous()
        mask = None if self.native else self._mask(slot_ids, positions, visible_start, num_slots, length)
        in_order = slots == list(range(num_slots))
        rope = RotationTables.build(cos_sin[positions], self.head_dim)
        return MirrorStep(self, slot_ids, positions, visible_start, rope, mask, num_slots, length, in_order)

    def _free_slot(self) -> int:
        used = {e.slot for e in self.entries.values()}
        return next(i for i in range(len(used) + 1) if i not in used)

    def _reserve(self, num_slots: int, length: int) -> bool:
        """Grow the slot and capacity axes (doubling) to hold `num_slots` x `length`; False past the budget."""
        old_slots, old_cap = self.k.shape[1], self.k.shape[3]
        if num_slots <= old_slots and length <= old_cap:
            return True
        new_slots, new_cap = max(old_slots, MIN_SLOTS), max(old_cap, MIN_CAPACITY)
        while new_slots < num_slots:
            new_slots *= 2
        while new_cap < length:
            new_cap *= 2
        if new_slots * new_cap * self.token_bytes > self.max_bytes:
            return False
        for name in ("k", "v"):
            old = getattr(self, name)
            new = old.new_zeros(old.shape[0], new_slots, self.num_kv_heads, new_cap, self.head_dim)
            new[:, :old_slots, :, :old_cap] = old
            setattr(self, name, new)
        return True

    def _copy_from_cache(self, entry, block_table, end: int, kv_cache, cos_sin, block_size: int) -> None:
        """Mirror keys [entry.num_mirrored, end) from the paged cache, rotating them at their positions."""
        start = entry.num_mirrored
        if start >= end:
            return
        positions = torch.arange(start, end)  # (m,)
        rows = torch.tensor(block_table)[positions // block_size] * block_size + positions % block_size
        flat = kv_cache.view(2, kv_cache.shape[1], -1, self.num_kv_heads, self.head_dim)  # (2, L, slots, KVH, D)
        keys = flat[0].index_select(1, rows).float()  # (L, m, KVH, D)
        if self.position_free:
            keys = rotate_with_rows(keys, cos_sin[positions])
        self.k[:, entry.slot, :, start:end] = keys.transpose(1, 2)  # (L, KVH, m, D)
        self.v[:, entry.slot, :, start:end] = flat[1].index_select(1, rows).transpose(1, 2)

    @staticmethod
    def _mask(slots, positions, visible_start, num_slots: int, length: int) -> torch.Tensor:
        # NOTE: a slot with no request this step sees key 0 only (no empty softmax row); its output is dropped.
        first = torch.zeros(num_slots, dtype=torch.long)
        last = torch.zeros(num_slots, dtype=torch.long)
        first[slots] = visible_start
        last[slots] = positions
        keys = torch.arange(length)
        return ((keys >= first[:, None]) & (keys <= last[:, None])).view(num_slots, 1, 1, length)

    # -- in each layer ---------------------------------------------------------------------------------

    def attend(self, step: MirrorStep, layer: int, q, k, v, scale: float) -> torch.Tensor:
        """q [n, H, D] rotated, this step's keys [n, KVH, D] rotated in float32 (`MirrorStep.rotate`) and values
        [n, KVH, D] -> [n, H, D]."""
        self.k[layer, step.slots, :, step.positions] = k.to(self.k.dtype)  # (n, KVH, D)
        self.v[layer, step.slots, :, step.positions] = v.to(self.v.dtype)
        group = self.num_heads // self.num_kv_heads
        queries = q.float().view(-1, self.num_kv_heads, group, self.head_dim)
        if self.native:  # each query reads its own slot's keys: no mask, no slot order
            k_layer, v_layer, first, last = self.k[layer], self.v[layer], step.visible_start, step.positions
            out = native.decode_attention(queries.contiguous(), k_layer, v_layer, step.slots, first, last, scale)
            return out.view(-1, self.num_heads, self.head_dim).to(q.dtype)
        if not step.in_order:  # NOTE: a slot between two requests' has no query this step: zeros, output dropped
            queries = queries.new_zeros(step.num_slots, *queries.shape[1:]).index_copy_(0, step.slots, queries)
        out = F.scaled_dot_product_attention(
            queries,  # (S, KVH, G, D): the G query heads of a kv head as query rows
            self.k[layer, : step.num_slots, :, : step.length],  # (S, KVH, length, D)
            self.v[layer, : step.num_slots, :, : step.length],
            attn_mask=step.mask,
            scale=scale,
        )  # (S, KVH, G, D)
        out = out if step.in_order else out[step.slots]
        return out.reshape(-1, self.num_heads, self.head_dim).to(q.dtype)
