"""Triton kernel for ``rope_paged_attention``: one launch for prefill chunks, holes, decode and mixed batches.

Design (after vLLM's unified attention and Triton tutorial 06):

* A program owns one *query tile* of one sequence and one kv head. The tile's ``BLOCK_M`` rows are
  ``BLOCK_Q`` consecutive query tokens x the ``GROUP`` query heads that share the kv head (GQA packing),
  so a decode token with 4 query heads per kv head fills 4 rows of a 16-row tile instead of 1.
* The grid has ``num_tokens // BLOCK_Q + num_seqs`` tiles (an upper bound that needs no host sync); each
  program finds its sequence by binary search over ``cu_seqlens_q`` and exits if its tile is past the end.
* It walks key tiles of ``TILE_N`` logical positions; key j is read from physical block
  ``block_tables[s, j // BLOCK_SIZE]`` (int64 address math) and, in position-free mode, rotated in
  registers at position j: the two rotary halves are loaded through offset pointers and combined with the
  cos/sin rows of the key positions in the cache dtype, which ``tl.dot`` reads.
  Online softmax in fp32 (base 2).
* Only key tiles inside ``[min visible_start, max position]`` of the query tile are visited; tiles inside
  ``[max visible_start, min position]`` are visible to every row and skip the mask.
* Prefill-like batches (many query tiles per key tile) in position-free mode first rotate every key once
  into a per-call scratch (``_rotate_keys_kernel``, one extra pass over the keys) and then run the kernel
  with keys as stored: rotating inside the kernel would redo it in every query tile (measured +33% at 16k).
* Dense path (``DENSE``, the default for 16-bit prefill-like batches on Hopper): ``_gather_kv_kernel`` copies
  every sequence's keys (rotated) and values into a contiguous per-call scratch in logical order, and
  ``_dense_attention_kernel`` walks the same tiles with one tensor-descriptor (TMA) load per key or value tile,
  no block-table lookups and no per-element address math; long prompts use 256-row tiles run as two halves that
  share each key and value tile (``Q_SPLIT``: two independent softmax chains, so one half's matmuls overlap the
  other's softmax), short ones (K and V within HEADS_FIRST_MAX_KV_BYTES) start every kv head's last query tiles
  first. Measured on the H200: 320-330 -> 480-500 TFLOP/s at 16k-32k (bench/results/gpu_ops_7bbe73e_*) with one
  128x128 tile, 520-540 with the halves (gpu_ops_{9b1563f,74061a0}_h200*).
* Split-KV (flash-decoding): with ``NUM_SPLITS > 1`` the key range of a tile is cut into NUM_SPLITS chunks
  run by separate programs that write partial (out, max, sum) to fp32 scratch; ``_reduce_splits_kernel``
  merges them. The split count is a runtime argument (one compiled kernel for all of them: a new constexpr
  value would compile for seconds in the middle of serving). Split launches put the tiles on the grid's last axis
  (``TILES_LAST``), so every program of the real tiles is dispatched before a CUDA graph's padding tiles; and a split
  with no key to read stores only its (max, sum), which the merge weighs 0 (it never uses that split's output).
* On Hopper and later the split read and the merge are launched as programmatic dependents (``use_pdl``): each may
  be scheduled while the kernel before it drains, and waits for it (``gdc_wait``) before it reads anything.
* A short read's split reads the block ids of all its keys once, before its key loop (``SPLIT_IDS``), and takes each
  tile's from registers, so no load in the loop waits on another; decode reads them a tile ahead (``TABLE_AHEAD``).
"""

from __future__ import annotations

import functools
import itertools
import math
import os

import torch
import triton
import triton.language as tl

from ops.launcher import pdl_requested

LOG2E = 1.4426950408889634
# NOTE: 256, not 512: decode 1 x 8k on the H200 took 18.2 us with 32 splits against 20.1 us with 16
# (bench/results/read_profile_efa35f5_h200.json)
MIN_KEYS_PER_SPLIT = 256
MAX_SPLITS = 32  # split-KV programs per query tile that pick_config chooses at most (a long decode: LONG_DECODE_SPLITS)
MAX_CONFIG_SPLITS = 128  # ... and that a given config may ask for (sweeps); the reduce kernel widens to fit
MAX_GRID_Z = 65535  # CUDA's limit on a grid's y and z (a TILES_LAST launch with more tiles takes them first)
# NOTE: under CUDA graphs the engine's block tables are max_model_len wide, so max_context is that, not the context
# in use: a config picked from it must serve short contexts too (bench/results/gpu_ops_ecd1644_h200*).
LONG_PREFILL_ROWS = 32768  # query rows (tokens x GROUP) per sequence from which the dense kernel takes 256-row tiles
# The dense kernel's 64x64 tiles start every kv head's last (longest) query tiles before any head's first (HEADS_FIRST)
# while a sequence's keys and values, every head's, take at most this much: the programs then share the L2 across
# heads. Measured on the H200 (gpu_ops_{d09f002_h200_exp_poly,3b4b8d2_h200_order}.json, one sequence, 8 kv heads,
# d128): 1k 0.0329 against 0.0415 ms (the last heads' long tiles no longer start last), 2k 0.0979 against 0.1058, 4k
# 0.3303 against 0.3291 (16 MB); with 64x64 tiles 8k 1.207 against 1.200, 16k 4.69 against 4.64, 32k 20.4 against 17.8.
HEADS_FIRST_MAX_KV_BYTES = 8 * 2**20
# From MID_PREFILL_ROWS query rows a sequence (4k tokens of Llama-3), while its keys and values take at most this much,
# the dense kernel takes the long prefill's 256-row halves with every kv head's longest tiles first (4k: 512 programs
# of 1-64 key tiles, ~4 waves of one program an SM: one head after another left the last heads' longest tiles for the
# end). Between it and LONG_PREFILL_ROWS with more keys and values (not measured) the 64x64 tiles stay.
MID_PREFILL_ROWS = 16384
HALVES_HEADS_FIRST_MAX_KV_BYTES = 16 * 2**20
# Query rows per sequence up to which a prefill-like batch is read as a decode is: keys rotated in the kernel (each
# sequence has one or two query tiles, so each key is rotated about once anyway) and split-KV to fill the GPU.
# A few new tokens over a long cached context (a RAG prompt whose documents hit) otherwise gets one program
# per query tile and kv head walking every key: 16 programs for 19 tokens on 8 kv heads.
SHORT_PREFILL_ROWS = 128
# split-KV programs per SM that pick_config aims at: decode reads light tiles (several programs share an SM); the
# short read at head_dim 128 runs one heavy program per SM (8 warps, 64-key tiles, 3 stages, block ids read a tile
# ahead; H200: 1 x 17 over 16k 0.0425 ms against 0.0507 with 2 per SM, gpu_short_prefill_f557ac8_h200_sweep.json)
DECODE_PROGRAMS_PER_SM = 4
SHORT_READ_PROGRAMS_PER_SM = 1
# NOTE: a bf16 decode over tables of at least LONG_DECODE_KEYS keys (the engine's CUDA graphs: max_model_len wide) may
# take up to LONG_DECODE_SPLITS splits of LONG_DECODE_MIN_KEYS keys or more. H200 (read_profile_3ef1983_s64.json, one
# sequence, 8 kv heads, 32-key tiles, 2 stages): 1 x 8k 15.66 us with 64 splits against 17.97 with 32 (cold 19.22
# against 22.81); over 576 keys in 8k-wide tables 8.05 against 7.71 (+4%, the price at short contexts). Since a
# decode launch takes 128 registers (ONE_TOKEN_SEQS; 140 before) its 512 programs of 4 warps fit one wave of 4 an SM.
LONG_DECODE_KEYS = 8192
LONG_DECODE_SPLITS = 64
LONG_DECODE_MIN_KEYS = 128
DEEP_PIPELINE_MAX_SPLITS = 4  # bf16 decode: 3 stages up to this many splits, 2 past it (short splits)
DECODE_MAX_REGS = 128  # registers a thread of an unsplit decode (4 programs of 4 warps an SM)
# NOTE: one warp a (token, head) of the merge holds every split of its 128 dims, so the sum over splits stays in its
# registers (four warps shared it through shared memory). H200 (bench/gpu_small_kernels.py, next58 at 73a5cae): the
# short read's 16 splits in the (2, 32) bucket 2.87 us against 5.14, a batch-1 decode's 32 splits 1.76 against 2.43,
# 32 decodes' 2 splits 2.02 against 4.87.
MERGE_WARPS = 1
# NOTE: past MAX_SPLITS (a batch-1 decode over 8k-wide tables: 64 splits) a warp holding every split of 128 dims would
# need 256 registers a thread; the merge then cuts each (token, head)'s dims into chunks of this many, one warp a chunk
# (4x the programs, each loading a quarter), where it took four warps a (token, head) before: measured on an H100 and
# an H200 (bench/results/read_profile_{4d17421,f31046e}_merge.json; ops/README.md has the figures)
LONG_MERGE_D_CHUNK = 32
# SPLIT_IDS: a split holds the block ids of at most this many keys in registers (the short read over 16 splits: 32k)
MAX_SPLIT_KEYS = 2048


@triton.jit
def _find_seq(cu_seqlens_q_ptr, tile_id, num_seqs, BLOCK_Q: tl.constexpr):
    """Largest s with ``cu[s] // BLOCK_Q + s <= tile_id``: the sequence that owns query tile ``tile_id``."""
    left = 0
    right = num_seqs
    while left < right:
        mid = (left + right) // 2
        first_tile = tl.load(cu_seqlens_q_ptr + mid) // BLOCK_Q + mid
        if first_tile <= tile_id:
            left = mid + 1
        else:
            right = mid
    return left - 1


