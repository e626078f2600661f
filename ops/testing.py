"""Random problem builder shared by the tests (``tests/ops``) and the GPU script (``bench/gpu_ops.py``).

A problem is described per sequence by ``SeqSpec``: how many keys it has, which logical positions are
queried (half-open ranges: several ranges make holes) and which ranges are SSEP segments (queries inside
see only keys from the segment start). Physical blocks are shuffled; ``repeat_block`` maps one physical
block to two logical blocks of a table, ``share_span`` maps a span of one sequence's blocks into another
sequence at a different offset (the MiniPIC reuse case).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ops.rope import rope_cos_sin


@dataclass(frozen=True)
class SeqSpec:
    kv_len: int
    query_ranges: tuple[tuple[int, int], ...]  # half-open [start, end) logical positions queried
    segments: tuple[tuple[int, int], ...] = field(default=())  # SSEP segments: visible_start = start

    @staticmethod
    def prefill(n: int, start: int = 0) -> SeqSpec:
        return SeqSpec(n, ((start, n),))

    @staticmethod
    def decode(kv_len: int) -> SeqSpec:
        return SeqSpec(kv_len, ((kv_len - 1, kv_len),))


@dataclass
class Problem:
    """The arguments of ``rope_paged_attention`` (``args()``) plus what built them."""

    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor
    cu_seqlens_q: torch.Tensor
    q_positions: torch.Tensor
    kv_lens: torch.Tensor
    visible_start: torch.Tensor
    cos_sin: torch.Tensor | None
    scale: float

    def args(self) -> tuple:
        return (
            self.q,
            self.k_cache,
            self.v_cache,
            self.block_tables,
            self.cu_seqlens_q,
            self.q_positions,
            self.kv_lens,
            self.visible_start,
            self.cos_sin,
            self.scale,
        )


def build_block_tables(
    specs: list[SeqSpec],
    block_size: int,
    generator: torch.Generator,
    extra_blocks: int = 3,
    repeat_block: bool = False,
    share_span: bool = False,
) -> tuple[torch.Tensor, int]:
    """Shuffled ``[num_seqs, max_blocks]`` int32 tables (tail padded with -1) and the pool size."""
    counts = [math.ceil(s.kv_len / block_size) for s in specs]
    num_blocks = sum(counts) + extra_blocks
    perm = torch.randperm(num_blocks, generator=generator).tolist()
    max_blocks = max(counts) + 1  # one spare column of -1 padding
    tables = torch.full((len(specs), max_blocks), -1, dtype=torch.int32)
    cursor = 0
    for s, count in enumerate(counts):
        tables[s, :count] = torch.tensor(perm[cursor : cursor + count], dtype=torch.int32)
        cursor += count
    if repeat_block:  # one physical block twice in one table (at two logical offsets)
        s = max(range(len(specs)), key=lambda i: counts[i])
        if counts[s] >= 2:
            tables[s, counts[s] - 1] = tables[s, 0]
    if share_span and len(specs) >= 2:  # seq 0's first blocks reused inside seq 1 at another offset
        span = min(counts[0], counts[1] - 1, 2)
        if span >= 1:
            tables[1, 1 : 1 + span] = tables[0, :span]
    return tables, num_blocks


def make_problem(
    specs: list[SeqSpec],
    num_heads: int = 4,
    num_kv_heads: int = 2,
    head_dim: int = 64,
    block_size: int = 16,
    dtype: torch.dtype = torch.float32,
    rotary_dim: int | None = None,
    position_free: bool = True,
    device: str | torch.device = "cpu",
    seed: int = 0,
    extra_blocks: int = 3,
    repeat_block: bool = False,
    share_span: bool = False,
) -> Problem:
    """A random problem; caches and queries are fresh normal draws (never zeros)."""
    gen = torch.Generator().manual_seed(seed)
    tables, num_blocks = build_block_tables(specs, block_size, gen, extra_blocks, repeat_block, share_span)
    positions, starts, q_lens = [], [], []
    for spec in specs:
        pos = [p for a, b in spec.query_ranges for p in range(a, b)]
        vis = [next((a for a, b in spec.segments if a <= p < b), 0) for p in pos]
        positions += pos
        starts += vis
        q_lens.append(len(pos))
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    num_tokens = len(positions)
    cache_shape = (num_blocks, block_size, num_kv_heads, head_dim)
    rotary_dim = head_dim if rotary_dim is None else rotary_dim
    max_kv = max(s.kv_len for s in specs)
    cos_sin = rope_cos_sin(max_kv + 5, rotary_dim) if position_free else None
    return Problem(
        q=torch.randn(num_tokens, num_heads, head_dim, generator=gen).to(device=device, dtype=dtype),
        k_cache=torch.randn(cache_shape, generator=gen).to(device=device, dtype=dtype),
        v_cache=torch.randn(cache_shape, generator=gen).to(device=device, dtype=dtype),
        block_tables=tables.to(device),
        cu_seqlens_q=cu.to(device),
        q_positions=torch.tensor(positions, dtype=torch.int64, device=device),
        kv_lens=torch.tensor([s.kv_len for s in specs], dtype=torch.int32, device=device),
        visible_start=torch.tensor(starts, dtype=torch.int32, device=device),
        cos_sin=None if cos_sin is None else cos_sin.to(device),
        scale=head_dim**-0.5,
    )


def max_errors(actual: torch.Tensor, expected: torch.Tensor) -> tuple[float, float]:
    """(max abs error, max abs error / max abs expected), both in float32."""
    diff = (actual.float() - expected.float()).abs().max().item()
    return diff, diff / max(expected.float().abs().max().item(), 1e-12)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, atol: float, rtol: float, what: str = "") -> None:
    """Elementwise ``|a - e| <= atol + rtol * |e|``; prints and reports the abs / rel error."""
    abs_err, rel_err = max_errors(actual, expected)
    print(f"{what}: max abs err {abs_err:.3e}, rel err {rel_err:.3e} (atol {atol:g}, rtol {rtol:g})")
    if not torch.isfinite(actual).all():
        raise AssertionError(f"{what}: non-finite values in the output")
    tol = atol + rtol * expected.float().abs()
    bad = (actual.float() - expected.float()).abs() > tol
    if bool(bad.any()):
        raise AssertionError(f"{what}: {int(bad.sum())} elements off; max abs err {abs_err:.3e}, rel err {rel_err:.3e}")


def patch_interpreter_bf16() -> None:
    """Work around the Triton interpreter's bfloat16 math: ``tl.dot`` and elementwise float arithmetic.

    The interpreter stores bfloat16 as raw uint16, so ``create_dot`` and the float ops multiply and add those
    integers (seen with triton 3.9). Widening bf16 operands to float32 first (exact: bf16 is the top half of
    fp32) restores the math that the GPU does; elementwise results are rounded back to bf16, as the GPU's
    bf16 instructions round them. Nothing else in the kernel changes.
    """
    try:
        import numpy as np
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return
    builder_cls = interpreter.InterpreterBuilder
    original = builder_cls.create_dot
    if getattr(original, "_bf16_patched", False):
        return

    def widen(handle):
        if handle.dtype.scalar != tl.bfloat16:
            return handle
        data = (handle.data.astype(np.uint32) << 16).view(np.float32)
        return interpreter.TensorHandle(data, tl.float32)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return original(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    create_dot._bf16_patched = True
    builder_cls.create_dot = create_dot
    for name in ("create_fadd", "create_fmul", "create_fsub", "create_fneg", "create_fma"):
        setattr(builder_cls, name, _in_float32(getattr(builder_cls, name), widen, tl.bfloat16))


def _in_float32(op, widen, bf16):
    """``op`` computed on float32 copies of bf16 operands, its result rounded back to bf16."""

    def wrapped(self, *handles):
        if all(h.dtype.scalar != bf16 for h in handles):
            return op(self, *handles)
        return self.cast_impl(op(self, *map(widen, handles)), bf16)

    return wrapped
