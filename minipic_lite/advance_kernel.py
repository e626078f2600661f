"""A burst's next decode step written into a CUDA graph's static buffers in one launch.

`model_runner.advance_decode_inputs` is the reference: it builds the next step's tensors with ~8 torch ops, and a
graph step then copied 4 of them into its buffers, ~12 launches between two replays. This kernel does the same
in place: each sequence feeds back its sampled token at the next position, whose slot its block table already
holds (the scheduler takes a burst's blocks up front). Imported only where graphs run (it imports triton).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

SEQS_PER_PROGRAM = 128


POINTERS = ["sampled_ptr", "input_ids_ptr", "positions_ptr", "slot_mapping_ptr", "kv_lens_ptr", "block_tables_ptr"]


# NOTE: one compiled kernel for every launch: Triton would otherwise specialize on each int's value (== 1, a
# multiple of 16) and each pointer's 16-byte alignment, and a burst's token columns differ in both (tokens[:, step]
# of a (seqs, steps) tensor). On the H200 16-step bursts ran at 0.648 of the roofline with the specializations and
# 0.704 / 0.723 with this one variant (bench/results/next39*-decode*): compiles in the middle of serving.
@triton.jit(do_not_specialize=["num_seqs", "stride_sampled", "stride_table"], do_not_specialize_on_alignment=POINTERS)
def _advance_decode_kernel(
    sampled_ptr,  # [num_seqs] int64: the token each sequence sampled (any stride)
    input_ids_ptr,  # [num_seqs] int64: the next step's one token per sequence
    positions_ptr,  # [num_seqs] int64
    slot_mapping_ptr,  # [num_seqs] int64
    kv_lens_ptr,  # [num_seqs] int32
    block_tables_ptr,  # [num_seqs, max_blocks] int32
    num_seqs,
    stride_sampled,
    stride_table,
    BLOCK_SIZE: tl.constexpr,
    SEQS: tl.constexpr,
):
    seqs = tl.program_id(0) * SEQS + tl.arange(0, SEQS)  # [SEQS]
    ok = seqs < num_seqs
    token = tl.load(sampled_ptr + seqs * stride_sampled, mask=ok)
    position = tl.load(positions_ptr + seqs, mask=ok) + 1
    block = tl.load(block_tables_ptr + seqs.to(tl.int64) * stride_table + position // BLOCK_SIZE, mask=ok)
    tl.store(input_ids_ptr + seqs, token, mask=ok)
    tl.store(positions_ptr + seqs, position, mask=ok)
    tl.store(slot_mapping_ptr + seqs, block.to(tl.int64) * BLOCK_SIZE + position % BLOCK_SIZE, mask=ok)
    tl.store(kv_lens_ptr + seqs, tl.load(kv_lens_ptr + seqs, mask=ok) + 1, mask=ok)


def advance_decode_in_place(
    sampled: torch.Tensor,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_lens: torch.Tensor,
    block_tables: torch.Tensor,
    block_size: int,
) -> None:
    """Advance a decode step's buffers (one token per sequence, `sampled` [num_seqs]) to the next step, in place.

    input_ids, positions, slot_mapping [num_seqs] int64, kv_lens [num_seqs] int32, block_tables [num_seqs, W] int32:
    contiguous along their last dim (a graph's static buffers). visible_start stays (a decode token continues
    its segment)."""
    num_seqs = sampled.shape[0]
    for name, t in (("input_ids", input_ids), ("positions", positions), ("slot_mapping", slot_mapping)):
        assert t.dtype == torch.long and t.shape[0] == num_seqs and t.stride(0) == 1, name
    assert kv_lens.dtype == block_tables.dtype == torch.int32 and block_tables.stride(1) == 1
    assert kv_lens.shape[0] == block_tables.shape[0] == num_seqs and sampled.dtype == torch.long
    grid = (triton.cdiv(num_seqs, SEQS_PER_PROGRAM),)
    _advance_decode_kernel[grid](
        sampled, input_ids, positions, slot_mapping, kv_lens, block_tables,
        num_seqs, sampled.stride(0), block_tables.stride(0),
        BLOCK_SIZE=block_size, SEQS=SEQS_PER_PROGRAM, num_warps=4,
    )  # fmt: skip