@triton.jit
def _tile_tokens(cu_seqlens_q_ptr, tile_id, num_seqs, BLOCK_Q: tl.constexpr, ONE_TOKEN_SEQS: tl.constexpr):
    """(sequence, first token, one past the sequence's last token) of query tile `tile_id`; the tile is empty where
    its first token is not below the end."""
    if ONE_TOKEN_SEQS:
        # NOTE: cu_seqlens_q is strictly increasing (the op's contract), so with as many tokens as sequences
        # sequence i is token i: no search of cu_seqlens_q, whose dependent loads (seven at batch 64) each
        # program waited for before its first key
        seq = tile_id
        first_token = tile_id
        q_end = tile_id + 1
    else:
        seq = _find_seq(cu_seqlens_q_ptr, tile_id, num_seqs, BLOCK_Q)
        q_start = tl.load(cu_seqlens_q_ptr + seq)
        q_end = tl.load(cu_seqlens_q_ptr + seq + 1)
        first_token = q_start + (tile_id - (q_start // BLOCK_Q + seq)) * BLOCK_Q
    return seq, first_token, q_end


@triton.jit
def _block_ids(table_ptr, tile, key_end, BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr):
    """The physical block of each key of tile `tile` (0 past key_end): `table_ptr` is a sequence's table row."""
    offs_n = tl.arange(0, TILE_N)
    key_pos = tile * TILE_N + offs_n
    # NOTE: where tiles start on a block, a key's entry is the tile's first plus one computed once, out of the loop
    entry = tile * (TILE_N // BLOCK_SIZE) + offs_n // BLOCK_SIZE if TILE_N % BLOCK_SIZE == 0 else key_pos // BLOCK_SIZE
    return tl.load(table_ptr + entry, mask=key_pos < key_end, other=0)  # [TILE_N]


@triton.jit
def _load_keys(
    tile,
    key_end,  # keys j >= key_end are not read
    k_blocks,  # [TILE_N] the keys' physical blocks (_block_ids)
    v_blocks,  # [TILE_N] the values' physical blocks
    k_cache_ptr,  # [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_DIM]
    cos_sin_ptr,  # [max_position, ROTARY_DIM]
    kv_head,
    stride_k_blk,
    stride_k_slot,
    stride_k_head,
    stride_v_blk,
    stride_v_slot,
    stride_v_head,
    stride_cs_pos,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    ROTARY_DIM: tl.constexpr,
    HALF_PAD: tl.constexpr,
    TILE_N: tl.constexpr,
    IS_WHOLE: tl.constexpr,  # every key of the tile is < key_end (the loop's unmasked body): no bounds checks
    INT32_OFFSETS: tl.constexpr,  # every element of the caches and the cos/sin table lies < 2^31 from its base
):
    """Key tile `tile` as stored: (K^T's first rotary half, second half, cos, sin, K^T past rotary_dim, the values'
    row offsets, which keys exist); with ROTARY_DIM == 0, K^T whole in the first slot (the next four repeat it)."""
    # NOTE: keys are rotated in the cache's dtype: tl.dot reads them rounded to it anyway, and 16-bit math keeps
    # the [HALF_PAD, TILE_N] halves, cos and sin of a 128-key decode tile in registers (fp32: 255 registers and
    # spills on the H200: bench/results/ncu_fe5f6a5_h200_*.log).
    ROPE_DTYPE: tl.constexpr = k_cache_ptr.dtype.element_ty
    offs_n = tl.arange(0, TILE_N)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_h = tl.arange(0, HALF_PAD)
    key_pos = tile * TILE_N + offs_n  # [TILE_N] logical key positions
    key_ok = tl.full([TILE_N], 1, tl.int1) if IS_WHOLE else key_pos < key_end
    # -- address keys through their blocks: the block's offset in int32 where every offset fits (INT32_OFFSETS),
    #    else in int64 (num_blocks * B * heads * d may exceed 2^31); the key's offset within its block in int32 --
    # NOTE: 64-bit offsets cost the decode's key loop 38 of its 307 SASS instructions an iteration, the short read's
    # 32 of 491 (bench/ptxas_stats.py, sm_90a)
    # NOTE: where tiles start on a block, a key's slot is the same in every tile: computed once, out of the loop
    slots = offs_n % BLOCK_SIZE if TILE_N % BLOCK_SIZE == 0 else key_pos % BLOCK_SIZE
    if not INT32_OFFSETS:
        k_blocks, v_blocks, key_pos = k_blocks.to(tl.int64), v_blocks.to(tl.int64), key_pos.to(tl.int64)
    k_base = k_blocks * stride_k_blk + (slots * stride_k_slot + kv_head * stride_k_head)  # [TILE_N]
    v_base = v_blocks * stride_v_blk + (slots * stride_v_slot + kv_head * stride_v_head)  # [TILE_N]
    if ROTARY_DIM > 0:
        HALF: tl.constexpr = ROTARY_DIM // 2
        half_ok = key_ok[None, :] & (offs_h[:, None] < HALF)  # [HALF_PAD, TILE_N]
        k_ptrs = k_cache_ptr + k_base[None, :] + offs_h[:, None]  # K^T, first rotary half
        k1 = tl.load(k_ptrs, mask=half_ok, other=0.0).to(ROPE_DTYPE)  # [HALF_PAD, TILE_N]
        k2 = tl.load(k_ptrs + HALF, mask=half_ok, other=0.0).to(ROPE_DTYPE)  # [HALF_PAD, TILE_N]
        cs_ptrs = cos_sin_ptr + key_pos[None, :] * stride_cs_pos + offs_h[:, None]
        cos = tl.load(cs_ptrs, mask=half_ok, other=0.0).to(ROPE_DTYPE)  # [HALF_PAD, TILE_N]
        sin = tl.load(cs_ptrs + HALF, mask=half_ok, other=0.0).to(ROPE_DTYPE)  # [HALF_PAD, TILE_N]
        k_pass = k1
        if ROTARY_DIM < HEAD_DIM:  # dims past rotary_dim pass through unrotated
            pass_ok = key_ok[None, :] & (offs_d[:, None] >= ROTARY_DIM)
            k_pass = tl.load(k_cache_ptr + k_base[None, :] + offs_d[:, None], mask=pass_ok, other=0.0)
        return k1, k2, cos, sin, k_pass, v_base, key_ok
    else:
        k = tl.load(k_cache_ptr + k_base[None, :] + offs_d[:, None], mask=key_ok[None, :], other=0.0)
        return k, k, k, k, k, v_base, key_ok  # [HEAD_DIM, TILE_N] K^T


@triton.jit
def _load_values(v_cache_ptr, v_base, key_ok, HEAD_DIM: tl.constexpr):
    offs_d = tl.arange(0, HEAD_DIM)
    return tl.load(
        v_cache_ptr + v_base[:, None] + offs_d[None, :], mask=key_ok[:, None], other=0.0
    )  # [TILE_N, HEAD_DIM]


@triton.jit
def _scores(
    q_lo,  # [BLOCK_M, HALF_PAD] (rotary mode) or [BLOCK_M, HEAD_DIM]
    q_hi,  # [BLOCK_M, HALF_PAD] (rotary mode only)
    q_pass,  # [BLOCK_M, HEAD_DIM] dims >= ROTARY_DIM (only when ROTARY_DIM < HEAD_DIM)
    k1,  # the keys as _load_keys returns them
    k2,
    cos,
    sin,
    k_pass,
    row_pos,  # [BLOCK_M] query positions
    row_vis,  # [BLOCK_M] visible_start
    tile,
    HEAD_DIM: tl.constexpr,
    ROTARY_DIM: tl.constexpr,
    TILE_N: tl.constexpr,
    APPLY_MASK: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Unscaled (and masked) scores of the query tile against key tile `tile`, keys rotated at their positions
    (_online_softmax scales them)."""
    # -- compute qk --
    if ROTARY_DIM > 0:
        k1_rot = (k1 * cos - k2 * sin).to(q_lo.dtype)
        k2_rot = (k2 * cos + k1 * sin).to(q_lo.dtype)
        qk = tl.dot(q_lo, k1_rot, input_precision=DOT_PRECISION)
        qk = tl.dot(q_hi, k2_rot, qk, input_precision=DOT_PRECISION)  # [BLOCK_M, TILE_N]
        if ROTARY_DIM < HEAD_DIM:
            qk = tl.dot(q_pass, k_pass, qk, input_precision=DOT_PRECISION)
    else:
        qk = tl.dot(q_lo, k1, input_precision=DOT_PRECISION)  # [BLOCK_M, TILE_N]
    if APPLY_MASK:
        key_pos = tile * TILE_N + tl.arange(0, TILE_N)
        visible = (key_pos[None, :] >= row_vis[:, None]) & (key_pos[None, :] <= row_pos[:, None])
        qk = tl.where(visible, qk, float("-inf"))
    return qk


@triton.jit
def _online_softmax(qk, m_i, l_i, qk_scale):
    """(p, alpha, m, l) of unscaled scores `qk` and qk_scale > 0: base 2, m scaled; rows with nothing visible yet
    keep m = -inf and contribute 0."""
    # NOTE: the row max taken before scaling (the scale is positive), so the scale and the max's subtraction are
    # one fused multiply-add per score: 32 fewer instructions a thread in the short read's 64-key tile
    m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.math.exp2(qk * qk_scale - m_safe[:, None])  # [BLOCK_M, TILE_N]
    alpha = tl.math.exp2(m_i - m_safe)  # [BLOCK_M]
    return p, alpha, m_new, l_i * alpha + tl.sum(p, 1)


@triton.jit
def _attend_key_tiles(
    acc,
    m_i,
    l_i,
    q_lo,  # [BLOCK_M, HALF_PAD] (rotary mode) or [BLOCK_M, HEAD_DIM]
    q_hi,  # [BLOCK_M, HALF_PAD] (rotary mode only)
    q_pass,  # [BLOCK_M, HEAD_DIM] dims >= ROTARY_DIM (only when ROTARY_DIM < HEAD_DIM)
    row_pos,  # [BLOCK_M] query positions
    row_vis,  # [BLOCK_M] visible_start
    tile_begin,
    tile_end,
    key_end,  # keys j >= key_end are never read
    k_cache_ptr,  # [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_DIM]
    v_cache_ptr,  # [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_DIM]
    k_table_ptr,  # [max_blocks] this sequence's row of the key block table
    v_table_ptr,  # [max_blocks] this sequence's row of the value block table
    k_split_ids,  # [SPLIT_IDS] the split's key blocks from its first tile on (SPLIT_IDS > 0)
    v_split_ids,  # [SPLIT_IDS] its value blocks
    split_tile,  # the split's first tile
    cos_sin_ptr,  # [max_position, ROTARY_DIM]
    kv_head,
    qk_scale,
    stride_k_blk,
    stride_k_slot,
    stride_k_head,
    stride_v_blk,
    stride_v_slot,
    stride_v_head,
    stride_cs_pos,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    ROTARY_DIM: tl.constexpr,
    HALF_PAD: tl.constexpr,
    TILE_N: tl.constexpr,
    APPLY_MASK: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    TABLE_AHEAD: tl.constexpr,
    INT32_OFFSETS: tl.constexpr,
    SPLIT_IDS: tl.constexpr,
):
    """Key tiles [tile_begin, tile_end) into the running (acc, m, l).

    NOTE: with TABLE_AHEAD the next tile's block ids are read an iteration ahead, and Triton's pipelining
    (num_stages) then keeps that tile's copies in flight through this tile's math (`async_wait {num = 5}` at
    num_stages=3, 10 at 4). Without it the copies depend on a block-table load issued after this tile's math, and
    every iteration waits for all of them at its top (`async_wait {num = 0}` at any num_stages; with contiguous keys,
    2-10): no memory overlaps the math (bench/ptxas_stats.py's compile, its ttgir)."""
    if TABLE_AHEAD and SPLIT_IDS == 0:
        k_ids = _block_ids(k_table_ptr, tile_begin, key_end, BLOCK_SIZE, TILE_N)
        v_ids = _block_ids(v_table_ptr, tile_begin, key_end, BLOCK_SIZE, TILE_N)
    for tile in range(tile_begin, tile_end):
        if SPLIT_IDS > 0:  # the split's blocks, in registers since before the loop: no load waits on another
            entry = (tile - split_tile) * (TILE_N // BLOCK_SIZE) + tl.arange(0, TILE_N) // BLOCK_SIZE
            entry = tl.minimum(entry, SPLIT_IDS - 1)  # NOTE: the launcher sizes SPLIT_IDS to a split's tiles
            k_blocks = tl.gather(k_split_ids, entry, 0)
            v_blocks = tl.gather(v_split_ids, entry, 0)
        elif TABLE_AHEAD:  # this tile's blocks were read an iteration ago; read the next tile's now
            k_blocks, v_blocks = k_ids, v_ids
            k_ids = _block_ids(k_table_ptr, tile + 1, key_end, BLOCK_SIZE, TILE_N)
            v_ids = _block_ids(v_table_ptr, tile + 1, key_end, BLOCK_SIZE, TILE_N)
        else:
            k_blocks = _block_ids(k_table_ptr, tile, key_end, BLOCK_SIZE, TILE_N)
            v_blocks = _block_ids(v_table_ptr, tile, key_end, BLOCK_SIZE, TILE_N)
        k1, k2, cos, sin, k_pass, v_base, key_ok = _load_keys(
            tile, key_end, k_blocks, v_blocks, k_cache_ptr, cos_sin_ptr, kv_head, stride_k_blk, stride_k_slot,
            stride_k_head, stride_v_blk, stride_v_slot, stride_v_head, stride_cs_pos, BLOCK_SIZE, HEAD_DIM,
            ROTARY_DIM, HALF_PAD, TILE_N, not APPLY_MASK, INT32_OFFSETS,
        )  # fmt: skip
        qk = _scores(q_lo, q_hi, q_pass, k1, k2, cos, sin, k_pass, row_pos, row_vis, tile, HEAD_DIM, ROTARY_DIM,
                     TILE_N, APPLY_MASK, DOT_PRECISION)  # fmt: skip
        p, alpha, m_i, l_i = _online_softmax(qk, m_i, l_i, qk_scale)
        # -- compute pv --
        v = _load_values(v_cache_ptr, v_base, key_ok, HEAD_DIM)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)  # [BLOCK_M, HEAD_DIM]
    return acc, m_i, l_i


@triton.jit
def _part_range(part: tl.constexpr, tile_begin, body_begin, body_end, tile_end):
    """Key tiles [lo, hi) of a tile loop's part: 0 the masked head, 1 the unmasked body, 2 the masked tail."""
    if part == 0:
        return tile_begin, body_begin
    elif part == 1:
        return body_begin, body_end
    else:
        return body_end, tile_end


# NOTE: Triton compiles a kernel again for every constexpr value and for integer arguments equal to 1 or divisible
# by 16. Counts and widths that change from step to step are left unspecialized: a compile takes seconds, and an
# eager step with a new batch shape would otherwise pay it in the middle of serving.
@triton.jit(do_not_specialize=["num_seqs", "num_splits", "stride_kbt_seq", "stride_vbt_seq"])
def _rope_paged_attention_kernel(
    out_ptr,  # [num_tokens, num_heads, HEAD_DIM]
    q_ptr,  # [num_tokens, num_heads, HEAD_DIM]
    k_cache_ptr,  # [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_DIM]
    v_cache_ptr,  # [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_DIM]
    k_block_tables_ptr,  # [num_seqs, max_blocks] (an identity table over the scratch when pre-rotated)
    v_block_tables_ptr,  # [num_seqs, max_blocks]
    cu_seqlens_q_ptr,  # [num_seqs + 1]
    q_positions_ptr,  # [num_tokens]
    visible_start_ptr,  # [num_tokens]
    cos_sin_ptr,  # [max_position, ROTARY_DIM] (unused when ROTARY_DIM == 0)
    partial_out_ptr,  # [num_tokens, num_heads, num_splits, HEAD_DIM] fp32 (SPLIT_KV only)
    partial_m_ptr,  # [num_tokens, num_heads, num_splits] fp32
    partial_l_ptr,  # [num_tokens, num_heads, num_splits] fp32
    qk_scale,  # softmax scale * log2(e)
    num_seqs,
    num_heads,
    num_splits,  # programs along the key range of a tile (grid axis 2)
    stride_q_tok,
    stride_q_head,
    stride_o_tok,
    stride_o_head,
    stride_k_blk,
    stride_k_slot,
    stride_k_head,
    stride_v_blk,
    stride_v_slot,
    stride_v_head,
    stride_kbt_seq,
    stride_vbt_seq,
    stride_cs_pos,
    BLOCK_SIZE: tl.constexpr,
    GROUP: tl.constexpr,  # query heads per kv head
    HEAD_DIM: tl.constexpr,
    ROTARY_DIM: tl.constexpr,  # 0: keys used as stored
    HALF_PAD: tl.constexpr,  # next power of two >= max(ROTARY_DIM // 2, 16)
    BLOCK_M: tl.constexpr,  # rows per tile = BLOCK_Q tokens x GROUP heads (padded)
    BLOCK_Q: tl.constexpr,
    TILE_N: tl.constexpr,
    SPLIT_KV: tl.constexpr,  # num_splits > 1: write partial (out, max, sum) for _reduce_splits_kernel
    TILES_LAST: tl.constexpr,  # grid (kv heads, splits, tiles) instead of (tiles, kv heads, splits)
    DOT_PRECISION: tl.constexpr,
    TABLE_AHEAD: tl.constexpr = False,  # the next key tile's block ids read an iteration ahead
    SPLIT_IDS: tl.constexpr = 0,  # > 0: a split's block ids (this many table entries) read once, before its loop
    ONE_TOKEN_SEQS: tl.constexpr = False,  # every sequence has one query token (a decode): tile i is sequence i
    INT32_OFFSETS: tl.constexpr = False,  # key, value and cos/sin offsets in int32 (`offsets_fit_int32`)
    PDL: tl.constexpr = False,  # launched as a programmatic dependent (`use_pdl`): wait for the kernel before it
):
    if PDL:
        tl.extra.cuda.gdc_wait()  # NOTE: before any load: every input may come from the kernel before
    if TILES_LAST:
        # NOTE: every program of a tile is dispatched before any of the next tile's, so the real tiles start at
        # once and a CUDA-graph bucket's padding sequence (after them) cannot delay them: (tiles, heads, splits)
        # dispatched the 17-token short read between its padding and empty tiles, 67 us against 52 us without
        # them (bench/results/engine_read_35e9033_h200.json).
        tile_id = tl.program_id(2)
        kv_head = tl.program_id(0)
        split = tl.program_id(1)
    else:
        # NOTE: tiles are taken in reverse so the last tiles of a causal prefill (the most keys) start first.
        tile_id = tl.num_programs(0) - 1 - tl.program_id(0)
        kv_head = tl.program_id(1)
        split = tl.program_id(2)
    seq, first_token, q_end = _tile_tokens(cu_seqlens_q_ptr, tile_id, num_seqs, BLOCK_Q, ONE_TOKEN_SEQS)
    if first_token >= q_end:
        return

    # -- rows: (token, head) pairs of this tile --
    offs_m = tl.arange(0, BLOCK_M)
    tokens = first_token + offs_m // GROUP  # [BLOCK_M]
    heads = kv_head * GROUP + offs_m % GROUP  # [BLOCK_M]
    row_ok = (offs_m < BLOCK_Q * GROUP) & (tokens < q_end)
    row_pos = tl.load(q_positions_ptr + tokens, mask=row_ok, other=0).to(tl.int32)
    row_vis = tl.load(visible_start_ptr + tokens, mask=row_ok, other=0).to(tl.int32)
    big = 2147483647
    key_begin = tl.min(tl.where(row_ok, row_vis, big))  # first key any row sees
    key_end = tl.max(tl.where(row_ok, row_pos, -1)) + 1  # one past the last key any row sees
    full_begin = tl.max(tl.where(row_ok, row_vis, 0))  # keys in [full_begin, full_end) are seen by all rows
    full_end = tl.min(tl.where(row_ok, row_pos, big)) + 1

    # -- load the query tile (already rotated by the caller); issued before the split's range is known, so that
    #    its latency overlaps the range's arithmetic (an empty split loads it for nothing) --
    offs_d = tl.arange(0, HEAD_DIM)
    q_rows = q_ptr + tokens.to(tl.int64)[:, None] * stride_q_tok + heads[:, None] * stride_q_head
    if ROTARY_DIM > 0:
        HALF: tl.constexpr = ROTARY_DIM // 2
        offs_h = tl.arange(0, HALF_PAD)
        half_ok = row_ok[:, None] & (offs_h[None, :] < HALF)
        q_lo = tl.load(q_rows + offs_h[None, :], mask=half_ok, other=0.0)  # [BLOCK_M, HALF_PAD]
        q_hi = tl.load(q_rows + HALF + offs_h[None, :], mask=half_ok, other=0.0)  # [BLOCK_M, HALF_PAD]
        pass_ok = row_ok[:, None] & (offs_d[None, :] >= ROTARY_DIM)
        q_pass = tl.load(q_rows + offs_d[None, :], mask=pass_ok, other=0.0)  # [BLOCK_M, HEAD_DIM]
    else:
        q_lo = tl.load(q_rows + offs_d[None, :], mask=row_ok[:, None], other=0.0)  # [BLOCK_M, HEAD_DIM]
        q_hi = q_lo
        q_pass = q_lo

    # -- this program's key tiles: [tile_begin, tile_end), cut into a masked head, an unmasked body and a
    #    masked tail --
    tile_begin = key_begin // TILE_N
    tile_end = tl.cdiv(key_end, TILE_N)
    if SPLIT_KV:
        tiles_per_split = tl.cdiv(tile_end - tile_begin, num_splits)
        tile_begin = tile_begin + split * tiles_per_split
        tile_end = tl.minimum(tile_end, tile_begin + tiles_per_split)
        tile_end = tl.maximum(tile_end, tile_begin)
        if tile_end == tile_begin:  # no key to read: (max, sum) = (-inf, 0), which the merge weighs 0
            row = (tokens.to(tl.int64) * num_heads + heads) * num_splits + split  # [BLOCK_M]
            tl.store(partial_m_ptr + row, tl.full([BLOCK_M], float("-inf"), tl.float32), mask=row_ok)
            tl.store(partial_l_ptr + row, tl.zeros([BLOCK_M], tl.float32), mask=row_ok)
            return
    body_begin = tl.minimum(tl.maximum(tl.cdiv(full_begin, TILE_N), tile_begin), tile_end)
    body_end = tl.maximum(tl.minimum(full_end // TILE_N, tile_end), body_begin)

    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    k_table_ptr = k_block_tables_ptr + seq.to(tl.int64) * stride_kbt_seq
    v_table_ptr = v_block_tables_ptr + seq.to(tl.int64) * stride_vbt_seq
    if SPLIT_IDS > 0:
        entries = tile_begin * (TILE_N // BLOCK_SIZE) + tl.arange(0, SPLIT_IDS)
        entry_ok = entries < tl.cdiv(key_end, BLOCK_SIZE)
        k_split_ids = tl.load(k_table_ptr + entries, mask=entry_ok, other=0)
        v_split_ids = tl.load(v_table_ptr + entries, mask=entry_ok, other=0)
    else:  # unused: the ids are read tile by tile
        k_split_ids = tile_begin
        v_split_ids = tile_begin
    for part in tl.static_range(3):
        lo, hi = _part_range(part, tile_begin, body_begin, body_end, tile_end)
        acc, m_i, l_i = _attend_key_tiles(
            acc, m_i, l_i, q_lo, q_hi, q_pass, row_pos, row_vis, lo, hi, key_end,
            k_cache_ptr, v_cache_ptr, k_table_ptr, v_table_ptr, k_split_ids, v_split_ids, tile_begin, cos_sin_ptr,
            kv_head, qk_scale, stride_k_blk, stride_k_slot, stride_k_head, stride_v_blk, stride_v_slot, stride_v_head,
            stride_cs_pos, BLOCK_SIZE, HEAD_DIM, ROTARY_DIM, HALF_PAD, TILE_N,
            part != 1, DOT_PRECISION, TABLE_AHEAD, INT32_OFFSETS, SPLIT_IDS,
        )  # fmt: skip

    # -- epilogue --
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc / l_safe[:, None]  # [BLOCK_M, HEAD_DIM]
    if not SPLIT_KV:
        o_ptrs = out_ptr + tokens.to(tl.int64)[:, None] * stride_o_tok + heads[:, None] * stride_o_head
        tl.store(o_ptrs + offs_d[None, :], out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
    else:
        row = (tokens.to(tl.int64) * num_heads + heads) * num_splits + split  # [BLOCK_M]
        tl.store(partial_out_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], out, mask=row_ok[:, None])
        tl.store(partial_m_ptr + row, m_i, mask=row_ok)
        tl.store(partial_l_ptr + row, l_i, mask=row_ok)


@triton.jit(do_not_specialize=["max_blocks", "stride_bt_seq"])
def _gather_kv_kernel(
    k_out_ptr,  # [num_seqs * max_blocks, BLOCK_SIZE, num_kv_heads, HEAD_DIM] contiguous
    v_out_ptr,  # [num_seqs * max_blocks, BLOCK_SIZE, num_kv_heads, HEAD_DIM] contiguous (GATHER_V only)
    k_cache_ptr,  # [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_DIM]
    v_cache_ptr,  # [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_DIM] (GATHER_V only)
    block_tables_ptr,  # [num_seqs, max_blocks]
    kv_lens_ptr,  # [num_seqs]
    cos_sin_ptr,  # [max_position, ROTARY_DIM] (ROTARY_DIM > 0 only)
    max_blocks,
    stride_k_blk,
    stride_k_slot,
    stride_k_head,
    stride_v_blk,
    stride_v_slot,
    stride_v_head,
    stride_bt_seq,
    stride_cs_pos,
    BLOCK_SIZE: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    ROTARY_DIM: tl.constexpr,  # 0: keys are copied as stored
    HALF_PAD: tl.constexpr,
    ROWS_PAD: tl.constexpr,  # next power of two >= BLOCK_SIZE * NUM_KV_HEADS
    GATHER_V: tl.constexpr,
):
    """Copy logical block i of sequence s into scratch block s * max_blocks + i (keys rotated at their positions)."""
    logical_block = tl.program_id(0)
    seq = tl.program_id(1)
    if logical_block * BLOCK_SIZE >= tl.load(kv_lens_ptr + seq):
        return
    block_id = tl.load(block_tables_ptr + seq.to(tl.int64) * stride_bt_seq + logical_block).to(tl.int64)
    offs_r = tl.arange(0, ROWS_PAD)  # rows: (slot, kv head) pairs of the block
    slots = offs_r // NUM_KV_HEADS
    heads = offs_r % NUM_KV_HEADS
    row_ok = offs_r < BLOCK_SIZE * NUM_KV_HEADS
    src = k_cache_ptr + block_id * stride_k_blk + slots * stride_k_slot + heads * stride_k_head  # [ROWS_PAD]
    dst_offset = (seq.to(tl.int64) * max_blocks + logical_block) * (BLOCK_SIZE * NUM_KV_HEADS * HEAD_DIM)
    dst_offset = dst_offset + offs_r * HEAD_DIM  # [ROWS_PAD]
    dst = k_out_ptr + dst_offset
    offs_d = tl.arange(0, HEAD_DIM)
    if ROTARY_DIM > 0:
        HALF: tl.constexpr = ROTARY_DIM // 2
        offs_h = tl.arange(0, HALF_PAD)
        half_ok = row_ok[:, None] & (offs_h[None, :] < HALF)
        x1 = tl.load(src[:, None] + offs_h[None, :], mask=half_ok, other=0.0)  # [ROWS_PAD, HALF_PAD]
        x2 = tl.load(src[:, None] + HALF + offs_h[None, :], mask=half_ok, other=0.0)
        position = (logical_block * BLOCK_SIZE + slots).to(tl.int64)
        cs = cos_sin_ptr + position[:, None] * stride_cs_pos + offs_h[None, :]
        cos = tl.load(cs, mask=half_ok, other=0.0).to(tl.float32)
        sin = tl.load(cs + HALF, mask=half_ok, other=0.0).to(tl.float32)
        x1f, x2f = x1.to(tl.float32), x2.to(tl.float32)
        tl.store(dst[:, None] + offs_h[None, :], (x1f * cos - x2f * sin).to(x1.dtype), mask=half_ok)
        tl.store(dst[:, None] + HALF + offs_h[None, :], (x2f * cos + x1f * sin).to(x1.dtype), mask=half_ok)
        if ROTARY_DIM < HEAD_DIM:  # dims past rotary_dim are copied unrotated
            pass_ok = row_ok[:, None] & (offs_d[None, :] >= ROTARY_DIM)
            x = tl.load(src[:, None] + offs_d[None, :], mask=pass_ok, other=0.0)
            tl.store(dst[:, None] + offs_d[None, :], x, mask=pass_ok)
    else:
        x = tl.load(src[:, None] + offs_d[None, :], mask=row_ok[:, None], other=0.0)  # [ROWS_PAD, HEAD_DIM]
        tl.store(dst[:, None] + offs_d[None, :], x, mask=row_ok[:, None])
    if GATHER_V:
        v_src = v_cache_ptr + block_id * stride_v_blk + slots * stride_v_slot + heads * stride_v_head
        v = tl.load(v_src[:, None] + offs_d[None, :], mask=row_ok[:, None], other=0.0)  # [ROWS_PAD, HEAD_DIM]
        tl.store(v_out_ptr + dst_offset[:, None] + offs_d[None, :], v, mask=row_ok[:, None])


@triton.jit
def _dense_softmax(m_i, l_i, q, k, key_pos, row_pos, row_vis, qk_scale, APPLY_MASK: tl.constexpr):
    """A key tile's probabilities for a block of query rows and the online softmax's new (m, l) and rescale."""
    # -- compute qk --
    qk = tl.dot(q, k.T)  # [ROWS, TILE_N]
    if APPLY_MASK:
        visible = (key_pos[None, :] >= row_vis[:, None]) & (key_pos[None, :] <= row_pos[:, None])
        qk = tl.where(visible, qk * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing visible yet
        p = tl.math.exp2(qk - m_safe[:, None])
    else:  # every key visible to every row: m_new is finite
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        m_safe = m_new
        p = tl.math.exp2(qk * qk_scale - m_new[:, None])  # [ROWS, TILE_N]
    alpha = tl.math.exp2(m_i - m_safe)  # [ROWS]
    l_i = l_i * alpha + tl.sum(p, 1)
    return p, alpha, m_new, l_i


@triton.jit
def _dense_pv(acc, p, alpha, v):
    # -- compute pv --
    acc = acc * alpha[:, None]
    return tl.dot(p.to(v.dtype), v, acc)  # [ROWS, HEAD_DIM]


@triton.jit
def _dense_values(v_desc, row, kv_col, key_pos, key_end, APPLY_MASK: tl.constexpr):
    v = v_desc.load([row, kv_col])  # [TILE_N, HEAD_DIM]
    if APPLY_MASK:  # NOTE: rows past key_end are another sequence's or never written (NaN * 0 = NaN)
        v = tl.where((key_pos < key_end)[:, None], v, 0.0)
    return v


@triton.jit
def _attend_dense_tiles(
    acc,
    m_i,
    l_i,
    q,  # [BLOCK_M, HEAD_DIM]
    row_pos,  # [BLOCK_M] query positions
    row_vis,  # [BLOCK_M] visible_start
    tile_begin,
    tile_end,
    key_end,  # keys j >= key_end are not this sequence's (the scratch row may hold anything)
    k_desc,  # tensor descriptor over [num_seqs * max_context, num_kv_heads * HEAD_DIM], block [TILE_N, HEAD_DIM]
    v_desc,  # the same over the values
    kv_row0,  # first scratch row of this sequence
    kv_col,  # first column of this kv head
    qk_scale,  # > 0 (the unmasked branch takes the row max before scaling)
    TILE_N: tl.constexpr,
    APPLY_MASK: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
):
    offs_n = tl.arange(0, TILE_N)
    for tile in tl.range(tile_begin, tile_end, num_stages=NUM_STAGES, warp_specialize=WARP_SPECIALIZE):
        row = kv_row0 + tile * TILE_N
        key_pos = tile * TILE_N + offs_n
        k = k_desc.load([row, kv_col])  # [TILE_N, HEAD_DIM] (TMA on Hopper)
        p, alpha, m_i, l_i = _dense_softmax(m_i, l_i, q, k, key_pos, row_pos, row_vis, qk_scale, APPLY_MASK)
        v = _dense_values(v_desc, row, kv_col, key_pos, key_end, APPLY_MASK)
        acc = _dense_pv(acc, p, alpha, v)
    return acc, m_i, l_i


@triton.jit
def _attend_dense_tiles_halves(
    acc0, m0, l0, q0, row_pos0, row_vis0,  # the tile's first half of rows
    acc1, m1, l1, q1, row_pos1, row_vis1,  # ... and its second half
    tile_begin, tile_end, key_end, k_desc, v_desc, kv_row0, kv_col, qk_scale,
    TILE_N: tl.constexpr,
    APPLY_MASK: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
):  # fmt: skip
    """`_attend_dense_tiles` for two halves of a query tile that share each key and value tile (Q_SPLIT = 2):
    two independent softmax chains in one loop, so that one half's matmuls can run while the other half's
    softmax does (the data partitioning of Triton's Hopper/Blackwell attention kernels)."""
    offs_n = tl.arange(0, TILE_N)
    for tile in tl.range(tile_begin, tile_end, num_stages=NUM_STAGES, warp_specialize=WARP_SPECIALIZE):
        row = kv_row0 + tile * TILE_N
        key_pos = tile * TILE_N + offs_n
        k = k_desc.load([row, kv_col])  # [TILE_N, HEAD_DIM]
        v = _dense_values(v_desc, row, kv_col, key_pos, key_end, APPLY_MASK)
        p0, alpha0, m0, l0 = _dense_softmax(m0, l0, q0, k, key_pos, row_pos0, row_vis0, qk_scale, APPLY_MASK)
        acc0 = _dense_pv(acc0, p0, alpha0, v)
        p1, alpha1, m1, l1 = _dense_softmax(m1, l1, q1, k, key_pos, row_pos1, row_vis1, qk_scale, APPLY_MASK)
        acc1 = _dense_pv(acc1, p1, alpha1, v)
    return acc0, m0, l0, acc1, m1, l1


@triton.jit
def _dense_rows(q_ptr, offs_m, first_token, q_end, kv_head, stride_q_tok, stride_q_head, GROUP: tl.constexpr,
                BLOCK_Q: tl.constexpr, HEAD_DIM: tl.constexpr, q_positions_ptr, visible_start_ptr):  # fmt: skip
    """A query tile's rows offs_m (token, head pairs): tokens, heads, which are real, positions, visible starts, q."""
    tokens = first_token + offs_m // GROUP
    heads = kv_head * GROUP + offs_m % GROUP
    row_ok = (offs_m < BLOCK_Q * GROUP) & (tokens < q_end)
    row_pos = tl.load(q_positions_ptr + tokens, mask=row_ok, other=0).to(tl.int32)
    row_vis = tl.load(visible_start_ptr + tokens, mask=row_ok, other=0).to(tl.int32)
    offs_d = tl.arange(0, HEAD_DIM)
    q_rows = q_ptr + tokens.to(tl.int64)[:, None] * stride_q_tok + heads[:, None] * stride_q_head
    q = tl.load(q_rows + offs_d[None, :], mask=row_ok[:, None], other=0.0)  # [rows, HEAD_DIM]
    return tokens, heads, row_ok, row_pos, row_vis, q


@triton.jit
def _store_rows(out_ptr, acc, l_i, tokens, heads, row_ok, stride_o_tok, stride_o_head, HEAD_DIM: tl.constexpr):
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc / l_safe[:, None]
    offs_d = tl.arange(0, HEAD_DIM)
    o_ptrs = out_ptr + tokens.to(tl.int64)[:, None] * stride_o_tok + heads[:, None] * stride_o_head
    tl.store(o_ptrs + offs_d[None, :], out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


@triton.jit(do_not_specialize=["num_seqs", "max_context"])
def _dense_attention_kernel(
    out_ptr,  # [num_tokens, num_heads, HEAD_DIM]
    q_ptr,  # [num_tokens, num_heads, HEAD_DIM]
    k_desc,  # over the gathered keys [num_seqs * max_context, num_kv_heads * HEAD_DIM]
    v_desc,  # over the gathered values, same layout
    cu_seqlens_q_ptr,  # [num_seqs + 1]
    q_positions_ptr,  # [num_tokens]
    visible_start_ptr,  # [num_tokens]
    qk_scale,  # softmax scale * log2(e), > 0
    num_seqs,
    max_context,  # scratch rows per sequence
    stride_q_tok,
    stride_q_head,
    stride_o_tok,
    stride_o_head,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    TILE_N: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
    HEADS_FIRST: tl.constexpr,  # kv heads on the grid's first axis: every head's last tiles start before any first
    Q_SPLIT: tl.constexpr = 1,  # 2: the tile's rows as two halves with a softmax chain each (data partitioning)
):
    """The same tiles as ``_rope_paged_attention_kernel``, over keys and values gathered into a contiguous
    per-sequence scratch (``gather_to_scratch``), so each key tile is one tensor-descriptor load (TMA)."""
    if HEADS_FIRST:
        tile_id = tl.num_programs(1) - 1 - tl.program_id(1)
        kv_head = tl.program_id(0)
    else:
        tile_id = tl.num_programs(0) - 1 - tl.program_id(0)  # the last tiles of a causal prefill start first
        kv_head = tl.program_id(1)
    seq, first_token, q_end = _tile_tokens(cu_seqlens_q_ptr, tile_id, num_seqs, BLOCK_Q, False)
    if first_token >= q_end:
        return

    # -- rows: (token, head) pairs of this tile, in Q_SPLIT halves --
    ROWS: tl.constexpr = BLOCK_M // Q_SPLIT
    offs_m = tl.arange(0, ROWS)
    tokens, heads, row_ok, row_pos, row_vis, q = _dense_rows(
        q_ptr, offs_m, first_token, q_end, kv_head, stride_q_tok, stride_q_head, GROUP, BLOCK_Q, HEAD_DIM,
        q_positions_ptr, visible_start_ptr,
    )  # fmt: skip
    big = 2147483647
    key_begin = tl.min(tl.where(row_ok, row_vis, big))
    key_end = tl.max(tl.where(row_ok, row_pos, -1)) + 1
    full_begin = tl.max(tl.where(row_ok, row_vis, 0))
    full_end = tl.min(tl.where(row_ok, row_pos, big)) + 1
    if Q_SPLIT == 2:
        tokens1, heads1, row_ok1, row_pos1, row_vis1, q1 = _dense_rows(
            q_ptr, ROWS + offs_m, first_token, q_end, kv_head, stride_q_tok, stride_q_head, GROUP, BLOCK_Q,
            HEAD_DIM, q_positions_ptr, visible_start_ptr,
        )  # fmt: skip
        key_begin = tl.minimum(key_begin, tl.min(tl.where(row_ok1, row_vis1, big)))
        key_end = tl.maximum(key_end, tl.max(tl.where(row_ok1, row_pos1, -1)) + 1)
        full_begin = tl.maximum(full_begin, tl.max(tl.where(row_ok1, row_vis1, 0)))
        full_end = tl.minimum(full_end, tl.min(tl.where(row_ok1, row_pos1, big)) + 1)

    # -- key tiles: a masked head, an unmasked body, a masked tail --
    tile_begin = key_begin // TILE_N
    tile_end = tl.cdiv(key_end, TILE_N)
    body_begin = tl.minimum(tl.maximum(tl.cdiv(full_begin, TILE_N), tile_begin), tile_end)
    body_end = tl.maximum(tl.minimum(full_end // TILE_N, tile_end), body_begin)
    kv_row0 = seq * max_context
    kv_col = kv_head * HEAD_DIM
    acc = tl.zeros([ROWS, HEAD_DIM], dtype=tl.float32)
    m_i = tl.full([ROWS], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([ROWS], dtype=tl.float32)
    if Q_SPLIT == 1:
        for part in tl.static_range(3):
            lo, hi = _part_range(part, tile_begin, body_begin, body_end, tile_end)
            acc, m_i, l_i = _attend_dense_tiles(
                acc, m_i, l_i, q, row_pos, row_vis, lo, hi, key_end, k_desc, v_desc, kv_row0, kv_col, qk_scale,
                TILE_N, part != 1, NUM_STAGES, WARP_SPECIALIZE,
            )  # fmt: skip
    else:
        acc1 = tl.zeros([ROWS, HEAD_DIM], dtype=tl.float32)
        m_i1 = tl.full([ROWS], float("-inf"), dtype=tl.float32)
        l_i1 = tl.zeros([ROWS], dtype=tl.float32)
        for part in tl.static_range(3):
            lo, hi = _part_range(part, tile_begin, body_begin, body_end, tile_end)
            acc, m_i, l_i, acc1, m_i1, l_i1 = _attend_dense_tiles_halves(
                acc, m_i, l_i, q, row_pos, row_vis, acc1, m_i1, l_i1, q1, row_pos1, row_vis1,
                lo, hi, key_end, k_desc, v_desc, kv_row0, kv_col, qk_scale, TILE_N, part != 1, NUM_STAGES,
                WARP_SPECIALIZE,
            )  # fmt: skip
        _store_rows(out_ptr, acc1, l_i1, tokens1, heads1, row_ok1, stride_o_tok, stride_o_head, HEAD_DIM)

    # -- epilogue --
    _store_rows(out_ptr, acc, l_i, tokens, heads, row_ok, stride_o_tok, stride_o_head, HEAD_DIM)


@triton.jit(do_not_specialize=["num_splits"])
def _reduce_splits_kernel(
    out_ptr,  # [num_tokens, num_heads, HEAD_DIM]
    partial_out_ptr,  # [num_tokens, num_heads, num_splits, HEAD_DIM] fp32
    partial_m_ptr,  # [num_tokens, num_heads, num_splits] fp32 (base-2 running max)
    partial_l_ptr,  # [num_tokens, num_heads, num_splits] fp32
    num_heads,
    num_splits,
    stride_o_tok,
    stride_o_head,
    HEAD_DIM: tl.constexpr,
    MAX_SPLITS: tl.constexpr,  # >= num_splits, a power of two
    PDL: tl.constexpr = False,  # as `_rope_paged_attention_kernel`'s
    D_CHUNK: tl.constexpr = 0,  # dims a program merges (grid axis 2: HEAD_DIM // D_CHUNK programs); 0: all of them
):
    if PDL:
        tl.extra.cuda.gdc_wait()
    token = tl.program_id(0)
    head = tl.program_id(1)
    row = (token.to(tl.int64) * num_heads + head) * num_splits
    offs_s = tl.arange(0, MAX_SPLITS)
    offs_d = tl.arange(0, HEAD_DIM) if D_CHUNK == 0 else tl.program_id(2) * D_CHUNK + tl.arange(0, D_CHUNK)
    split_ok = offs_s < num_splits
    m_part = tl.load(partial_m_ptr + row + offs_s, mask=split_ok, other=float("-inf"))  # [MAX_SPLITS]
    l_part = tl.load(partial_l_ptr + row + offs_s, mask=split_ok, other=0.0)  # [MAX_SPLITS]
    # NOTE: the outputs load beside the maxima and sums, not after them (no load waits on another)
    parts = tl.load(partial_out_ptr + (row + offs_s)[:, None] * HEAD_DIM + offs_d[None, :],
                    mask=split_ok[:, None], other=0.0)  # [MAX_SPLITS, HEAD_DIM]  # fmt: skip
    m_max = tl.max(m_part, 0)
    is_read = l_part > 0.0  # a split with no key to read wrote no output (only its max and sum): never use it
    weight = tl.where(is_read, l_part * tl.math.exp2(m_part - m_max), 0.0)  # empty splits weigh 0
    parts = tl.where(is_read[:, None], parts, 0.0)  # NOTE: what it holds is whatever was allocated (0 x NaN is NaN)
    out = tl.sum(parts * weight[:, None], 0) / tl.sum(weight, 0)  # [HEAD_DIM]
    o_ptrs = out_ptr + token.to(tl.int64) * stride_o_tok + head * stride_o_head + offs_d
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty))


# ---------------------------------------------------------------------------------------------------------
# host side
# ---------------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=8)
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


@functools.lru_cache(maxsize=8)
def _has_tma(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index)[0] >= 9  # Hopper and later: the tensor memory accelerator


@functools.lru_cache(maxsize=8)
def _pdl_device(device_index: int) -> bool:
    """Hopper or later, a Triton that has `gdc_wait` (3.3 and later), and not turned off."""
    hopper = torch.cuda.get_device_capability(device_index)[0] >= 9
    return hopper and hasattr(tl.extra.cuda, "gdc_wait") and pdl_requested()


def use_pdl(t: torch.Tensor) -> bool:
    """Launch the split read and its merge as programmatic dependents (PDL, Hopper and later): each may be scheduled
    while the kernel before it drains, and waits (`gdc_wait`, first thing) until that kernel has finished and its
    writes are visible, so a launch's latency overlaps the previous kernel's tail. Off under the interpreter, on
    other devices, and with `MINIPIC_PDL=0` (read once a device)."""
    return t.is_cuda and not _interpreting() and _pdl_device(t.device.index or 0)


DENSE_DTYPES = (torch.float16, torch.bfloat16)


def _next_pow2(x: int) -> int:
    return 1 << max(x - 1, 0).bit_length()


SHARED_MEMORY_BUDGET = 160 * 1024  # bytes of tiles per program (H100/H200: 227 KB per block at most)


def rows_per_sequence(num_tokens: int, num_seqs: int, group: int) -> int:
    """Query rows (tokens x the GQA group) a sequence of the batch holds on average, rounded up: what picks a path."""
    return math.ceil(num_tokens / num_seqs) * group


def pick_config(
    num_tokens: int,
    num_seqs: int,
    num_kv_heads: int,
    group: int,
    head_dim: int,
    max_context: int,
    is_rotary: bool,
    device: torch.device,
    elem_size: int = 2,
    table_elem_size: int = 4,
) -> dict:
    """Tile sizes, warps, stages, split count and pre-rotation from shapes only (no host sync).

    Measured on an H200 (bench/results): decode-like batches (<= 16 query rows per sequence) use 16-row
    tiles and split the key range when too few programs would fill the GPU (flash-decoding); short prefills
    (<= SHORT_PREFILL_ROWS rows per sequence, on CUDA) do the same with one query tile per sequence (at head_dim
    256 its tiles hold 64 rows: two for a longer one), 8 warps and one program per SM. Both read the next tile's
    block ids an iteration ahead (TABLE_AHEAD) where measured (head_dim 128, 16-bit), so that Triton's pipelining
    overlaps the key copies with the math; longer prefill-like batches use 128-row tiles and, in position-free mode,
    rotate each key once per call into a scratch buffer (PRE_ROTATE) instead of once per query tile. On Hopper,
    16-bit prefill-like batches take the DENSE path: keys (rotated) and values gathered into contiguous scratch,
    read by tensor-descriptor (TMA) loads.
    ``table_elem_size`` is the cos/sin table's element size (the engine passes it in the model dtype).
    """
    rows_per_seq = rows_per_sequence(num_tokens, num_seqs, group)
    is_cuda = device.type == "cuda"
    short = 16 < rows_per_seq <= SHORT_PREFILL_ROWS and is_cuda
    dense = rows_per_seq > SHORT_PREFILL_ROWS and elem_size == 2 and is_cuda and _has_tma(device.index or 0)
    block_m, tile_n, num_warps, num_stages = _generic_tiles(rows_per_seq, head_dim, is_rotary, short, elem_size)
    # -- measured exceptions (their tiles fit: they ran), set after the generic shrinking --
    short_read = short and head_dim == 128 and elem_size == 2  # NOTE: measured in bf16; float32 tiles twice
    # as large need 295 KB of shared memory (the H200 has 227): they keep the generic, shrunk tiles
    if short_read:
        # NOTE: measured on the H200 (gpu_short_prefill_f557ac8_h200_sweep.json), 17 new tokens over 16k / 32k:
        # 0.0425 / 0.0714 ms, against 0.0527 / 0.0884 for 32-key tiles, 8 warps capped at 128 registers, 2 programs
        # an SM and the block ids read in the tile's own iteration (then Triton's pipelining waits for every copy
        # at each iteration's top: no memory overlaps the math; bench/ptxas_stats.py). Faster at every short case.
        tile_n, num_warps, num_stages = 64, 8, 3
    kv_bytes = 2 * num_kv_heads * max_context * head_dim * elem_size  # a sequence's keys and values
    measured = dense and head_dim == 128  # measured on the H200: bench/results/gpu_ops_{cd5f0ee,b4505cf,74061a0}_h200*
    long_prefill = measured and rows_per_seq >= LONG_PREFILL_ROWS
    mid_prefill = measured and rows_per_seq >= MID_PREFILL_ROWS and kv_bytes <= HALVES_HEADS_FIRST_MAX_KV_BYTES
    halves = long_prefill or mid_prefill
    if measured:
        block_m, tile_n, num_warps, num_stages = (256, 64, 8, 3) if halves else (64, 64, 4, 3)
    # NOTE: a long prefill's 256-row tile runs as two 128-row halves that share each key and value tile (Q_SPLIT):
    # H200 (gpu_ops_b4505cf_h200_halves.json) 8k / 16k / 32k 1.096 / 4.200 / 16.38 ms against 1.187 / 4.537 / 17.64
    # with one 128x128 warp-specialized tile (Triton's warp specialization on top: within 1%, not taken). At 4k
    # the halves need every head's longest tiles first (gpu_ops_74061a0_h200_halves_order.json): 0.297 ms against
    # 0.344 one head after another and the 64x64 tiles' 0.328; at 8k / 16k / 32k heads first lost 3% / 3% / 3%
    q_split = 2 if halves else 1
    heads_first = mid_prefill or (measured and not halves and kv_bytes <= HEADS_FIRST_MAX_KV_BYTES)
    block_m = max(block_m, _next_pow2(group))
    bf16_decode = rows_per_seq <= 16 and is_rotary and head_dim == 128 and elem_size == 2 and table_elem_size <= 2
    num_splits = 1
    if is_cuda and (rows_per_seq <= 16 or short):
        long_decode = bf16_decode and max_context >= LONG_DECODE_KEYS
        num_splits = _num_splits(num_seqs, num_kv_heads, max_context, short_read, long_decode, device.index or 0)
    if bf16_decode:
        # NOTE: measured on the H200 (read_profile_316494b_h200_ahead4), the block ids read a tile ahead with 32-key
        # tiles, 2 stages when split, else 3, against 128-key tiles without: 1 x 576 keys 8.8 us / 11.9, 64 x 576
        # 0.0476 / 0.0573 ms (in 8k-wide tables, as the engine's graphs have them), 1 x 8k 19.2 / 19.3 us, 64 x 8k
        # 0.546 / 0.535 ms. The engine's graph tables are max_model_len wide: one config serves every context.
        # Few splits keep many keys each, and the third stage pays: 32 x 2,200 keys (the RAG table's decode step,
        # 2 splits; read_profile_7492bcd_rel37) 82.6 us at 3 stages against 134.5 at 2 (keys as stored 89.1).
        num_stages = 2 if num_splits > DEEP_PIPELINE_MAX_SPLITS else 3
    # NOTE: a decode that is not split (large batches) runs as many programs an SM as registers allow: ptxas gives
    # it 133 registers since the key loop computes offsets within a block once (102 before: 4 programs of 4 warps an
    # SM, as many as shared memory allows; 3 at 133). Capped at 128 (118, no spill; bench/ptxas_stats.py) it keeps
    # 4, at 315 instructions an iteration of the loop's body against 436 before. Not yet measured on the H200.
    max_regs = DECODE_MAX_REGS if bf16_decode and num_splits == 1 else None
    return dict(
        BLOCK_M=block_m,
        TILE_N=tile_n,
        num_warps=num_warps,
        num_stages=num_stages,
        NUM_SPLITS=num_splits,
        PRE_ROTATE=is_rotary and rows_per_seq > 16 and not short,
        DENSE=dense,
        WARP_SPECIALIZE=False,
        Q_SPLIT=q_split,
        HEADS_FIRST=heads_first,
        MAX_REGS=max_regs,
        TABLE_AHEAD=bf16_decode or short_read,
        # NOTE: measured on an H100 (read_profile_b498383_h100_splitids.json; two more runs at 4d556a7, whose files
        # did not come back: their printed bests), 17 new tokens over 16k keys: 38.3-39.2 us against 41.3-42.0 with
        # the block ids read a tile ahead (cold 38.2-38.6 against 42.2-42.8, blocks of 32 keys 37.8 against 40.1-40.3);
        # decode no faster (within 1%): it keeps them
        SPLIT_IDS=short_read and keys_per_split(max_context, tile_n, num_splits) <= MAX_SPLIT_KEYS,
        ONE_TOKEN_SEQS=num_tokens == num_seqs and not dense,
    )


def _generic_tiles(rows_per_seq: int, head_dim: int, is_rotary: bool, short: bool, elem_size: int) -> tuple:
    """(BLOCK_M, TILE_N, num_warps, num_stages) by the batch's shape, shrunk until they fit in shared memory."""
    if rows_per_seq <= 16:  # decode: memory bound
        block_m, tile_n, num_warps, num_stages = 16, 128, 4, 2
        if is_rotary and head_dim >= 128:  # in-kernel rotation (bench/results/gpu_ops_*_short_decode*, *_ecd1644_*)
            tile_n, num_warps, num_stages = 32, 4, 3
    elif short:  # NOTE: 128 rows, so a sequence's tokens sit in one tile and each key is rotated once per head
        block_m, tile_n, num_warps, num_stages = 128, 64, 8, 2
    elif rows_per_seq <= 64:
        block_m, tile_n, num_warps, num_stages = 64, 64, 4, 3
    elif head_dim <= 64:
        block_m, tile_n, num_warps, num_stages = 128, 64, 8, 3
    else:
        block_m, tile_n, num_warps, num_stages = 128, 128, 8, 2
    if head_dim >= 256:
        block_m, tile_n, num_warps, num_stages = min(block_m, 64), 32, 8, 2
    # NOTE: float32 doubles every tile: shrink until Q + the pipelined K/V tiles fit in shared memory.
    while elem_size * head_dim * (block_m + 2 * num_stages * tile_n) > SHARED_MEMORY_BUDGET:
        if tile_n > 32:
            tile_n //= 2
        elif num_stages > 1:
            num_stages -= 1
        else:
            block_m //= 2
    return block_m, tile_n, num_warps, num_stages


def _num_splits(
    num_seqs: int, num_kv_heads: int, max_context: int, short_read: bool, long_decode: bool, device_index: int
) -> int:
    """Split-KV programs per query tile (flash-decoding): a few programs per SM, each split keeping at least
    MIN_KEYS_PER_SPLIT keys (a long decode: LONG_DECODE_MIN_KEYS, up to LONG_DECODE_SPLITS), a power of two.

    NOTE: one working query tile per sequence (a short prefill's tokens fit in one), whatever the grid holds:
    counting its empty tiles halved the splits of a CUDA graph's padded (2, 32) bucket. A graph's prefill bucket
    also holds a padding sequence (one key): one prompt runs as (2, 32), and counting it halved the short read's
    splits (H200, 17 tokens over 16k: 8 splits 0.0715 ms against 16 splits' 0.0425), so the short read leaves one
    sequence out; two real sequences in a bucket without padding then take 16 splits (~1.1x slower)."""
    per_sm, seqs = DECODE_PROGRAMS_PER_SM, num_seqs
    if short_read:
        per_sm, seqs = SHORT_READ_PROGRAMS_PER_SM, max(num_seqs - 1, 1)
    programs = per_sm * _num_sms(device_index)
    if long_decode:
        return splits_to_fill(programs, seqs * num_kv_heads, max_context, LONG_DECODE_MIN_KEYS, LONG_DECODE_SPLITS)
    return splits_to_fill(programs, seqs * num_kv_heads, max_context)


def keys_per_split(max_context: int, tile_n: int, num_splits: int) -> int:
    """Keys a split of a key range `max_context` long reads at most: whole tiles, the kernel's rounding."""
    return math.ceil(math.ceil(max_context / tile_n) / num_splits) * tile_n


def splits_to_fill(
    num_programs: int,
    num_query_tiles: int,
    max_context: int,
    min_keys: int = MIN_KEYS_PER_SPLIT,
    max_splits: int = MAX_SPLITS,
) -> int:
    """The largest power of two of splits per query tile (and kv head) with num_query_tiles x splits <=
    num_programs, each split keeping >= min_keys keys, at most max_splits; 1 at least."""
    want = min(num_programs // num_query_tiles, max_context // min_keys, max_splits)
    return 1 << (max(want, 1).bit_length() - 1)


def config_for_args(
    q: torch.Tensor, k_cache: torch.Tensor, block_tables: torch.Tensor, cos_sin: torch.Tensor | None
) -> dict:
    """`pick_config`'s choice for a launch with these arguments (the op's, as ``ops.rope_paged_attention``)."""
    num_tokens, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    return pick_config(
        num_tokens, block_tables.shape[0], num_kv_heads, num_heads // num_kv_heads, head_dim,
        block_tables.shape[1] * block_size, cos_sin is not None, q.device, elem_size=q.element_size(),
        table_elem_size=4 if cos_sin is None else cos_sin.element_size(),
    )  # fmt: skip


def compile_key(cfg: dict) -> tuple:
    """What a launch with config `cfg` compiles: two configs with the same key run the same kernels."""
    merge = _merge_width(cfg["NUM_SPLITS"]) if cfg["NUM_SPLITS"] > 1 else 0  # the merge compiles per width
    return (cfg["BLOCK_M"], cfg["TILE_N"], cfg["num_warps"], cfg["num_stages"], merge, cfg["PRE_ROTATE"],
            cfg["DENSE"], cfg["WARP_SPECIALIZE"], cfg.get("MAX_REGS"), cfg.get("TABLE_AHEAD", False),
            cfg.get("Q_SPLIT", 1), cfg["DENSE"] and cfg.get("HEADS_FIRST", False),
            not cfg["DENSE"] and cfg.get("ONE_TOKEN_SEQS", False), cfg.get("SPLIT_IDS", False))  # fmt: skip


# Step shapes that `variant_shapes` tries: sequences, query tokens per sequence (around pick_config's thresholds of
# 16 and SHORT_PREFILL_ROWS rows, and LONG_PREFILL_ROWS) and table widths in keys (the context `pick_config` reads).
VARIANT_SEQS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
VARIANT_TOKENS_PER_SEQ = (1, 2, 4, 5, 8, 16, 17, 32, 33, 64, 129, 1024, 4096, 8192)
VARIANT_TABLE_KEYS = (256, 512, 4096, 8192)


def variant_shapes(
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    is_rotary: bool,
    device: torch.device,
    elem_size: int,
    table_elem_size: int,
    max_num_tokens: int,
    max_context: int,
) -> list[tuple[int, int, int]]:
    """(num_tokens, num_seqs, table_keys): one step shape for each kernel variant (`compile_key`) that `pick_config`
    chooses for these heads in steps of at most `max_num_tokens` tokens over tables at most `max_context` keys wide."""
    group, found = num_heads // num_kv_heads, {}
    for num_seqs, per_seq in itertools.product(VARIANT_SEQS, VARIANT_TOKENS_PER_SEQ):
        for keys in sorted({k for k in (*VARIANT_TABLE_KEYS, max_context) if per_seq <= k <= max_context}):
            if num_seqs * per_seq <= max_num_tokens:
                cfg = pick_config(num_seqs * per_seq, num_seqs, num_kv_heads, group, head_dim, keys, is_rotary,
                                  device, elem_size, table_elem_size)  # fmt: skip
                found.setdefault(compile_key(cfg), (num_seqs * per_seq, num_seqs, keys))
    return sorted(found.values())


def warm_up(
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    cos_sin: torch.Tensor | None,
    device: torch.device,
    max_num_tokens: int,
    max_context: int,
    caches: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> int:
    """Launch every kernel variant of `variant_shapes` once on a small zero cache, so that each compiles now and not
    in the middle of serving (a compile takes seconds). Arguments as the engine passes them (same dtypes and
    strides, so the same specializations). `caches`: a layer's K and V as the engine passes them, read instead
    where they hold enough blocks, so that the variants compile with serving's offsets' width (INT32_OFFSETS: a
    layer of more than 2^31 elements takes int64). Returns the number of launches."""
    elem_size = torch.empty((), dtype=dtype).element_size()
    table_elem_size = 4 if cos_sin is None else cos_sin.element_size()
    shapes = variant_shapes(num_heads, num_kv_heads, head_dim, cos_sin is not None, device, elem_size,
                            table_elem_size, max_num_tokens, max_context)  # fmt: skip
    for num_tokens, num_seqs, keys in shapes:
        per_seq = num_tokens // num_seqs  # each sequence: its keys 0 .. per_seq - 1, all of them queries
        num_blocks = triton.cdiv(per_seq, block_size)
        if caches is not None and caches[0].shape[0] >= num_blocks:
            k_cache, v_cache = caches
        else:
            k_cache = torch.zeros(num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype, device=device)
            v_cache = torch.zeros_like(k_cache)
        tables = torch.zeros(num_seqs, triton.cdiv(keys, block_size), dtype=torch.int32, device=device)
        tables[:, :num_blocks] = torch.arange(num_blocks, dtype=torch.int32, device=device)
        int32 = dict(dtype=torch.int32, device=device)
        rope_paged_attention_triton(
            torch.zeros(num_tokens, num_heads, head_dim, dtype=dtype, device=device), k_cache, v_cache, tables,
            torch.arange(0, num_tokens + 1, per_seq, **int32),
            torch.arange(per_seq, device=device).repeat(num_seqs), torch.full((num_seqs,), per_seq, **int32),
            torch.zeros(num_tokens, **int32), cos_sin, head_dim**-0.5,
        )  # fmt: skip
    return len(shapes)


def check_triton_support(q: torch.Tensor, k_cache: torch.Tensor, cos_sin: torch.Tensor | None) -> None:
    """Constraints of the kernel beyond the op's contract (shape-only)."""
    head_dim = q.shape[-1]
    if head_dim < 16 or head_dim & (head_dim - 1):
        raise ValueError(f"q: the Triton kernel needs head_dim a power of two >= 16, got {head_dim}")
    if not (q.is_cuda or _interpreting()):
        raise ValueError(f"q: the Triton kernel needs CUDA tensors (or TRITON_INTERPRET=1), got {q.device}")


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def gather_to_scratch(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor | None,
    block_tables: torch.Tensor,
    kv_lens: torch.Tensor,
    cos_sin: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Keys (rotated at their positions when ``cos_sin`` is given) and, if ``v_cache`` is given, values of every
    sequence copied into a per-call scratch in logical order (the cache is untouched).

    Returns ``(k_scratch, v_scratch)``: each scratch is ``[num_seqs * max_blocks, B, H_kv, d]`` and holds
    logical block i of sequence s at ``s * max_blocks + i`` (``identity_tables`` maps it for the paged kernel).
    Blocks past a sequence's ``kv_len`` are left unwritten.
    """
    num_seqs, max_blocks = block_tables.shape
    _, block_size, num_kv_heads, head_dim = k_cache.shape
    shape = (num_seqs * max_blocks, *k_cache.shape[1:])
    k_scratch = torch.empty(shape, device=k_cache.device, dtype=k_cache.dtype)
    v_scratch = None if v_cache is None else torch.empty(shape, device=k_cache.device, dtype=k_cache.dtype)
    rotary_dim = 0 if cos_sin is None else cos_sin.shape[1]
    v_src = k_cache if v_cache is None else v_cache
    _gather_kv_kernel[(max_blocks, num_seqs)](
        k_scratch, k_scratch if v_scratch is None else v_scratch, k_cache, v_src, block_tables, kv_lens,
        k_cache if cos_sin is None else cos_sin, max_blocks,
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_src.stride(0), v_src.stride(1), v_src.stride(2),
        block_tables.stride(0), 0 if cos_sin is None else cos_sin.stride(0),
        BLOCK_SIZE=block_size, NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim, ROTARY_DIM=rotary_dim,
        HALF_PAD=max(_next_pow2(rotary_dim // 2), 16), ROWS_PAD=_next_pow2(block_size * num_kv_heads),
        GATHER_V=v_cache is not None, num_warps=4,
    )  # fmt: skip
    return k_scratch, v_scratch


def identity_tables(num_seqs: int, max_blocks: int, device: torch.device) -> torch.Tensor:
    """``[num_seqs, max_blocks]`` block tables over a ``gather_to_scratch`` scratch (for the paged kernel)."""
    return torch.arange(num_seqs * max_blocks, device=device, dtype=torch.int32).view(num_seqs, max_blocks)


def is_split_worth_it(num_tokens: int, num_seqs: int, group: int, num_decode_seqs: int) -> bool:
    """A batch whose first `num_decode_seqs` sequences decode and whose rest would make it prefill-like: read as
    one, it would copy every sequence's keys (pre-rotation or the dense path's gather), the decodes' long
    contexts too, to read each of them with one query row."""
    return 0 < num_decode_seqs < num_seqs and rows_per_sequence(num_tokens, num_seqs, group) > SHORT_PREFILL_ROWS


def _launch_split(q, k_cache, v_cache, block_tables, cu_seqlens_q, q_positions, kv_lens, visible_start, cos_sin,
                  scale, out, num_decode_seqs: int) -> torch.Tensor:  # fmt: skip
    """The decodes (one query token each, first) as a decode launch, the rest as a prefill launch, into one output."""
    out = torch.empty_like(q) if out is None else out
    n = num_decode_seqs  # NOTE: as many tokens as sequences
    caches = (k_cache, v_cache)
    rope_paged_attention_triton(q[:n], *caches, block_tables[:n], cu_seqlens_q[: n + 1], q_positions[:n], kv_lens[:n],
                                visible_start[:n], cos_sin, scale, out=out[:n])  # fmt: skip
    tables, positions, lens, visible = (_aligned(t[n:]) for t in (block_tables, q_positions, kv_lens, visible_start))
    rope_paged_attention_triton(q[n:], *caches, tables, cu_seqlens_q[n:] - n, positions, lens, visible, cos_sin, scale,
                                out=out[n:])  # fmt: skip
    return out


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """`t`, or a copy of it where its data does not start on 16 bytes. Triton compiles a kernel for each alignment of
    its pointers: a slice at another offset compiled a variant that the warm-up never met, seconds in the middle of
    serving (next60, bench/results/next60-68a1fa5-cuda-rag.log: `_dense_attention_kernel` and `_gather_kv_kernel`
    compiled inside two RAG runs, on `visible_start`, `block_tables` and `kv_lens` sliced after 1-3 decodes)."""
    return t if t.data_ptr() % 16 == 0 else t.clone()


def _launch_dense(q, k_cache, v_cache, block_tables, cu_seqlens_q, q_positions, kv_lens, visible_start, cos_sin,
                  scale, cfg, out) -> None:  # fmt: skip
    """Gather K (rotated) and V into contiguous scratch, then one tensor-descriptor attention launch."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    num_tokens, num_heads, head_dim = q.shape
    num_seqs, max_blocks = block_tables.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    group = num_heads // num_kv_heads
    k_scratch, v_scratch = gather_to_scratch(k_cache, v_cache, block_tables, kv_lens, cos_sin)
    block_m, tile_n = cfg["BLOCK_M"], cfg["TILE_N"]
    block_q = max(block_m // group, 1)
    if block_q * group > block_m:
        block_m = _next_pow2(group)
    q_split = cfg.get("Q_SPLIT", 1)
    if q_split not in (1, 2) or block_m // q_split < 16:
        raise ValueError(f"config: Q_SPLIT must be 1 or 2 with BLOCK_M / Q_SPLIT >= 16, got {q_split} and {block_m}")
    rows = k_scratch.view(-1, num_kv_heads * head_dim)  # [num_seqs * max_context, H_kv * d]
    k_desc = TensorDescriptor.from_tensor(rows, block_shape=[tile_n, head_dim])
    v_desc = TensorDescriptor.from_tensor(v_scratch.view_as(rows), block_shape=[tile_n, head_dim])
    grid = (num_tokens // block_q + num_seqs, num_kv_heads)
    heads_first = cfg.get("HEADS_FIRST", False) and grid[0] <= MAX_GRID_Z  # NOTE: the tiles fit the grid's y axis
    _dense_attention_kernel[grid[::-1] if heads_first else grid](
        out, q, k_desc, v_desc, cu_seqlens_q, q_positions, visible_start, scale * LOG2E, num_seqs,
        max_blocks * block_size, q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        GROUP=group, HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_Q=block_q, TILE_N=tile_n,
        NUM_STAGES=cfg["num_stages"], WARP_SPECIALIZE=cfg.get("WARP_SPECIALIZE", False),
        HEADS_FIRST=heads_first, Q_SPLIT=q_split, num_warps=cfg["num_warps"],
    )  # fmt: skip


def rope_paged_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    q_positions: torch.Tensor,
    kv_lens: torch.Tensor,
    visible_start: torch.Tensor,
    cos_sin: torch.Tensor | None,
    scale: float,
    config: dict | None = None,
    out: torch.Tensor | None = None,
    num_decode_seqs: int = 0,
) -> torch.Tensor:
    """Launch the kernel (arguments as ``ops.rope_paged_attention``).

    ``config`` overrides ``pick_config``'s choice (benchmarks sweep it); ``out`` is an optional
    preallocated output (tests pass a NaN-poisoned one to check that every element gets written).
    """
    num_tokens, num_heads, head_dim = q.shape
    num_blocks, block_size, num_kv_heads, _ = k_cache.shape
    num_seqs = block_tables.shape[0]
    group = num_heads // num_kv_heads
    if config is None and is_split_worth_it(num_tokens, num_seqs, group, num_decode_seqs):
        return _launch_split(q, k_cache, v_cache, block_tables, cu_seqlens_q, q_positions, kv_lens, visible_start,
                             cos_sin, scale, out, num_decode_seqs)  # fmt: skip
    cfg = config_for_args(q, k_cache, block_tables, cos_sin)
    cfg.update(config or {})
    block_m, num_splits = cfg["BLOCK_M"], cfg["NUM_SPLITS"]
    if not 1 <= num_splits <= MAX_CONFIG_SPLITS:
        raise ValueError(f"config: NUM_SPLITS must lie in [1, {MAX_CONFIG_SPLITS}], got {num_splits}")
    block_q = max(block_m // group, 1)
    if block_q * group > block_m:
        block_m = _next_pow2(group)
    out = torch.empty_like(q) if out is None else out
    if cfg.get("DENSE", False) and q.dtype in DENSE_DTYPES and scale > 0:
        _launch_dense(q, k_cache, v_cache, block_tables, cu_seqlens_q, q_positions, kv_lens, visible_start, cos_sin,
                      scale, cfg, out)  # fmt: skip
        return out
    k_tables = block_tables
    if cos_sin is not None and cfg.get("PRE_ROTATE", False):
        # NOTE: prefill-like batches: each key tile is read by many query tiles, so rotating it once per call
        # (one extra pass over the keys) is far cheaper than rotating it in every program that reads it.
        k_cache, _ = gather_to_scratch(k_cache, None, block_tables, kv_lens, cos_sin)
        k_tables = identity_tables(*block_tables.shape, q.device)
        cos_sin = None
    rotary_dim = 0 if cos_sin is None else cos_sin.shape[1]
    if num_splits > 1:
        partial_out = torch.empty(num_tokens, num_heads, num_splits, head_dim, device=q.device, dtype=torch.float32)
        partial_m = torch.empty(num_tokens, num_heads, num_splits, device=q.device, dtype=torch.float32)
        partial_l = torch.empty_like(partial_m)
    else:
        partial_out = partial_m = partial_l = out  # unused
    one_token = cfg.get("ONE_TOKEN_SEQS", False)
    if one_token and num_tokens != num_seqs:
        raise ValueError(f"config: ONE_TOKEN_SEQS needs one query token a sequence, got {num_tokens} for {num_seqs}")
    fits = offsets_fit_int32(k_cache, v_cache, cos_sin)
    int32_offsets = cfg.get("INT32_OFFSETS", fits)  # NOTE: a config may ask for int64 offsets (tests), never int32
    if int32_offsets and not fits:
        raise ValueError("config: INT32_OFFSETS needs every cache and cos/sin offset below 2^31")
    pdl = use_pdl(q)
    split_ids = split_table_entries(cfg, num_splits, block_tables.shape[1], block_size)
    num_tiles = num_seqs if one_token else num_tokens // block_q + num_seqs
    tiles_last = cfg.get("TILES_LAST", num_splits > 1) and num_tiles <= MAX_GRID_Z  # split launches: tiles last
    grid = (num_kv_heads, num_splits, num_tiles) if tiles_last else (num_tiles, num_kv_heads, num_splits)
    _rope_paged_attention_kernel[grid](
        out, q, k_cache, v_cache, k_tables, block_tables, cu_seqlens_q, q_positions, visible_start,
        q if cos_sin is None else cos_sin, partial_out, partial_m, partial_l,
        scale * LOG2E, num_seqs, num_heads, num_splits,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        k_tables.stride(0), block_tables.stride(0), 0 if cos_sin is None else cos_sin.stride(0),
        BLOCK_SIZE=block_size, GROUP=group, HEAD_DIM=head_dim, ROTARY_DIM=rotary_dim,
        HALF_PAD=max(_next_pow2(rotary_dim // 2), 16), BLOCK_M=block_m, BLOCK_Q=block_q,
        TILE_N=cfg["TILE_N"], SPLIT_KV=num_splits > 1, TILES_LAST=tiles_last,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32", TABLE_AHEAD=cfg.get("TABLE_AHEAD", False),
        SPLIT_IDS=split_ids,
        ONE_TOKEN_SEQS=one_token, INT32_OFFSETS=int32_offsets, PDL=pdl,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], maxnreg=cfg.get("MAX_REGS"),
        **({"launch_pdl": True} if pdl else {}),
    )  # fmt: skip
    if num_splits > 1:
        merge_splits(out, partial_out, partial_m, partial_l, cfg.get("MERGE_WARPS"), cfg.get("MERGE_D_CHUNK"))
    return out


def split_table_entries(cfg: dict, num_splits: int, max_blocks: int, block_size: int) -> int:
    """The SPLIT_IDS constexpr of a launch: with `cfg["SPLIT_IDS"]`, a split launch whose tiles start on a block and
    whose splits of tables `max_blocks` wide hold at most MAX_SPLIT_KEYS keys, MAX_SPLIT_KEYS // block_size (one
    value for a cache, whatever the tables' width: no compile in the middle of serving); else 0, the block ids read
    tile by tile."""
    tile_n = cfg["TILE_N"]
    if not cfg.get("SPLIT_IDS", False) or num_splits == 1 or tile_n % block_size:
        return 0
    fits = keys_per_split(max_blocks * block_size, tile_n, num_splits) <= MAX_SPLIT_KEYS
    return MAX_SPLIT_KEYS // block_size if fits else 0


def offsets_fit_int32(*tensors: torch.Tensor | None) -> bool:
    """Every element of each tensor (None: none) lies less than 2^31 elements from its first: the read kernel's
    offsets then fit int32 (its INT32_OFFSETS). A layer's K or V in the engine's cache holds blocks x B x heads x d
    elements: 2^31 of them are 4 GiB in 16 bits."""
    return all(t is None or _span_fits_int32(t.shape, t.stride()) for t in tensors)


@functools.lru_cache(maxsize=64)
def _span_fits_int32(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """`offsets_fit_int32` of one layout, remembered: an eager step launches the read once a layer, on the same
    cache's layout (5.5 us a launch without the memo, 2-3 with it, on the CPU machine)."""
    return sum((n - 1) * abs(st) for n, st in zip(shape, stride, strict=True)) < 2**31


def _merge_width(num_splits: int) -> int:
    """The splits `_reduce_splits_kernel` is compiled for (MAX_SPLITS): a power of two, MAX_SPLITS at least."""
    return max(MAX_SPLITS, _next_pow2(num_splits))


def merge_config(num_splits: int, head_dim: int) -> tuple[int, int]:
    """(warps a program, dims a program merges; 0: all) of the merge of `num_splits` splits of `head_dim` dims: one
    warp a (token, head) up to MAX_SPLITS splits; past it one warp a LONG_MERGE_D_CHUNK-dim chunk (four warps where
    head_dim is no wider than a chunk)."""
    if _merge_width(num_splits) <= MAX_SPLITS:
        return MERGE_WARPS, 0
    return (MERGE_WARPS, LONG_MERGE_D_CHUNK) if head_dim > LONG_MERGE_D_CHUNK else (4, 0)


def merge_splits(
    out, partial_out, partial_m, partial_l, num_warps: int | None = None, d_chunk: int | None = None
) -> None:
    """`_reduce_splits_kernel` over partials [num_tokens, num_heads, num_splits, HEAD_DIM] (and their maxima and
    sums) into out [num_tokens, num_heads, HEAD_DIM]; `num_warps` and `d_chunk` (dims a program merges, 0: all)
    None: `merge_config`'s (benchmarks sweep both)."""
    num_tokens, num_heads, num_splits, head_dim = partial_out.shape
    max_splits = _merge_width(num_splits)
    default_warps, default_chunk = merge_config(num_splits, head_dim)
    num_warps = default_warps if num_warps is None else num_warps
    d_chunk = default_chunk if d_chunk is None else d_chunk
    if d_chunk and (head_dim % d_chunk or d_chunk & (d_chunk - 1)):
        raise ValueError(f"merge: d_chunk must be a power of two dividing head_dim {head_dim}, got {d_chunk}")
    pdl = use_pdl(out)
    _reduce_splits_kernel[(num_tokens, num_heads, head_dim // d_chunk if d_chunk else 1)](
        out, partial_out, partial_m, partial_l, num_heads, num_splits, out.stride(0), out.stride(1),
        HEAD_DIM=head_dim, MAX_SPLITS=max_splits, PDL=pdl, D_CHUNK=d_chunk, num_warps=num_warps,
        **({"launch_pdl": True} if pdl else {}),
    )  # fmt: skip
