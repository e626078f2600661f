"""An experiment for issue 13's batch-1 decode: each warp of a program keeps its own online softmax over its own keys.

The op's split read (`ops/triton_kernel.py`) computes a key tile's scores as one `tl.dot` of the query rows (a kv
head's 4 query heads, padded to 16) against the tile's keys, spread over the program's 4 warps along the keys: each
tile's row max and row sum then cross warps (shared memory and a barrier each), and so does the score tile on its
way to the value product. Here a program's keys are cut into W = num_warps interleaved sub-tiles and the math is a
batched dot ([W, 16, d] x [W, d, N / W]) whose batch axis lies along the warps: every warp runs the online softmax
of its own keys with no cross-warp step, and the W running states are merged once, at the end of the program.
Partials are written as the op's are and merged by its `merge_splits`.

    python bench/gpu_decode_warps.py --check          # the CPU interpreter against the reference (small shapes)
    python bench/gpu_decode_warps.py --out DIR        # CUDA: b1x8k against the op's defaults and SDPA (same run)

Not part of the op: a variant to measure. Results: DIR/decode_warps_<sha>_<gpu>.json.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import git_sha  # noqa: E402

from ops import triton_kernel  # noqa: E402

LOG2E = 1.4426950408889634


@triton.jit
def _warp_split_decode_kernel(
    partial_out_ptr,  # [num_seqs, num_heads, num_splits, HEAD_DIM] fp32
    partial_m_ptr,  # [num_seqs, num_heads, num_splits] fp32 (base-2, scaled)
    partial_l_ptr,  # [num_seqs, num_heads, num_splits] fp32
    q_ptr,  # [num_seqs, num_heads, HEAD_DIM], rotated
    k_cache_ptr,  # [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_DIM]
    v_cache_ptr,
    tables_ptr,  # [num_seqs, max_blocks]
    q_positions_ptr,  # [num_seqs]
    visible_start_ptr,  # [num_seqs]
    cos_sin_ptr,  # [max_position, HEAD_DIM]: cos then sin
    qk_scale,
    num_heads,
    num_splits,
    stride_tbl,
    stride_k_blk,
    stride_k_slot,
    stride_k_head,
    stride_cs,
    BLOCK_SIZE: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    TILE_N: tl.constexpr,  # keys a program reads an iteration, W sub-tiles of TILE_N // W
    W: tl.constexpr,  # sub-tiles, one a warp (num_warps)
    AHEAD: tl.constexpr = False,  # the next tile's block ids read an iteration ahead (the op's TABLE_AHEAD)
):
    kv_head = tl.program_id(0)
    split = tl.program_id(1)
    seq = tl.program_id(2)
    HALF: tl.constexpr = HEAD_DIM // 2
    NW: tl.constexpr = TILE_N // W
    ROWS: tl.constexpr = 16
    pos = tl.load(q_positions_ptr + seq).to(tl.int32)
    vis = tl.load(visible_start_ptr + seq).to(tl.int32)
    key_end = pos + 1
    tile_begin = vis // TILE_N
    tile_end = tl.cdiv(key_end, TILE_N)
    per_split = tl.cdiv(tile_end - tile_begin, num_splits)
    tile_begin = tile_begin + split * per_split
    tile_end = tl.maximum(tl.minimum(tile_end, tile_begin + per_split), tile_begin)

    offs_r = tl.arange(0, ROWS)
    heads = kv_head * GROUP + offs_r
    row_ok = offs_r < GROUP
    offs_h = tl.arange(0, HALF)
    offs_d = tl.arange(0, HEAD_DIM)
    q_rows = q_ptr + (seq.to(tl.int64) * num_heads + heads) * HEAD_DIM
    q_lo = tl.load(q_rows[:, None] + offs_h[None, :], mask=row_ok[:, None], other=0.0)  # [ROWS, HALF]
    q_hi = tl.load(q_rows[:, None] + HALF + offs_h[None, :], mask=row_ok[:, None], other=0.0)
    q_lo3 = tl.broadcast_to(q_lo[None, :, :], (W, ROWS, HALF))
    q_hi3 = tl.broadcast_to(q_hi[None, :, :], (W, ROWS, HALF))

    offs_w = tl.arange(0, W)
    offs_n = tl.arange(0, NW)
    acc = tl.zeros([W, ROWS, HEAD_DIM], dtype=tl.float32)
    m_i = tl.full([W, ROWS], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([W, ROWS], dtype=tl.float32)
    table = tables_ptr + seq.to(tl.int64) * stride_tbl
    ROPE_DTYPE: tl.constexpr = k_cache_ptr.dtype.element_ty
    # sub-tile w holds keys tile * TILE_N + n * W + w (interleaved: a warp's keys spread over the tile's blocks)
    sub_keys = offs_n[None, :] * W + offs_w[:, None]  # [W, NW]
    if AHEAD:
        next_blocks = tl.load(table + (tile_begin * TILE_N + sub_keys) // BLOCK_SIZE,
                              mask=tile_begin * TILE_N + sub_keys < key_end, other=0)  # fmt: skip
    for tile in range(tile_begin, tile_end):
        key = tile * TILE_N + sub_keys
        ok = (key < key_end) & (key >= vis)
        if AHEAD:
            blocks = next_blocks
            next_key = key + TILE_N
            next_blocks = tl.load(table + next_key // BLOCK_SIZE, mask=next_key < key_end, other=0)
        else:
            blocks = tl.load(table + key // BLOCK_SIZE, mask=ok, other=0)
        base = blocks.to(tl.int64) * stride_k_blk + (key % BLOCK_SIZE) * stride_k_slot + kv_head * stride_k_head
        ptrs = base[:, None, :] + offs_h[None, :, None]  # [W, HALF, NW]
        ok3 = ok[:, None, :]
        k1 = tl.load(k_cache_ptr + ptrs, mask=ok3, other=0.0).to(ROPE_DTYPE)
        k2 = tl.load(k_cache_ptr + ptrs + HALF, mask=ok3, other=0.0).to(ROPE_DTYPE)
        cs = cos_sin_ptr + key[:, None, :].to(tl.int64) * stride_cs + offs_h[None, :, None]
        cos = tl.load(cs, mask=ok3, other=0.0).to(ROPE_DTYPE)
        sin = tl.load(cs + HALF, mask=ok3, other=0.0).to(ROPE_DTYPE)
        k1r = (k1 * cos - k2 * sin).to(q_lo.dtype)
        k2r = (k2 * cos + k1 * sin).to(q_lo.dtype)
        qk = tl.dot(q_lo3, k1r)
        qk = tl.dot(q_hi3, k2r, qk)  # [W, ROWS, NW]
        qk = tl.where(ok[:, None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 2) * qk_scale)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(qk * qk_scale - m_safe[:, :, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 2)
        m_i = m_new
        v = tl.load(v_cache_ptr + base[:, :, None] + offs_d[None, None, :], mask=ok[:, :, None], other=0.0)
        acc = acc * alpha[:, :, None]
        acc = tl.dot(p.to(v.dtype), v, acc)  # [W, ROWS, HEAD_DIM]

    # -- the W running states merged once --
    m_all = tl.max(m_i, 0)  # [ROWS]
    m_ref = tl.where(m_all == float("-inf"), 0.0, m_all)
    weight = tl.math.exp2(m_i - m_ref[None, :])  # [W, ROWS]; -inf states weigh 0
    l_all = tl.sum(l_i * weight, 0)
    out = tl.sum(acc * weight[:, :, None], 0)  # [ROWS, HEAD_DIM]
    out = out / tl.where(l_all == 0.0, 1.0, l_all)[:, None]
    row = (seq.to(tl.int64) * num_heads + heads) * num_splits + split
    tl.store(partial_out_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], out, mask=row_ok[:, None])
    tl.store(partial_m_ptr + row, m_all, mask=row_ok)
    tl.store(partial_l_ptr + row, l_all, mask=row_ok)


def warp_split_decode(q, k_cache, v_cache, tables, q_positions, visible_start, cos_sin, scale, num_splits: int,
                      tile_n: int = 64, num_warps: int = 4, num_stages: int = 2,
                      ahead: bool = False) -> torch.Tensor:  # fmt: skip
    """One query token a sequence (a decode batch), keys rotated in the kernel; the op's merge after."""
    num_seqs, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    partial_out = torch.empty(num_seqs, num_heads, num_splits, head_dim, device=q.device, dtype=torch.float32)
    partial_m = torch.empty(num_seqs, num_heads, num_splits, device=q.device, dtype=torch.float32)
    partial_l = torch.empty_like(partial_m)
    _warp_split_decode_kernel[(num_kv_heads, num_splits, num_seqs)](
        partial_out, partial_m, partial_l, q, k_cache, v_cache, tables, q_positions, visible_start, cos_sin,
        scale * LOG2E, num_heads, num_splits, tables.stride(0), k_cache.stride(0), k_cache.stride(1),
        k_cache.stride(2), cos_sin.stride(0), BLOCK_SIZE=k_cache.shape[1], GROUP=num_heads // num_kv_heads,
        HEAD_DIM=head_dim, TILE_N=tile_n, W=num_warps, AHEAD=ahead, num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    out = torch.empty_like(q)
    triton_kernel.merge_splits(out, partial_out, partial_m, partial_l)
    return out


def check_on_cpu() -> None:
    """The interpreter against the reference: decodes over 37 and 200 keys, 2 splits, 64-key tiles (one partly
    past the end), and a sequence whose visible_start is not 0."""
    from ops.reference import rope_paged_attention_ref
    from ops.testing import SeqSpec, make_problem

    torch.manual_seed(0)
    specs = [SeqSpec.decode(37), SeqSpec.decode(200), SeqSpec(150, ((149, 150),), ((40, 150),))]
    p = make_problem(specs, num_heads=8, num_kv_heads=2, head_dim=32, block_size=16, seed=1)
    expected = rope_paged_attention_ref(*p.args())
    for splits, ahead, (tile_n, warps) in itertools.product((1, 2, 3), (False, True), ((64, 4), (128, 8))):
        got = warp_split_decode(p.q, p.k_cache, p.v_cache, p.block_tables, p.q_positions, p.visible_start,
                                p.cos_sin, p.scale, num_splits=splits, ahead=ahead, tile_n=tile_n,
                                num_warps=warps)  # fmt: skip
        err = (got - expected).abs().max().item()
        print(f"splits {splits}, ahead {ahead}, {tile_n}-key tiles, {warps} warps: max error {err:.2e}")
        assert err < 1e-4, err


def bench_cuda(out_dir: Path) -> None:
    from gpu_ops import Clock, sdpa_baselines
    from gpu_read_profile import HEADS, case_args

    device = torch.device("cuda")
    args = case_args("b1x8k", device)
    q, k_cache, v_cache, tables, cu, positions, kv_lens, visible, cos_sin, scale = args
    expected = triton_kernel.rope_paged_attention_triton(*args)
    clock = Clock(smoke=False)
    rows = {"device": torch.cuda.get_device_name(), "git_sha": git_sha()}
    rows["op_default_us"] = 1e3 * clock(lambda: triton_kernel.rope_paged_attention_triton(*args))
    fn, note = sdpa_baselines("decode", 1, 8192, HEADS, device)["default"]
    rows["sdpa_default_us"], rows["sdpa_note"] = 1e3 * clock(fn), note
    rows["variants"] = []
    configs = [*itertools.product((64,), (32, 64), (1, 2, 3), (False,), (4,)),
               *itertools.product((64,), (32, 64), (2, 3), (True,), (4,)),
               *itertools.product((128,), (32, 64), (1, 2), (False, True), (4,)),
               *itertools.product((128,), (32, 64), (2, 3), (True,), (8,))]  # fmt: skip
    for tile_n, splits, stages, ahead, warps in configs:
        cfg = dict(tile_n=tile_n, num_splits=splits, num_stages=stages, ahead=ahead, num_warps=warps)
        run = functools.partial(warp_split_decode, q, k_cache, v_cache, tables, positions, visible, cos_sin, scale,
                                **cfg)  # fmt: skip
        try:
            err = (run().float() - expected.float()).abs().max().item()
            rows["variants"].append(dict(cfg, us=1e3 * clock(run), max_err_vs_op=err))
        except Exception as exc:  # noqa: BLE001 -- a config may not fit
            rows["variants"].append(dict(cfg, error=f"{type(exc).__name__}: {str(exc)[:160]}"))
        print(rows["variants"][-1], flush=True)
    print(f"op {rows['op_default_us']:.2f} us, SDPA {rows['sdpa_default_us']:.2f} us")
    gpu = "h200" if "H200" in rows["device"] else "h100" if "H100" in rows["device"] else "gpu"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"decode_warps_{rows['git_sha']}_{gpu}.json").write_text(json.dumps(rows, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="the CPU interpreter against the reference")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    if args.check:
        if os.environ.get("TRITON_INTERPRET") != "1":
            raise SystemExit("--check runs under the interpreter: TRITON_INTERPRET=1")
        check_on_cpu()
    else:
        bench_cuda(args.out)


if __name__ == "__main__":
    main()
