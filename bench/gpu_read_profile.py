"""Where the op's split-KV read loses time on the GPU: a few query rows over many cached keys.

The cases (Llama-3-8B heads: 32 query, 8 kv, d128; bf16; bf16 cos/sin table as the engine passes it; shuffled
paged blocks): the short read of a cached RAG prompt (17 new tokens over 16k keys: the TTFT of 8 cached
2048-token documents), decode at batch 1 and 64 over 8k keys, and torch SDPA's default backend on the unpaged
decode for comparison.

    python bench/gpu_read_profile.py --out DIR            # per-kernel device time (torch profiler) and a
                                                          # config sweep, timed as CUDA-graph replays
    python bench/gpu_read_profile.py --case short16k      # a few calls of one case, for ncu to read

Each variant's output is checked against the torch path. Results: DIR/read_profile_<sha>.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_ops import Clock, paged_problem, rope_cos_sin, sdpa_baselines  # noqa: E402
from gpu_short_prefill import HEADS, config_for, copy_bandwidth, problem  # noqa: E402
from provenance import git_sha  # noqa: E402

from ops import triton_kernel  # noqa: E402
from ops.torch_impl import rope_paged_attention_torch  # noqa: E402

# decode cases: (batch, keys); b32x2200w8k is the RAG table's decode step (32 requests of ~2,200 tokens), where
# position-free decode steps took 8.9 ms against keys stored rotated's 7.7 (rag-dbcc69c-cuda.md, reuse 0)
DECODE_CASES = {"b1x8k": (1, 8192), "b64x8k": (64, 8192), "b1x576w8k": (1, 576), "b64x576w8k": (64, 576),
                "b32x2200w8k": (32, 2200)}  # fmt: skip
# batch-1 decodes over 1k-32k keys: the op's and SDPA's time against the keys read, whose slope is the streaming rate
# and whose intercept the fixed chain (launch, metadata, first tile, merge). H100 (read_profile_3ffe891_h100_lengths):
# op / keys as stored / SDPA 12.62 / 11.21 / 7.07 us at 1k, 14.61 / 12.17 / 12.63 at 8k, 32.18 / 29.96 / 30.11 at
# 16k, 55.03 / 51.75 / 51.30 at 32k; cold 8k 20.19 / 18.60 / 19.30, cold 32k 55.29 / 51.68 / 51.33. Up to 8k
# (33.5 MB) K and V stay in the 50 MB L2 between calls: the warm 8k case is an L2 read; from 16k, read from DRAM,
# keys as stored stream at SDPA's rate and the rotation costs 6-8%
DECODE_CASES.update({f"b1x{n}k": (1, n * 1024) for n in (1, 2, 4, 16, 32)})


def case_args(name: str, device) -> list:
    """The op's positional arguments for a named case; `w8k`: block tables 8,192 keys wide (the engine's CUDA
    graphs size them to max_model_len, and pick_config reads the width, not the context)."""
    if name == "short16k":
        return problem(1, 17, 16384, device)
    if name.startswith("short16k_b"):  # _b32 / _b64 / _b128: the same read on blocks of that many keys
        return problem(1, 17, 16384, device, block_size=int(name.removeprefix("short16k_b")))
    if name.startswith("short16k_"):  # _contig / _spread: the same blocks placed in a pool as large as the engine's
        return placed_in_pool(problem(1, 17, 16384, device), spread=name.endswith("spread"))
    if name.endswith("_stored"):  # the same read with keys used as stored (cos_sin None: no rotation)
        args = case_args(name.removesuffix("_stored"), device)
        args[8] = None
        return args
    batch, length = DECODE_CASES[name]
    args = list(paged_problem("decode", batch, length, HEADS, device).args())
    args[8] = args[8].to(torch.bfloat16)
    if name.endswith("w8k"):
        tables = args[3]
        wide = torch.zeros(tables.shape[0], 8192 // 16, dtype=tables.dtype, device=device)
        wide[:, : tables.shape[1]] = tables
        args[3] = wide
        args[8] = rope_cos_sin(8192, HEADS["head_dim"], device=device).to(torch.bfloat16)
    return args


POOL_GIB = float(os.environ.get("READ_POOL_GIB", "32"))  # K (and V) pool of the _contig / _spread cases


def placed_in_pool(args: list, spread: bool) -> list:
    """The problem's blocks copied into a K and a V pool of POOL_GIB each, at consecutive block ids or at random
    ones across the pool (what a long-running engine's LRU free queue hands out). A hypothesis to test: a first
    prompt on blocks just written reads ~0.9 ms slower per forward than the same prompt again (README, host_ttft
    --fresh), and TLB reach or DRAM page locality over a ~100 GB cache may be why; the op benches shuffle blocks
    only within the few they allocate."""
    k_cache, v_cache, tables = args[1], args[2], args[3]
    block_bytes = k_cache[0].numel() * k_cache.element_size()
    num_pool = max(int(POOL_GIB * 2**30 // block_bytes), tables.numel())
    used = tables.flatten().long()
    if spread:
        slots = torch.randperm(num_pool, device=k_cache.device)[: used.numel()]
    else:
        slots = torch.arange(used.numel(), device=k_cache.device)
    pools = []
    for cache in (k_cache, v_cache):
        pool = torch.empty((num_pool, *cache.shape[1:]), dtype=cache.dtype, device=cache.device)
        pool[slots] = cache[used]
        pools.append(pool)
    placed = list(args)
    placed[1], placed[2], placed[3] = pools[0], pools[1], slots.to(tables.dtype).view_as(tables)
    return placed


def grid(**axes) -> list[dict]:
    """Every combination of the axes' values, as config overrides (the last axis varies fastest)."""
    return [dict(zip(axes, values, strict=True)) for values in itertools.product(*axes.values())]


# NOTE: tried and not kept (bench/results/read_profile_{7d9b2be,40ea091}_h200_*): smaller query tiles for the short
# read (BLOCK_M 64 / 32: 0.061 / 0.085 ms against 128 rows' 0.056), 2 warps or 256-key tiles for decode 1 x 8k, and
# a kernel reading one KV block per box load through tensor descriptors (TMA), with or without lazy rescaling:
# 0.074 ms short read, 19.8 us decode 1 x 8k, 0.817 ms decode 64 x 8k against the paged kernel's 0.056 / 17.9 / 0.542;
# read cold (b13da78_h200_cold: the defaults stay best) 0.065 ms / 23.7 us against 0.056 ms / 22.0 us;
# tiles of 1 or 2 of a kv head's 4 query heads (HEADS_PER_PROGRAM at 08eb29e; read_profile_35e9033_h200_heads): best
# 0.062 ms (2 heads, 64 rows, 64-key tiles, 16 splits) against the defaults' 0.057; and the short read after a
# weight-streaming GEMM (short16k_gemm): 49.3 us against 50.8 alone, so the GEMM before it is not what slows it;
# 8 warps (read_profile_086c224_h200_warps): short read best 0.0572 ms (64-key tiles, 16 splits) against 4 warps'
# 0.0568, decode 1 x 8k 20.5 us against 19.0; registers capped (read_profile_2f1f877_h200_regs): 8 warps at 128 kept
# (0.0531 against 0.0563), with 64 splits 0.064, 4 warps at 168 0.099, decode 1 x 8k capped 20.9 us against 19.7;
# 16-key tiles, 8 warps at 128 registers, no spill (read_profile_ea85814_h200_tile16): 0.0655 against 0.0534 (16
# splits 0.099): the loop's time goes with its iteration count, not with spills or bytes; the next tile's keys and
# values in registers before this tile's math (PREFETCH at 0f5919e, removed; read_profile_3ce5ff5_h200_prefetch.log):
# best 0.0543 against 0.0530; the block ids read a tile ahead (TABLE_AHEAD, read_profile_3ce5ff5_h200_ahead.*,
# read_profile_f557ac8_h200_ahead2.*): 0.0430 with 64-key tiles, 8 warps, 3 stages, 16 splits, kept
# lazy rescaling (RESCALE_SLACK at 19d9e6f, read_profile_19d9e6f_lazy.json): short read 0.0439 ms against 0.0399,
# decode 1 x 8k 17.5 against 18.1 us; removed (ops/README.md); several kv heads a program (KV_PACK at f4d261f: a
# tile's columns hold 2 or 4 heads' keys under one cos/sin load, 24.5 / 16.8 SASS instructions a kv head's key
# against 31.8 by ptxas; read_profile_f4d261f_pack.json, H100): no decode case faster, 1 x 8k 15.68 us at best against
# 15.15 (SDPA 12.84), cold 20.70 against 20.83, 64 x 8k 0.7213 ms against 0.7221; removed; keys' cos / sin by angle
# addition (ANGLE_ADD at 8754d13: one table row a tile, the offsets' rows loaded once; read_profile_a2cdd71_angle.json,
# H100): the short read 42.61 us against 42.35 (keys as stored 36.61), decode 1 x 8k 18.51 at best against 14.46
# (ptxas: 160 registers against 125, 381 instructions a body iteration against 254); removed
# each warp its own online softmax over its own keys (bench/gpu_decode_warps.py at 19db9d0, removed: a batched dot
# [W, 16, d] x [W, d, N / W] with the batch along the warps, so no row max, sum or score tile crosses warps, and the W
# states merged once a program; ptxas 211-255 registers against 132): slower at every point on an H100
# (decode_warps_19db9d0_h100.json): 1 x 8k 19.1 us at best (64-key tiles, 32 splits, 3 stages, block ids ahead),
# 20-65 at the others, against the op's 13.84 and SDPA's 12.08 in the same run
# where the batch-1 decode's read waits (ncu's source counters, H100, part ncusrc at e368785:
# ncusrc_e368785_h100_*.csv.gz, ncu_e368785_h100_*.log): at 2 stages the loop's top waits for every copy in flight
# (`DEPBAR.LE SB0, 0x0`: 31% of the warps' stall samples, long scoreboard), and the next tile's copies are issued after
# this tile's scores and softmax, so each of a program's 4 tiles pays most of a DRAM round trip; the block ids read a
# tile ahead, carried in registers, are waited for at the loop's back edge (10%). Keys as stored at their own config
# (128-key tiles, 32 splits) wait at the same place (48%). cuDNN's kernel for the same decode: 32 splits x 8 heads =
# 256 programs of 4 warps, 16x128x128 tiles (two 128-key tiles a program), 183 registers, 86 KB of shared memory, 17.25
# us cold under ncu against the op's read 20.29 (keys as stored 19.55), then a 4.38 us reduction. Not run: the key
# loop unrolled twice (`loop_unroll_factor`; compiled for sm_90a on the CPU machine) waits once every two tiles but
# spills 32 bytes at 128 registers, as 64-key tiles do (measured slower); 3 stages keep a tile in flight (`DEPBAR 0x5`)
# and were slower at 64 splits (read_profile_3ef1983_h200_s64.json: 17.14 against 15.33 us)
def sweep_for(name: str) -> list[dict]:
    if MODE == "regs":  # registers capped (ptxas .maxnreg) so that 2 programs of 8 warps share an SM
        return {
            "short16k": grid(TILE_N=(32,), num_warps=(8,), num_stages=(2, 3), NUM_SPLITS=(32, 64), MAX_REGS=(128,))
            + grid(TILE_N=(32,), num_warps=(4,), num_stages=(2,), NUM_SPLITS=(32,), MAX_REGS=(168,)),
            "short16k_cold": grid(
                TILE_N=(32,), num_warps=(8,), num_stages=(2, 3), NUM_SPLITS=(32, 64), MAX_REGS=(128,)
            ),
            "b1x8k": grid(TILE_N=(64, 128), num_warps=(4,), num_stages=(3, 4), NUM_SPLITS=(32, 64), MAX_REGS=(128,)),
        }.get(name, [])
    if MODE == "tile16":  # 16-key tiles, which fit 128 registers without spilling (ptxas, sm_90a)
        if name.startswith("short16k"):
            return grid(TILE_N=(16,), num_warps=(8,), num_stages=(2, 3, 4), NUM_SPLITS=(16, 32), MAX_REGS=(128,))
        return []
    if MODE == "ahead":  # the next tile's block ids read an iteration ahead, so that Triton's
        # pipelining overlaps copies with math (ptxas: async_wait 5 at 3 stages, 10 at 4; the defaults' 0), not yet run
        ahead = dict(TABLE_AHEAD=(True,))
        if name.startswith("short16k"):
            short = dict(**ahead, num_warps=(8,))
            return (grid(**short, TILE_N=(32,), MAX_REGS=(128,), num_stages=(3, 4), NUM_SPLITS=(16, 32))
                    + grid(**short, TILE_N=(64,), MAX_REGS=(128, None), num_stages=(3,), NUM_SPLITS=(16,)))  # fmt: skip
        if name.startswith(("b1x8k", "b64x8k")):  # NOTE: 128-key tiles at 4 stages need 303 KB of shared memory
            return (grid(**ahead, TILE_N=(32, 64), num_stages=(3, 4), num_warps=(4,))
                    + grid(**ahead, TILE_N=(128,), num_stages=(2, 3), num_warps=(4,)))  # fmt: skip
        return []
    if MODE == "ahead2":  # around part ahead's best (64-key tiles, 8 warps, 3 stages, 16 splits, no register cap:
        # 0.0430 ms against the default's 0.0528, read_ahead-3ce5ff5): stages, splits, tiles and warps
        if name.startswith("short16k"):
            ahead = dict(TABLE_AHEAD=(True,), MAX_REGS=(None,))
            return (grid(**ahead, num_warps=(8,), TILE_N=(64,), num_stages=(2, 3, 4), NUM_SPLITS=(8, 16, 32))
                    + grid(**ahead, num_warps=(8,), TILE_N=(128,), num_stages=(2, 3), NUM_SPLITS=(8, 16))
                    + grid(**ahead, num_warps=(4,), TILE_N=(64,), num_stages=(3,), NUM_SPLITS=(16, 32))
                    + grid(**ahead, num_warps=(16,), TILE_N=(64, 128), num_stages=(3,),
                           NUM_SPLITS=(8, 16)))  # fmt: skip
        return []
    if MODE == "ahead3":  # decode over the engine's short contexts (576 keys, 8k-wide graph tables): its batch-64
        # attention took 57 us a layer against cuDNN's 42 (gpu_engine_7fb1cdd), over 4-5 tiles of 128 keys
        if name.endswith("576w8k"):
            return (grid(TABLE_AHEAD=(True,), TILE_N=(32, 64), num_stages=(2, 3, 4), num_warps=(4,))
                    + grid(TABLE_AHEAD=(True,), TILE_N=(128,), num_stages=(2,), num_warps=(4, 8)))  # fmt: skip
        return []
    if MODE == "ahead4":  # decode's candidates from part rag20 at every decode case (the engine's graph tables are
        # 8k wide, so one config serves short and long contexts): 32-key tiles at 2 or 3 stages, the block ids ahead
        if name.startswith(("b1x", "b64x")):
            return grid(TABLE_AHEAD=(True,), TILE_N=(32,), num_stages=(2, 3), num_warps=(4,))
        return []
    if MODE == "rel37":  # split decode's stages, tiles, register cap and splits at the RAG table's decode shape
        # (32 x 2,200 keys: 2 splits, 2 stages by default then), and beside them REL_ROPE (7492bcd, removed after:
        # keys rotated by their offset in a tile, queries by the tile's start, one table row a tile): slower in every
        # case, best config against best 1.06x (1 x 8k) to 1.30x (64 x 576) (b32 83.4 us against 76.0, 64 x 8k 0.645 ms
        # against 0.511; ptxas: 311 instructions a body iteration against 286, 192 registers against 134;
        # read_profile_7492bcd_rel37.json)
        if name.startswith("b32x2200"):
            return grid(TILE_N=(32, 64), num_stages=(2, 3), NUM_SPLITS=(1, 2, 4), MAX_REGS=(None, 128))
        if name.startswith(("b1x", "b64x")):
            return grid(TILE_N=(32,), num_stages=(2, 3), MAX_REGS=(None, 128))
        return []
    if MODE == "w8t64":  # for a batch-1 decode: 64-key tiles of 8 warps, which with int32 offsets take 128 registers
        # and no spill (ptxas sm_90a, Triton 3.6), 280 SASS instructions a warp for 64 keys where 4 warps take 269 for
        # 32 (4 warps at 64 keys: 168 registers), 32 splits in one wave of 2 programs an SM; and 2 warps of 32-key
        # tiles again (best at 1 x 8k in next70, before ONE_TOKEN_SEQS and int32 offsets): 184 registers, 422
        # instructions a warp a tile where 4 warps take 269 each (844 against 1,076 a tile). Slower at every shape in
        # next80 (read_profile_029b6e6_h200_next80_w8t64.json): 1 x 8k 16.0-24.6 us at 8 warps, 14.4 / 19.0 at 2
        # warps and 64 / 128 splits, against the stored config's 13.6
        if name.startswith("b1x"):
            return grid(TILE_N=(64,), num_warps=(8,), num_stages=(2, 3), NUM_SPLITS=(32, 64)) + grid(
                TILE_N=(32,), num_warps=(2,), num_stages=(2,), NUM_SPLITS=(64, 128)
            )
        return []
    if MODE == "s16":  # 16-key tiles for a decode: 128 registers and no spill up to 5 stages (ptxas sm_90a, Triton
        # 3.6: 41 / 54 KB of shared memory at 4 / 5 stages, so 4 programs an SM still fit), where 32-key tiles at 3
        # stages take 162 registers (3 programs an SM; they lost in next74). Slower at every shape in next77
        # (read_profile_cbc5a4c_h200_s16.json): 288 instructions a loop iteration against 314 for twice the keys
        if name.startswith("b1x"):
            return grid(TILE_N=(16,), num_stages=(3, 4, 5), NUM_SPLITS=(32, 64)) + grid(
                TILE_N=(32,), num_stages=(2,), NUM_SPLITS=(64,), MAX_REGS=(128,)
            )
        if name == "b64x576w8k":  # the engine's batch-64 decode: 16-key tiles unsplit, or in two splits
            return grid(TILE_N=(16,), num_stages=(3, 4, 5), NUM_SPLITS=(1, 2))
        return []
    if MODE == "s64":  # 64 splits of 4 warps: with ONE_TOKEN_SEQS a split decode takes 128 registers (140 before), so
        # 4 programs an SM and 1 x 8k's 512 programs fit one wave (3 an SM before: 396 at once, then a tail)
        if name.startswith("b1x"):
            return grid(NUM_SPLITS=(32, 64), num_stages=(2, 3), MAX_REGS=(None, 128))
        return []
    if MODE == "w1":  # one or two warps a program (the softmax's row max and sum then cross no warp; more splits
        # fill the GPU): a read with no math takes 7.0 us at 1 x 8k where the op takes 16.8 (read_floor_bfb41b5.json)
        if name.startswith("b1x8k"):
            return grid(num_warps=(1, 2), TILE_N=(32, 64), num_stages=(2, 3), NUM_SPLITS=(32, 64, 128))
        if name == "b1x576w8k":
            return grid(num_warps=(1, 2), TILE_N=(32,), num_stages=(2, 3), NUM_SPLITS=(8, 16, 32))
        if name == "b64x576w8k":
            return grid(num_warps=(1, 2), TILE_N=(32, 64), num_stages=(2, 3), NUM_SPLITS=(1, 2))
        return []
    if MODE == "w16":  # 16 warps (4 warpgroups) on one tile, fewer iterations (ptxas: 32-key tiles at 126
        # registers without spilling, 64-key tiles spill 80-88 bytes at 128), not yet run
        if name.startswith("short16k"):
            return grid(TILE_N=(32, 64), num_warps=(16,), num_stages=(2, 3), NUM_SPLITS=(16, 32), MAX_REGS=(128,))
        return []
    if MODE == "warps":  # 8 warps beside 4 (the sweeps above had 4 only for these reads)
        return {
            "short16k": grid(TILE_N=(32, 64), num_warps=(4, 8), num_stages=(2, 3), NUM_SPLITS=(16, 32)),
            "short16k_cold": grid(TILE_N=(32,), num_warps=(4, 8), num_stages=(2, 3), NUM_SPLITS=(32, 64)),
            "b1x8k": grid(TILE_N=(64, 128), num_warps=(4, 8), num_stages=(3, 4), NUM_SPLITS=(32,)),
        }.get(name, [])
    if MODE == "deep":  # few splits, deep pipelines (issue 13's batch-1 decode): one program of 4 warps an SM (8 kv
        # heads x 16 splits = 128 programs) streaming 512 keys through 4-6 stages of 32-key tiles, where the defaults'
        # 512 programs each read 128 keys through 2 stages, their latency chain (position, block ids, keys) paid by
        # every one; and a 16-split merge in place of 64 (ncu, 87b1122: 74% of cycles no warp eligible). Slower at
        # every point (read_profile_b975e27_h100_deep.json, H100): 15.7 us at best (64-key tiles, 16 splits, 3
        # stages), 19.6-34.8 at the others, against the defaults' 14.09 (SDPA 12.43): more bytes in flight a program
        # do not make up for 4x fewer programs
        if name.startswith("b1x8k"):
            return grid(TABLE_AHEAD=(True,), TILE_N=(32,), NUM_SPLITS=(8, 16), num_stages=(4, 6)) + grid(
                TABLE_AHEAD=(True,), TILE_N=(64,), NUM_SPLITS=(8, 16), num_stages=(3, 4)
            )
        return []
    if MODE == "w2":  # 2 warps beside 4 at the current defaults (64 splits, the merge by 32-dim chunks): at 029b6e6
        # and 7c9d222 2 warps had won on the H200 (14.44 against 15.26 us; 15.57 against 17.00), before 4 warps took
        # 64 splits at 128 registers. H100 (read_profile_04f83b6_h100_w2.json): no change past the spread, 2 against 4
        # warps (32-key tiles, 64 splits, 2 stages) 13.60 / 14.00 us at 1 x 8k, cold 19.62 / 19.06, 1 x 576 keys in
        # 8k-wide tables 6.38 / 6.21, 1 x 32k 55.36 / 55.79; 128 splits and 3 stages slower everywhere
        if name.startswith("b1x"):
            return grid(num_warps=(2, 4), TILE_N=(16, 32), num_stages=(2, 3), NUM_SPLITS=(64, 128))
        return []
    if MODE == "splitids":  # a split's block ids read once before its loop (SPLIT_IDS): no load in the key loop, so
        # Triton's pipelining may keep 2-3 tiles in flight without a block-id load between them (ncu, e368785: at 2
        # stages every tile's copies waited for whole, and the ids carried a tile ahead waited at the back edge)
        if name.startswith("b1x"):
            return grid(SPLIT_IDS=(False, True), num_stages=(2, 3, 4), TILE_N=(16, 32), NUM_SPLITS=(32, 64))
        if name.startswith("short16k"):
            return grid(SPLIT_IDS=(False, True), num_stages=(2, 3), NUM_SPLITS=(16, 32))
        return []
    if MODE == "merge":  # the split merge's dims cut over programs (MERGE_D_CHUNK; 0: one program a (token, head))
        # and its warps: a batch-1 decode merges 64 splits in 32 programs of 4 warps (2.13 us of 15.25 on the H100)
        if name.startswith(("b1x", "short16k")):
            return grid(MERGE_D_CHUNK=(0, 64, 32, 16), MERGE_WARPS=(1, 2, 4))
        return []
    if MODE != "1":  # NOTE: every named sweep returned above: a name that reaches here is a typo, not the default
        raise ValueError(f"READ_SWEEP={MODE}: no such sweep (0, 1 or a name in sweep_for)")
    if name == "short16k_cold":
        return grid(TILE_N=(32, 64), num_stages=(2, 3, 4), NUM_SPLITS=(32, 64, 128))
    if name == "b1x8k_cold":
        return grid(TILE_N=(64, 128), num_stages=(2, 3, 4), NUM_SPLITS=(32, 64))
    if name.startswith("short16k_"):
        return []
    if name == "short16k":
        return grid(BLOCK_M=(64, 128), TILE_N=(32, 64), num_warps=(4,), num_stages=(2, 3), NUM_SPLITS=(16, 32, 64))
    if name == "b1x8k":
        return grid(TILE_N=(64, 128), num_stages=(2, 3, 4), NUM_SPLITS=(32, 64), num_warps=(4,))
    if name == "b1x576w8k":
        return grid(TILE_N=(32, 64, 128), num_stages=(2, 3), NUM_SPLITS=(1, 4, 8, 16, 32), num_warps=(4,))
    if name.startswith("b32x2200w8k"):
        return grid(TILE_N=(32, 64, 128), num_stages=(2, 3), NUM_SPLITS=(1, 2, 4), num_warps=(4, 8))
    if name == "b64x576w8k":
        return grid(TILE_N=(32, 64, 128), num_stages=(2, 3, 4), num_warps=(4, 8), NUM_SPLITS=(1, 2))
    return grid(TILE_N=(64, 128), num_stages=(2, 3, 4), num_warps=(4, 8))


def kernel_times(fn, calls: int = 20) -> dict:
    """Mean device time per call of each kernel (torch profiler)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return {
        e.key[:80]: e.device_time_total / calls / 1e3  # ms per call
        for e in prof.key_averages()
        if e.device_type.name == "CUDA" and e.device_time_total > 0
    }


# READ_SWEEP: 1 (the default) each case's sweep below, 0 each case's defaults only, or one of the named sweeps
MODE = os.environ.get("READ_SWEEP", "1")
SWEEP = MODE != "0"  # NOTE: a named sweep is known by `sweep_for` alone (a second list of names here missed s16 once)
COLD_COPIES = 6  # `_cold` cases: each call reads the next of this many copies, so K and V come from DRAM, not L2


def measure(name: str, clock: Clock, device) -> dict:
    """`<case>_cold`: the case on COLD_COPIES copies of its inputs, each call reading them in turn (an engine
    reads each layer's K and V once a step: its reads are cold; a repeated call on one copy finds much of it in
    the 60 MB L2); times are per copy."""
    base, copies = (name[: -len("_cold")], COLD_COPIES) if name.endswith("_cold") else (name, 1)
    inputs = [case_args(base, device) for _ in range(copies)]
    args = inputs[0]
    expected = rope_paged_attention_torch(*args).float()
    default = config_for(args, triton_kernel.SHORT_PREFILL_ROWS)

    def run(config, every: bool = False):
        outs = [triton_kernel.rope_paged_attention_triton(*a, config=config) for a in (inputs if every else [args])]
        return outs[0]

    def clock_all(fn_all) -> float:
        return clock(fn_all) / copies

    def timed(config) -> dict:
        try:
            err = (run(config).float() - expected).abs().max().item()
            return dict(config=config, ms=clock_all(lambda: run(config, every=True)), max_err=err)
        except Exception as exc:  # noqa: BLE001 -- a config may not fit (shared memory, registers)
            return dict(config=config, error=f"{type(exc).__name__}: {str(exc)[:160]}")

    stored = [[*a[:8], None, *a[9:]] for a in inputs]
    kernels = kernel_times(lambda: run(default, every=True))
    row = dict(case=name, default=timed(default), kernels={k: v / copies for k, v in kernels.items()})
    row["keys_as_stored_ms"] = clock_all(
        lambda: [triton_kernel.rope_paged_attention_triton(*a, config=default) for a in stored]
    )
    stored_config = config_for(stored[0], triton_kernel.SHORT_PREFILL_ROWS)  # what the vanilla engine picks
    row["keys_as_stored_own_config"] = dict(
        config=stored_config,
        ms=clock_all(lambda: [triton_kernel.rope_paged_attention_triton(*a, config=stored_config) for a in stored]),
    )
    row["sweep"] = [timed({**default, **extra}) for extra in (sweep_for(name) if SWEEP else [])]
    row["best"] = min((e for e in row["sweep"] if "ms" in e), key=lambda e: e["ms"], default=None)
    if not base.startswith("short16k"):
        batch, length = DECODE_CASES[base]
        fns = [sdpa_baselines("decode", batch, length, HEADS, device)["default"] for _ in range(copies)]
        sdpa_all = lambda: [fn() for fn, _ in fns]  # noqa: E731
        sdpa_kernels = kernel_times(sdpa_all)
        row["sdpa_default"] = dict(note=fns[0][1], ms=clock_all(sdpa_all),
                                   kernels={k: v / copies for k, v in sdpa_kernels.items()})  # fmt: skip
    return row


def measure_between_gemms(name: str, device) -> dict:
    """`<case>_gemm`: the case's attention kernel timed alone and with a weight-streaming GEMM before each call, as in
    a forward (17 tokens x a 4096 x 14336 bf16 weight: 117 MB read, like one MLP projection of the 8B shape).
    Inside the engine the short read took 71-82 us a layer where this bench reads it in 56 us
    (ttft_spans-07fdb5a-cuda.json): is it what runs around it (clocks, L2, the memory system), or the call itself?"""
    base = name[: -len("_gemm")]
    args = case_args(base, device)
    x = torch.randn(len(args[0]), 4096, device=device, dtype=torch.bfloat16)
    weights = [torch.randn(4096, 14336, device=device, dtype=torch.bfloat16) for _ in range(4)]  # > L2 together

    def attention():
        return triton_kernel.rope_paged_attention_triton(*args)

    def with_gemms():
        for w in weights:
            x @ w
            attention()

    alone = kernel_times(lambda: [attention() for _ in weights])
    mixed = kernel_times(with_gemms)
    return dict(case=name, alone={k: v / len(weights) for k, v in alone.items()},
                between_gemms={k: v / len(weights) for k, v in mixed.items()})  # fmt: skip


def run_case(name: str, calls: int, device) -> None:
    """A few calls of one case (ncu picks the kernels it is told to)."""
    if name.startswith("sdpa_"):
        fn, _ = sdpa_baselines("decode", 1 if "b1" in name else 64, 8192, HEADS, device)["default"]
    else:
        args = case_args(name, device)
        fn = lambda: triton_kernel.rope_paged_attention_triton(*args)  # noqa: E731
    fn()  # NOTE: compiles and setup kernels run before ncu starts reading (--profile-from-start off)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", help="only run this case a few times (for ncu)")
    parser.add_argument("--calls", type=int, default=6)
    parser.add_argument("--cases", default="short16k,b1x8k,b64x8k,b1x576w8k,b64x576w8k", help="comma-separated")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    device = torch.device("cuda")
    if args.case:
        return run_case(args.case, args.calls, device)
    clock = Clock(smoke=False)
    result = dict(git_sha=git_sha(), device=torch.cuda.get_device_name())
    result["copy_bandwidth"] = copy_bandwidth(clock, device)
    result["rows"] = []
    for name in args.cases.split(","):
        if name.endswith("_gemm"):
            row = measure_between_gemms(name, device)
            result["rows"].append(row)
            print(name, "alone", row["alone"], "between GEMMs", row["between_gemms"], flush=True)
            continue
        row = measure(name, clock, device)
        result["rows"].append(row)
        best = row["best"] or {}
        print(name, "default", row["default"].get("ms"), "stored", row["keys_as_stored_ms"], "stored, own config",
              row["keys_as_stored_own_config"]["ms"], "best", best.get("ms"),
              best.get("config"), "sdpa", row.get("sdpa_default", {}).get("ms"), flush=True)  # fmt: skip
        print("   kernels", row["kernels"], flush=True)
        for entry in row["sweep"]:
            print("   ", entry.get("ms"), entry.get("max_err"), entry.get("error", ""), entry["config"], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    tag = "" if MODE in ("0", "1") else f"_{MODE}"  # NOTE: a named sweep beside the defaults in one call keeps both
    (args.out / f"read_profile_{result['git_sha']}{tag}.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
