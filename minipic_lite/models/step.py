"""The step contract between the model runner and the models: what one forward needs to know, nothing more.

The runner flattens a scheduler step into per-token and per-sequence host lists (`HostStep`, a pure function
of the plan); `StepMetadata.build` turns them into device tensors in the op's layouts (ops/README.md). Models
read these fields and never see the scheduler, requests or queues.

    tokens of 2 requests, the first with a hole:   [ 16..31 | 48..56 ][ 7 ]
    cu_seqlens_q = [0, 25, 26]   kv_lens = [57, 8]   positions = [16..31, 48..56, 7]
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from minipic_lite.config import cdiv

if TYPE_CHECKING:
    from minipic_lite.decode_mirror import MirrorStep


_ARRAY_CODES = {torch.long: "q", torch.int32: "i"}


def host_tensor(values: list[int], dtype: torch.dtype) -> torch.Tensor:
    """A CPU tensor of ints through an `array` (C) buffer: 3-4x faster than torch.tensor(list) for long lists."""
    if not values:
        return torch.empty(0, dtype=dtype)
    return torch.frombuffer(array(_ARRAY_CODES[dtype], values), dtype=dtype)


@dataclass(slots=True)
class HostStep:
    """One step's inputs as host lists, appended to chunk by chunk."""

    input_ids: list[int] = field(default_factory=list)  # [num_tokens]
    positions: list[int] = field(default_factory=list)  # [num_tokens] logical position of each query token
    slot_mapping: list[int] = field(default_factory=list)  # [num_tokens] flat cache slot of each new K/V
    visible_start: list[int] = field(default_factory=list)  # [num_tokens] first key each query may see
    cu_seqlens_q: list[int] = field(default_factory=lambda: [0])  # [num_seqs + 1]
    kv_lens: list[int] = field(default_factory=list)  # [num_seqs]
    block_tables: list[list[int]] = field(default_factory=list)  # [num_seqs][blocks]
    logits_indices: list[int] = field(default_factory=list)  # [num_sampling] row of each sampled token

    def add_chunk(self, token_ids, block_table, ranges, kv_len: int, visible_start, do_sample: bool, B: int):
        """One request's query `ranges` (half-open, increasing) over `token_ids`; keys [0, kv_len) are read."""
        for start, end in ranges:
            self.input_ids += token_ids[start:end]
            self.positions += range(start, end)
            for b in range(start // B, cdiv(end, B)):  # slot of position p: block_table[p // B] * B + p % B
                offset = block_table[b] * B - b * B
                self.slot_mapping += range(offset + max(start, b * B), offset + min(end, b * B + B))
            self.visible_start += visible_start[start:end] if visible_start else [0] * (end - start)
        self.cu_seqlens_q.append(len(self.positions))
        self.kv_lens.append(kv_len)
        self.block_tables.append(block_table)
        if do_sample:
            self.logits_indices.append(len(self.positions) - 1)


@dataclass(slots=True)
class StepInputs:
    """What one forward takes: the query tokens, the step's metadata, and the rows to sample."""

    input_ids: torch.Tensor  # [num_tokens]
    meta: StepMetadata
    logits_indices: torch.Tensor  # [num_sampling_seqs]: row of each sampling request's last query token
    # the tensors are views of a CUDA graph's static buffers, written there with the bucket's padding
    # (cuda_graphs.StaticInputs.stage): a replay copies nothing
    is_staged: bool = False


@dataclass(slots=True)
class RecurrentStep:
    """Hybrid models: the state slot of each sequence of the step (state_cache.py decides which)."""

    slots: torch.Tensor  # [num_seqs] int64 live slot of each sequence
    slot_ids: list[int]  # [num_seqs] the same on the host (per-sequence loops without a sync)
    query_lens: list[int]  # [num_seqs] query tokens of each sequence (contiguous: hybrids never skip holes)
    cu_seqlens: torch.Tensor  # [num_seqs + 1] int64 (fla's varlen kernels)
    cu_seqlens_cpu: torch.Tensor  # the same on the host: fla reads it there (else it copies it back, a sync)
    conv: torch.Tensor  # [linear_layers, num_slots, conv_dim, kernel - 1] the last inputs of each conv
    ssm: torch.Tensor  # [linear_layers, num_slots, v_heads, k_head_dim, v_head_dim] float32
    fla: tuple | None = None  # fla's (chunk, fused_recurrent) kernels on CUDA when installed; set by the model
    fla_chunks: torch.Tensor | None = None  # [num_chunks, 2] int64 fla's (sequence, chunk) pairs; set by the model
    conv_rows: object | None = None  # the conv buffer's rows (qwen3_5.ConvRows); set by the model

    @property
    def is_decode(self) -> bool:
        return all(n == 1 for n in self.query_lens)

    @classmethod
    def build(cls, slot_ids: list[int], cu_seqlens_q: list[int], conv, ssm) -> RecurrentStep:
        query_lens = [end - start for start, end in zip(cu_seqlens_q, cu_seqlens_q[1:], strict=False)]
        slots = torch.tensor(slot_ids, dtype=torch.long).to(ssm.device, non_blocking=True)
        cu_cpu = torch.tensor(cu_seqlens_q, dtype=torch.long)
        return cls(slots, list(slot_ids), query_lens, cu_cpu.to(ssm.device, non_blocking=True), cu_cpu, conv, ssm)

    @classmethod
    def scratch(cls, shapes, meta: StepMetadata, dtype) -> RecurrentStep:
        """Zero states for every sequence of `meta` (a forward outside the engine's slots: the warm-up)."""
        cu = meta.cu_seqlens_q.tolist()
        conv_shape, ssm_shape = shapes
        num_seqs, device = len(cu) - 1, meta.positions.device
        conv = torch.zeros(conv_shape[0], num_seqs, *conv_shape[1:], dtype=dtype, device=device)
        ssm = torch.zeros(ssm_shape[0], num_seqs, *ssm_shape[1:], dtype=torch.float32, device=device)
        return cls.build(list(range(num_seqs)), cu, conv, ssm)


def leading_decodes(cu_seqlens_q: list[int]) -> int:
    """How many sequences at the start of a step have one query token each."""
    num_seqs = 0
    while num_seqs + 1 < len(cu_seqlens_q) and cu_seqlens_q[num_seqs + 1] - cu_seqlens_q[num_seqs] == 1:
        num_seqs += 1
    return num_seqs


@dataclass(slots=True)
class StepMetadata:
    """Per-step tensors on the device; shapes in the op's contract (ops/README.md)."""

    slot_mapping: torch.Tensor  # [num_tokens] int64
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32
    cu_seqlens_q: torch.Tensor  # [num_seqs + 1] int32
    positions: torch.Tensor  # [num_tokens] int64
    kv_lens: torch.Tensor  # [num_seqs] int32
    visible_start: torch.Tensor  # [num_tokens] int32
    # CPU decode steps: the matmul route (models/packed_linear.py: "linear", "packed" or "native"); else "linear"
    cpu_matmul: str = "linear"
    # CPU decode steps: attention over contiguous per-request keys instead of the op (decode_mirror.py)
    decode_mirror: MirrorStep | None = None
    # hybrid models: the state slots of the step's sequences (models/qwen3_5.py)
    recurrent: RecurrentStep | None = None
    # the leading sequences with one query token each (decodes), which the op may read in a launch of their own
    # (`rope_paged_attention`'s hint); 0 in a CUDA graph's metadata, whose mix of steps varies per replay
    num_decode_seqs: int = 0

    @staticmethod
    def table_tensor(block_tables: list[list[int]]) -> torch.Tensor:
        """[num_seqs, widest table] int32 on the host, each row padded with 0s."""
        width = max(len(t) for t in block_tables)
        flat = []  # NOTE: extended row by row (in C), each padded to the widest: no loop per block id
        for table in block_tables:
            flat += table
            flat += [0] * (width - len(table))
        return host_tensor(flat, torch.int32).view(len(block_tables), width)

    @classmethod
    def build(cls, host: HostStep, device: torch.device) -> StepMetadata:
        def put(values, dtype):
            return host_tensor(values, dtype).to(device, non_blocking=True)

        return cls(
            slot_mapping=put(host.slot_mapping, torch.long),
            block_tables=cls.table_tensor(host.block_tables).to(device, non_blocking=True),
            cu_seqlens_q=put(host.cu_seqlens_q, torch.int32),
            positions=put(host.positions, torch.long),
            kv_lens=put(host.kv_lens, torch.int32),
            visible_start=put(host.visible_start, torch.int32),
            num_decode_seqs=leading_decodes(host.cu_seqlens_q),
        )

    @classmethod
    def one_sequence(cls, num_tokens: int, block_size: int, device: torch.device) -> StepMetadata:
        """A prefill of `num_tokens` on blocks 0, 1, ... (the warm-up forward that sizes the cache)."""
        host = HostStep()
        num_blocks = cdiv(num_tokens, block_size)
        host.add_chunk([0] * num_tokens, list(range(num_blocks)), [(0, num_tokens)], num_tokens, None, True, block_size)
        return cls.build(host, device)
