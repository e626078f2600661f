"""x @ W^T for a few rows of x (short prefills, decode batches): the weights streamed once by enough programs.

A step of a few rows reads every weight once, so a projection should run at the copy rate. cuBLAS does not at the
Llama-3-8B shapes on the H200 (`bench/results/gpu_gemm_l2_ced4645_h200.json`): at 17 rows `qkv` read at 0.77 of
it and `o` at 0.64 (even with `o`'s weights in L2, 9.8 µs against 12.5), at 64 rows `qkv` 0.75, `o` 0.70, `down` 0.79.
Their tiles leave most of the 132 SMs idle: 96 column tiles of 64 for `qkv`, 64 for `o` and `down`.

This kernel swaps the operands (out^T = W x^T): the weight's rows fill the tensor cores' 64-row side and the few
rows of x their narrow side (16, 32 or 64 wide), and K is cut into SPLITS ranges so that column tiles x splits cover
the SMs. Each program streams a [BLOCK_N, K / SPLITS] slab of W through tensor-descriptor (TMA) loads; with
SPLITS > 1 it stores its float32 partial, and the last program of a column tile to finish (an atomic count a tile)
adds the partials in split order (deterministic) and writes the output: no reduction launch after it.

    out[m, n] = sum_s sum_{k in split s} x[m, k] W[n, k]
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl


@dataclass(frozen=True, slots=True)
class SkinnyConfig:
    block_n: int = 64  # weight rows a program (the tensor cores' 64-row side)
    block_k: int = 128
    splits: int = 1  # K ranges: column tiles x splits programs
    num_stages: int = 4
    num_warps: int = 4

    def __post_init__(self):
        if self.block_n not in (64, 128, 256) or self.block_k not in (32, 64, 128, 256) or self.splits < 1:
            raise ValueError(f"bad skinny matmul config {self}")


@triton.jit
def _skinny_matmul_kernel(
    x_desc,  # [M, K] activations, blocks [BLOCK_M, BLOCK_K]: rows past M read as zeros
    w_desc,  # [N, K] weight (nn.Linear's), blocks [BLOCK_N, BLOCK_K]
    out_ptr,  # [M, N]
    part_ptr,  # [SPLITS, M, N] float32: each split's partial product (SPLITS > 1)
    count_ptr,  # [cdiv(N, BLOCK_N)] int32: splits finished a column tile, zero between calls
    M,
    N,
    k_per_split,  # a multiple of BLOCK_K
    stride_om,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLITS: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    n_start = pid_n * BLOCK_N
    k_start = split * k_per_split
    # -- out^T tile: W [BLOCK_N, BLOCK_K] @ x^T [BLOCK_K, BLOCK_M], over this split's K --
    acc = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
    for k in tl.range(k_start, k_start + k_per_split, BLOCK_K, num_stages=NUM_STAGES):
        w = w_desc.load([n_start, k])  # [BLOCK_N, BLOCK_K]
        x = x_desc.load([0, k])  # [BLOCK_M, BLOCK_K]
        acc = tl.dot(w, tl.trans(x), acc)
    offs_n = n_start + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    mask = (offs_n[:, None] < N) & (offs_m[None, :] < M)
    tile = offs_m[None, :] * N + offs_n[:, None]  # [BLOCK_N, BLOCK_M] into a row-major [M, N]
    out_ptrs = out_ptr + offs_m[None, :] * stride_om + offs_n[:, None]
    if SPLITS == 1:
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(part_ptr + split * M * N + tile, acc, mask=mask)
        # NOTE: every thread's partial is stored before the count is raised (release), and the last program reads
        # the others' partials from L2 (".cg": not from a stale L1) after it sees the count (acquire)
        tl.debug_barrier()
        finished = tl.atomic_add(count_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
        if finished == SPLITS - 1:
            total = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
            for s in tl.static_range(SPLITS):  # in split order: the same sum whichever program finishes last
                total += tl.load(part_ptr + s * M * N + tile, mask=mask, other=0.0, cache_modifier=".cg")
            tl.store(out_ptrs, total.to(out_ptr.dtype.element_ty), mask=mask)
            tl.atomic_xchg(count_ptr + pid_n, 0, sem="relaxed", scope="gpu")  # zero again for the next call


def block_m_for(num_rows: int) -> int:
    return max(16, triton.next_power_of_2(num_rows))


def check_skinny(x: torch.Tensor, weight: torch.Tensor, config: SkinnyConfig) -> None:
    """ValueError naming what the kernel cannot take: it needs 2-D 16-bit operands with K contiguous, at most 64 rows,
    and K a multiple of splits x block_k."""
    (m, k), (_, k_w) = x.shape, weight.shape
    if k != k_w or x.dtype != weight.dtype or x.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"skinny matmul: x {tuple(x.shape)} {x.dtype} and weight {tuple(weight.shape)} {weight.dtype}")
    if m > 64 or k % (config.splits * config.block_k):
        raise ValueError(f"skinny matmul: {m} rows (at most 64) or K={k} not a multiple of {config}")
    for name, t in (("x", x), ("weight", weight)):
        if t.stride(1) != 1 or (t.stride(0) * t.element_size()) % 16 or t.data_ptr() % 16:
            raise ValueError(f"skinny matmul: {name} must have K contiguous and 16-byte aligned rows")


def skinny_linear(
    x: torch.Tensor, weight: torch.Tensor, config: SkinnyConfig, counts: torch.Tensor | None = None
) -> torch.Tensor:
    """x [M, K] @ weight [N, K]^T -> [M, N] in x's dtype (M <= 64). `counts`: int32 zeros of at least
    cdiv(N, block_n) (the kernel leaves them zero; one buffer may serve calls one after another on a stream, not
    calls running at once); made here when None."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    check_skinny(x, weight, config)
    (m, k), n = x.shape, weight.shape[0]
    block_m = block_m_for(m)
    num_tiles = triton.cdiv(n, config.block_n)
    out = torch.empty(m, n, device=x.device, dtype=x.dtype)
    part = out
    if config.splits > 1:
        part = torch.empty(config.splits, m, n, device=x.device, dtype=torch.float32)
        if counts is None:
            counts = torch.zeros(num_tiles, device=x.device, dtype=torch.int32)
    else:
        counts = out
    x_desc = TensorDescriptor.from_tensor(x, block_shape=[block_m, config.block_k])
    w_desc = TensorDescriptor.from_tensor(weight, block_shape=[config.block_n, config.block_k])
    _skinny_matmul_kernel[(num_tiles, config.splits)](
        x_desc, w_desc, out, part, counts, m, n, k // config.splits, out.stride(0),
        BLOCK_M=block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k, SPLITS=config.splits,
        NUM_STAGES=config.num_stages, num_warps=config.num_warps,
    )  # fmt: skip
    return out
