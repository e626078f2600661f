"""GPU validation and benchmark of ``ops.rope_paged_attention`` (the Triton kernel), in one run.

    python bench/gpu_ops.py [--sweep] [--out DIR]      # on a CUDA machine; results in $OUT or --out
    TRITON_INTERPRET=1 python bench/gpu_ops.py --smoke  # CPU dry run of the script's logic, tiny shapes

1. Ceilings: device-to-device copy bandwidth (bytes read + written) and a bf16 8192^3 matmul.
2. Validation on the GPU: the kernel (NaN-poisoned output) against the float32 reference (small cases) or the
   vectorized torch impl (large cases): holes, SSEP segments, repeated / shared physical blocks, GQA 1/3/4,
   partial rotary, fp32/fp16/bf16, head_dim 64/128/256, block size 16/32, forced split-KV, int64 offsets
   (a cache of more than 2^31 elements, used blocks at the top).
3. Benchmarks, side by side in the same process: (a) torch SDPA on the same problem unpaged with pre-rotated
   keys (causal for prefill), with torch's default backend choice (cuDNN on the H200: what transformers gets)
   and forced to cuDNN and to flash, (b) the op with ``cos_sin=None`` (keys rotated at write), (c) the op in
   position-free mode with a float32 cos/sin table and (d) with a bf16 table (what the engine passes).
   Llama-3-8B heads (32/8, d=128) and SmolLM2-135M heads (9/3, d=64), bf16, block size 16, shuffled blocks.
   With ``--sweep`` the kernel's tile configs are swept too (best config reported beside the default).

Writes ``gpu_ops.json`` and ``gpu_ops.txt`` and prints the short table last.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import time
import traceback
import zlib

import torch
import torch.nn.functional as F
from provenance import git_sha  # bench/provenance.py, beside this file

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ops import rope_paged_attention  # noqa: E402
from ops.rope import rope_cos_sin  # noqa: E402
from ops.testing import Problem, SeqSpec, make_problem  # noqa: E402
from ops.triton_kernel import pick_config, rope_paged_attention_triton  # noqa: E402

LLAMA = dict(num_heads=32, num_kv_heads=8, head_dim=128)
SMOL = dict(num_heads=9, num_kv_heads=3, head_dim=64)
# --sweep candidates (run 1, bench/results/gpu_ops_cd5f0ee_h200*, swept the paged kernel and 12 dense configs;
# the defaults now take its best two). Prefill, dense kernel: (BLOCK_M, TILE_N, num_warps, num_stages, WARP_SPECIALIZE)
PREFILL_SWEEP = [
    dict(DENSE=True, BLOCK_M=m, TILE_N=n, num_warps=w, num_stages=s, WARP_SPECIALIZE=ws)
    for m, n, w, s, ws in [
        (64, 64, 4, 3, False), (128, 128, 8, 3, True), (64, 64, 4, 3, True), (64, 64, 4, 2, False),
        (64, 128, 4, 3, False), (128, 64, 8, 3, False),
    ]
]  # fmt: skip
# the dense kernel's launch order: every kv head's last query tiles first (HEADS_FIRST) or one head's tiles after
# another's, at both default tiles
ORDER_SWEEP = [
    dict(DENSE=True, BLOCK_M=m, TILE_N=n, num_warps=w, num_stages=3, WARP_SPECIALIZE=ws, HEADS_FIRST=h)
    for m, n, w, ws in [(64, 64, 4, False), (128, 128, 8, True)]
    for h in (False, True)
]
# the dense kernel's tile as two halves sharing each key tile (Q_SPLIT=2, data partitioning), beside the defaults:
# (BLOCK_M of both halves, TILE_N, num_warps, num_stages, WARP_SPECIALIZE)
HALVES_SWEEP = [
    dict(DENSE=True, BLOCK_M=m, TILE_N=n, num_warps=w, num_stages=s, WARP_SPECIALIZE=ws, Q_SPLIT=q)
    for m, n, w, s, ws, q in [
        (64, 64, 4, 3, False, 1), (128, 128, 8, 3, True, 1),
        (128, 64, 4, 3, False, 2), (128, 64, 4, 3, True, 2), (128, 64, 8, 3, False, 2), (128, 128, 8, 2, False, 2),
        (128, 128, 8, 2, True, 2), (256, 64, 8, 3, False, 2), (256, 64, 8, 3, True, 2), (256, 64, 4, 3, True, 2),
        (256, 128, 8, 2, False, 2), (256, 128, 8, 2, True, 2),
    ]
]  # fmt: skip
# 4k, where the halves lost (0.342 ms against the 64x64 tiles' 0.326 in gpu_ops_b4505cf_h200_halves.json): stages
# and key tiles around both
FOURK_SWEEP = [
    dict(DENSE=True, BLOCK_M=m, TILE_N=n, num_warps=w, num_stages=s, Q_SPLIT=q)
    for m, n, w, s, q in [
        (64, 64, 4, 3, 1), (64, 64, 4, 4, 1), (64, 128, 4, 2, 1), (128, 64, 8, 4, 1), (256, 64, 8, 3, 2),
        (256, 64, 8, 4, 2), (256, 32, 8, 4, 2), (128, 32, 4, 4, 2),
    ]
]  # fmt: skip
# the halves' launch order: one kv head's query tiles after another's (the default past 8 MB of K and V) or every
# head's last (longest) tiles first (HEADS_FIRST): 4k ran 512 programs of 1-64 key tiles, ~4 waves of one an SM
HALVES_ORDER_SWEEP = [
    dict(DENSE=True, BLOCK_M=m, TILE_N=64, num_warps=w, num_stages=3, Q_SPLIT=q, HEADS_FIRST=h)
    for m, w, q, h in [(256, 8, 2, False), (256, 8, 2, True), (64, 4, 1, True)]
]
# decode with the bf16 table: (TILE_N, num_warps, num_stages) x splits
DECODE_SWEEP = [
    dict(TILE_N=n, num_warps=w, num_stages=st, NUM_SPLITS=sp)
    for n, w, st in [(128, 4, 2), (128, 4, 3), (128, 8, 2), (64, 4, 3)]
    for sp in (1, 2)
]
B1_DECODE_SWEEP = [
    dict(TILE_N=n, num_warps=w, num_stages=st, NUM_SPLITS=sp)
    for n, w, st in [(128, 4, 2), (64, 4, 3), (64, 8, 3)]
    for sp in (16, 32, 64)
]
SHORT_DECODE_SWEEP = [  # the engine's decode: ~600-token contexts
    dict(TILE_N=n, num_warps=4, num_stages=st, NUM_SPLITS=sp) for n, st in [(32, 3), (64, 3), (128, 2)] for sp in (1, 8)
]


class Clock:
    """Median GPU time of a callable in ms, or one wall-clock run in smoke mode.

    Replays a CUDA graph of many calls (triton's do_bench_cudagraph), so Python launch overhead (tens of
    microseconds for a small decode) stays out of both the baseline's and the op's numbers; falls back to
    do_bench (L2 flushed between calls) if capture fails. Inputs smaller than the 60 MB L2 stay cached
    between graph replays, for the baseline and the op alike.
    """

    def __init__(self, smoke: bool):
        self.smoke = smoke

    def __call__(self, fn, graph: bool = True) -> float:
        if self.smoke:
            start = time.perf_counter()
            fn()
            return (time.perf_counter() - start) * 1e3
        import triton.testing

        fn()  # compile and warm up outside the capture
        torch.cuda.synchronize()
        if not graph:
            return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
        try:
            return triton.testing.do_bench_cudagraph(fn, rep=50, return_mode="median")
        except Exception:  # noqa: BLE001 -- some callables cannot be captured
            torch.cuda.synchronize()
            return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


# ------------------------------------------------------------------------------------------------------
# 1. ceilings
# ------------------------------------------------------------------------------------------------------


def measure_ceilings(clock: Clock, device) -> dict:
    x = torch.randn(1 << 29, device=device, dtype=torch.bfloat16)  # 1 GiB
    y = torch.empty_like(x)
    # NOTE: timed without a graph: graph-replayed 1 GiB copies read 2.7 TB/s on the H200 (runs 2 and 3 of
    # bench/results), below what the decode kernel itself moves (3.8 TB/s); do_bench read 4.2 TB/s.
    ms = clock(lambda: y.copy_(x), graph=False)
    copy_gbs = 2 * x.numel() * x.element_size() / ms / 1e6
    n = 8192
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    ms = clock(lambda: a @ b, graph=False)
    return {"copy_GBps": copy_gbs, "bf16_matmul_TFLOPs": 2 * n**3 / ms / 1e9}


# ------------------------------------------------------------------------------------------------------
# 2. validation
# ------------------------------------------------------------------------------------------------------


def rel_error(actual: torch.Tensor, expected: torch.Tensor) -> tuple[float, float]:
    diff = actual.float() - expected.float()
    return (diff.norm() / expected.float().norm()).item(), diff.abs().max().item()


TOLERANCE = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 1e-2}  # on ||out - ref|| / ||ref||


def validation_cases(smoke: bool) -> list[dict]:
    mixed = [
        SeqSpec(130, ((0, 16), (48, 80), (112, 130)), ((16, 48), (48, 112))),
        SeqSpec.decode(77),
        SeqSpec(200, ((150, 200),), ((144, 200),)),
        SeqSpec.decode(1),
    ]
    decodes = [SeqSpec.decode(n) for n in (1, 17, 300, 513, 1000, 64, 1500, 2)]
    small = dict(repeat_block=True, share_span=True, reference="ref")
    gqa4 = dict(num_heads=8, num_kv_heads=2, head_dim=128, **small)  # Llama-3's head layout at small scale
    gqa3 = dict(num_heads=9, num_kv_heads=3, head_dim=64, **small)  # SmolLM2's
    cases = [
        dict(name="mixed holes ssep gqa4 bf16 d128", specs=mixed, dtype=torch.bfloat16, **gqa4),
        dict(
            name="mixed gqa3 fp16 d64 B32 rot32", specs=mixed, block_size=32, rotary_dim=32, dtype=torch.float16, **gqa3
        ),  # fmt: skip
        dict(
            name="mixed mha fp32 d256 rot64",
            specs=mixed,
            num_heads=4,
            num_kv_heads=4,
            head_dim=256,
            rotary_dim=64,
            dtype=torch.float32,
            **small,
        ),  # fmt: skip
        dict(
            name="mixed gqa4 bf16 d128 keys-as-stored", specs=mixed, dtype=torch.bfloat16, position_free=False, **gqa4
        ),  # fmt: skip
        dict(name="decode split4 bf16 gqa4", specs=decodes, dtype=torch.bfloat16, config=dict(NUM_SPLITS=4), **gqa4),
        dict(name="mixed BLOCK_M64 fp16 gqa4", specs=mixed, dtype=torch.float16, config=dict(BLOCK_M=64), **gqa4),
        dict(
            name="mixed in-kernel rope bf16 gqa4",
            specs=mixed,
            dtype=torch.bfloat16,
            config=dict(PRE_ROTATE=False),
            **gqa4,
        ),  # fmt: skip
        dict(
            name="decode pre-rotated gqa3 d64 rot32",
            specs=decodes,
            rotary_dim=32,
            dtype=torch.bfloat16,
            config=dict(PRE_ROTATE=True),
            **gqa3,
        ),  # fmt: skip
    ]
    cases += [  # the tensor-descriptor kernel (DENSE, the default for 16-bit prefill on Hopper) and the paged one
        dict(
            name="mixed paged (DENSE off) bf16 gqa4",
            specs=mixed,
            dtype=torch.bfloat16,
            config=dict(DENSE=False),
            **gqa4,
        ),  # fmt: skip
        dict(
            name="mixed dense d256 mha bf16 rot64",
            specs=mixed,
            num_heads=4,
            num_kv_heads=4,
            head_dim=256,
            rotary_dim=64,
            dtype=torch.bfloat16,
            config=dict(DENSE=True, BLOCK_M=64, TILE_N=64),
            **small,
        ),  # fmt: skip
        dict(
            name="mixed dense warp-specialized gqa4",
            specs=mixed,
            dtype=torch.bfloat16,
            config=dict(DENSE=True, BLOCK_M=128, TILE_N=128, num_warps=8, num_stages=2, WARP_SPECIALIZE=True),
            **gqa4,
        ),  # fmt: skip
        dict(
            name="mixed dense gqa3 d64 fp16 B32 stored",
            specs=mixed,
            block_size=32,
            dtype=torch.float16,
            position_free=False,
            config=dict(DENSE=True, BLOCK_M=64, TILE_N=64, num_warps=4, num_stages=3),
            **gqa3,
        ),  # fmt: skip
    ]
    if smoke:
        return cases[:2] + cases[-4:]
    big = dict(reference="torch", dtype=torch.bfloat16, **LLAMA)
    holes = SeqSpec(2048, ((0, 512), (1024, 2048)), ((512, 1536),))
    decode_64 = [SeqSpec.decode(1000 + 16 * i) for i in range(64)]
    chunk_and_decodes = [SeqSpec(1536, ((1024, 1536),))] + [SeqSpec.decode(300 + 37 * i) for i in range(31)]
    smol = dict(specs=[SeqSpec.prefill(1024)], reference="torch", dtype=torch.bfloat16, **SMOL)
    cases += [
        dict(name="prefill 2k holes ssep llama", specs=[holes], **big),
        dict(name="prefill 2k holes in-kernel rope", specs=[holes], config=dict(PRE_ROTATE=False), **big),
        dict(name="decode 64x~2k llama default", specs=decode_64, **big),
        dict(name="decode 64x~2k llama split8", specs=decode_64, config=dict(NUM_SPLITS=8), **big),
        dict(name="mixed chunk512+31 decodes llama", specs=chunk_and_decodes, **big),
        dict(name="prefill 1k smollm2 keys-as-stored", position_free=False, **smol),
        dict(name="prefill 1k smollm2", **smol),
        dict(name="prefill 2k holes ssep paged (DENSE off)", specs=[holes], config=dict(DENSE=False), **big),
        dict(
            name="prefill 4k dense tile 64x64",
            specs=[SeqSpec.prefill(4096)],
            **big,
            config=dict(DENSE=True, BLOCK_M=64, TILE_N=64, num_warps=4, num_stages=3),
        ),  # fmt: skip
        dict(
            name="prefill 4k dense warp-specialized",
            specs=[SeqSpec.prefill(4096)],
            **big,
            config=dict(DENSE=True, BLOCK_M=128, TILE_N=128, num_warps=8, num_stages=2, WARP_SPECIALIZE=True),
        ),
        dict(
            name="prefill 4k dense halves 128x64",
            specs=[SeqSpec.prefill(4096)],
            **big,
            config=dict(DENSE=True, BLOCK_M=128, TILE_N=64, num_warps=4, num_stages=3, Q_SPLIT=2),
        ),
        dict(name="prefill 4k default (the halves, heads first)", specs=[SeqSpec.prefill(4096)], **big),
        dict(
            name="prefill 2k holes ssep dense halves 256x128 warp-specialized",
            specs=[holes],
            **big,
            config=dict(
                DENSE=True, BLOCK_M=256, TILE_N=128, num_warps=8, num_stages=2, WARP_SPECIALIZE=True, Q_SPLIT=2
            ),
        ),
        dict(
            name="chunk 1k at 3k + 3 decodes dense",
            specs=[SeqSpec(3072, ((2048, 3072),))] + [SeqSpec.decode(n) for n in (1000, 2000, 33)],
            **big,
        ),  # fmt: skip
    ]
    return cases


def run_validation_case(case: dict, device) -> dict:
    case = dict(case)
    name, reference, config = case.pop("name"), case.pop("reference"), case.pop("config", None)
    problem = make_problem(device=device, seed=zlib.crc32(name.encode()) % 1000, **case)
    out = torch.full_like(problem.q, float("nan"))  # poisoned: every element must be written
    rope_paged_attention_triton(*problem.args(), config=config, out=out)
    expected = rope_paged_attention(*problem.args(), impl=reference)
    return check_result(name, out, expected, problem.q.dtype, reference)


def check_result(name, out, expected, dtype, reference) -> dict:
    rel, max_abs = rel_error(out, expected)
    ok = bool(torch.isfinite(out).all()) and rel < TOLERANCE[dtype]
    return dict(name=name, reference=reference, rel_err=rel, max_abs_err=max_abs, ok=ok)


def run_int64_case(device) -> dict:
    """A cache of more than 2^31 elements per tensor; the sequences use the highest block ids."""
    block_size, kv_heads, head_dim = 16, 8, 128
    num_blocks = (1 << 31) // (block_size * kv_heads * head_dim) + 2048
    cache_shape = (num_blocks, block_size, kv_heads, head_dim)
    k_cache = torch.randn(cache_shape, device=device, dtype=torch.bfloat16)
    v_cache = torch.randn(cache_shape, device=device, dtype=torch.bfloat16)
    specs = [SeqSpec(1500, ((0, 300), (1200, 1500))), SeqSpec.decode(2000), SeqSpec.decode(777)]
    small = make_problem(specs, num_heads=32, num_kv_heads=kv_heads, head_dim=head_dim, dtype=torch.bfloat16,
                         device=device, seed=7)  # fmt: skip
    top = torch.randperm(2000, device=device)[: small.block_tables.numel()] + (num_blocks - 2000)
    tables = torch.where(small.block_tables >= 0, top.view_as(small.block_tables).int(), -1)
    problem = Problem(small.q, k_cache, v_cache, tables, *small.args()[4:])
    assert int(tables.max()) * block_size * kv_heads * head_dim > 2**31
    out = torch.full_like(problem.q, float("nan"))
    rope_paged_attention_triton(*problem.args(), out=out)
    expected = rope_paged_attention(*problem.args(), impl="torch")
    result = check_result("int64 offsets (cache > 2^31 elems)", out, expected, torch.bfloat16, "torch")
    del k_cache, v_cache, problem
    torch.cuda.empty_cache()
    return result


# ------------------------------------------------------------------------------------------------------
# 3. benchmarks
# ------------------------------------------------------------------------------------------------------


def paged_problem(kind: str, batch: int, length: int, heads: dict, device, dtype=torch.bfloat16):
    """A paged problem built on the device: prefill (one sequence, ``length`` queries) or decode."""
    block_size = 16
    num_heads, num_kv_heads, head_dim = heads["num_heads"], heads["num_kv_heads"], heads["head_dim"]
    blocks_per_seq = math.ceil(length / block_size)
    num_blocks = batch * blocks_per_seq
    tables = torch.randperm(num_blocks, device=device).int().view(batch, blocks_per_seq)
    q_len = length if kind == "prefill" else 1
    num_tokens = batch * q_len
    cu = torch.arange(batch + 1, device=device, dtype=torch.int32) * q_len
    positions = (torch.arange(num_tokens, device=device) % q_len) + (length - q_len)
    cache_shape = (num_blocks, block_size, num_kv_heads, head_dim)
    return Problem(
        q=torch.randn(num_tokens, num_heads, head_dim, device=device, dtype=dtype),
        k_cache=torch.randn(cache_shape, device=device, dtype=dtype),
        v_cache=torch.randn(cache_shape, device=device, dtype=dtype),
        block_tables=tables,
        cu_seqlens_q=cu,
        q_positions=positions.int(),
        kv_lens=torch.full((batch,), length, device=device, dtype=torch.int32),
        visible_start=torch.zeros(num_tokens, device=device, dtype=torch.int32),
        cos_sin=rope_cos_sin(length, head_dim, device=device),
        scale=head_dim**-0.5,
    )


SDPA_BACKENDS = ("default", "cudnn", "flash")


def sdpa_baselines(kind: str, batch: int, length: int, heads: dict, device, dtype=torch.bfloat16) -> dict:
    """torch SDPA on the unpaged problem with pre-rotated keys (causal for prefill), per backend.

    ``default`` is torch's own choice (what transformers gets); ``cudnn`` and ``flash`` force a backend.
    Returns ``{backend: (callable, note)}``; GQA through ``enable_gqa``, or K/V expanded to all heads when a
    backend refuses it.
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel

    num_heads, num_kv_heads, head_dim = heads["num_heads"], heads["num_kv_heads"], heads["head_dim"]
    q_len = length if kind == "prefill" else 1
    q = torch.randn(batch, num_heads, q_len, head_dim, device=device, dtype=dtype)
    k = torch.randn(batch, num_kv_heads, length, head_dim, device=device, dtype=dtype)
    v = torch.randn(batch, num_kv_heads, length, head_dim, device=device, dtype=dtype)
    group = num_heads // num_kv_heads
    k_rep, v_rep = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    causal = kind == "prefill"
    forced = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}

    def make(backend, gqa):
        def call():
            kk, vv = (k, v) if gqa else (k_rep, v_rep)
            ctx = sdpa_kernel(forced[backend]) if backend in forced else contextlib.nullcontext()
            with ctx:
                return F.scaled_dot_product_attention(q, kk, vv, is_causal=causal, enable_gqa=gqa)

        return call

    out = {}
    for backend in SDPA_BACKENDS:
        for gqa, note in ((True, "enable_gqa"), (False, "kv expanded to all heads")):
            fn = make(backend, gqa)
            try:
                fn()
                torch.cuda.synchronize() if device.type == "cuda" else None
            except RuntimeError:
                continue
            out[backend] = (fn, f"{backend}, {note}")
            break
    return out


def sdpa_default_backend(kind: str, batch: int, length: int, heads: dict, device) -> str:
    """Which backend torch's default picks, read off the profiler's kernel names (one call)."""
    fn, _ = sdpa_baselines(kind, batch, length, heads, device)["default"]
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = [e.key for e in prof.key_averages() if e.device_type.name == "CUDA"]
    return ";".join(n[:60] for n in names)


def problem_cost(kind: str, batch: int, length: int, heads: dict) -> tuple[float, float]:
    """(flops, minimal bytes): causal pairs for prefill; K+V read once (+ q, out) for decode."""
    num_heads, num_kv_heads, head_dim = heads["num_heads"], heads["num_kv_heads"], heads["head_dim"]
    q_len = length if kind == "prefill" else 1
    pairs = batch * (length * (length + 1) // 2 if kind == "prefill" else length)
    flops = 4.0 * pairs * num_heads * head_dim
    bytes_ = 2.0 * (2 * batch * length * num_kv_heads * head_dim + 2 * batch * q_len * num_heads * head_dim)
    return flops, bytes_


def op_callable(problem: Problem, position_free: bool, config: dict | None, table_dtype=None):
    args = list(problem.args())
    if not position_free:
        args[8] = None
    elif table_dtype is not None:  # the cos/sin table in the cache dtype (as transformers casts it)
        args[8] = args[8].to(table_dtype)
    if config is None:
        return lambda: rope_paged_attention(*args, impl="triton", check=False)
    return lambda: rope_paged_attention_triton(*args, config=config)


def sweep_configs(kind: str, batch: int, length: int, sweep_set: str = "tiles") -> list[dict]:
    if kind == "prefill":
        return {
            "order": ORDER_SWEEP,
            "halves": HALVES_SWEEP,
            "fourk": FOURK_SWEEP,
            "halves-order": HALVES_ORDER_SWEEP,
        }.get(sweep_set, PREFILL_SWEEP)
    if length <= 1024:
        return SHORT_DECODE_SWEEP
    return B1_DECODE_SWEEP if batch == 1 else DECODE_SWEEP


def default_config(kind: str, batch: int, length: int, heads: dict, device) -> dict:
    q_len = length if kind == "prefill" else 1
    group = heads["num_heads"] // heads["num_kv_heads"]
    max_context = math.ceil(length / 16) * 16
    args = (batch * q_len, batch, heads["num_kv_heads"], group, heads["head_dim"], max_context, True, device)
    return pick_config(*args, table_elem_size=4 if kind == "prefill" else 2)  # decode: as the pf16 column


def run_benchmark(name, kind, batch, length, heads, clock, device) -> dict:
    problem = paged_problem(kind, batch, length, heads, device)
    flops, bytes_ = problem_cost(kind, batch, length, heads)
    row = dict(name=name, kind=kind, batch=batch, length=length, heads=heads, flops=flops, bytes=bytes_)
    row["config"] = default_config(kind, batch, length, heads, device)
    for backend, (fn, note) in sdpa_baselines(kind, batch, length, heads, device).items():
        row[f"sdpa_{backend}_ms"] = clock(fn)
        row[f"sdpa_{backend}_note"] = note
    row["sdpa_ms"] = row.get("sdpa_flash_ms", row.get("sdpa_default_ms"))  # the earlier runs' baseline
    if not clock.smoke and kind == "prefill":
        row["sdpa_default_kernels"] = sdpa_default_backend(kind, batch, length, heads, device)
    row["op_none_ms"] = clock(op_callable(problem, False, None))
    row["op_pf_ms"] = clock(op_callable(problem, True, None))
    # the engine passes the cos/sin table in the model dtype (bf16): the decode kernel reads half the bytes
    row["op_pf16_ms"] = clock(op_callable(problem, True, None, torch.bfloat16))
    return row


def run_sweep(row: dict, clock, device, deadline: float, sweep_set: str = "tiles") -> None:
    """Time the op under each candidate config (until the deadline); fills ``row["sweep"]``.

    Prefill: position-free with the float32 table (``pf``); decode: with the bf16 table, as the engine runs it
    (``pf16``). Each config's output is held to the default config's (``rel_err_vs_default``, ||a - b|| / ||b||)."""
    problem = paged_problem(row["kind"], row["batch"], row["length"], row["heads"], device)
    row["sweep"] = []
    mode, table_dtype = ("pf", None) if row["kind"] == "prefill" else ("pf16", torch.bfloat16)
    expected = op_callable(problem, True, None, table_dtype)()
    for config in sweep_configs(row["kind"], row["batch"], row["length"], sweep_set):
        if time.time() > deadline:
            break
        entry = dict(config=config)
        try:
            fn = op_callable(problem, True, config, table_dtype)
            entry["rel_err_vs_default"] = rel_error(fn(), expected)[0]
            entry[f"{mode}_ms"] = clock(fn)
        except Exception as exc:  # noqa: BLE001 -- a config may not fit (shared memory, registers)
            entry[f"{mode}_ms"] = None
            entry["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        print("  sweep", row["name"], entry, flush=True)
        row["sweep"].append(entry)


SWEPT = (
    "llama decode b64 x 8k",
    "llama prefill 1k",
    "llama prefill 4k",
    "llama decode b64 x 576",
    "llama decode b1 x 8k",
    "llama prefill 16k",
    "smollm2 prefill 16k",
    "llama decode b1 x 576",
    "llama prefill 32k",
)


def benchmark_plan(smoke: bool) -> list[tuple]:
    if smoke:
        return [("smoke prefill", "prefill", 1, 64, SMOL), ("smoke decode", "decode", 4, 80, SMOL)]
    plan = [(f"llama prefill {n // 1024}k", "prefill", 1, n, LLAMA) for n in (1024, 2048, 4096, 8192, 16384, 32768)]
    plan += [(f"llama decode b{b} x {n // 1024}k", "decode", b, n, LLAMA) for b in (1, 16, 64) for n in (1024, 8192)]
    plan += [(f"llama decode b{b} x 576", "decode", b, 576, LLAMA) for b in (1, 64)]  # the engine bench's decode
    plan += [
        ("smollm2 prefill 4k", "prefill", 1, 4096, SMOL),
        ("smollm2 prefill 16k", "prefill", 1, 16384, SMOL),
        ("smollm2 decode b64 x 1k", "decode", 64, 1024, SMOL),
        ("smollm2 decode b64 x 8k", "decode", 64, 8192, SMOL),
    ]
    return plan


# ------------------------------------------------------------------------------------------------------
# report
# ------------------------------------------------------------------------------------------------------


def summarize(row: dict, ceilings: dict) -> dict:
    best = {}
    for entry in row.get("sweep", []):
        for mode in ("pf", "pf16"):
            ms = entry.get(f"{mode}_ms")
            if ms is not None and ms < best.get(mode, (math.inf, None))[0]:
                best[mode] = (ms, entry["config"])
    row["best"] = {mode: dict(ms=ms, config=cfg) for mode, (ms, cfg) in best.items()}
    row["rope_overhead"] = row["op_pf_ms"] / row["op_none_ms"] - 1
    for backend in SDPA_BACKENDS:
        if f"sdpa_{backend}_ms" in row:
            row[f"{backend}_over_pf"] = row[f"sdpa_{backend}_ms"] / row["op_pf_ms"]
            row[f"{backend}_over_pf16"] = row[f"sdpa_{backend}_ms"] / row["op_pf16_ms"]
            row[f"sdpa_{backend}_TFLOPs"] = row["flops"] / row[f"sdpa_{backend}_ms"] / 1e9
            row[f"sdpa_{backend}_GBps"] = row["bytes"] / row[f"sdpa_{backend}_ms"] / 1e6
    for mode in ("none", "pf", "pf16"):
        row[f"{mode}_TFLOPs"] = row["flops"] / row[f"op_{mode}_ms"] / 1e9
        row[f"{mode}_GBps"] = row["bytes"] / row[f"op_{mode}_ms"] / 1e6
        if ceilings.get("copy_GBps"):
            row[f"{mode}_frac_copy"] = row[f"{mode}_GBps"] / ceilings["copy_GBps"]
    return row


def table(rows: list[dict], ceilings: dict) -> str:
    """Prefill rows in TFLOP/s (2 S^2 H d, causal pairs), decode rows in GB/s (K + V read once, q, out)."""
    head = (
        f"{'case':24s} {'default':>8s} {'cudnn':>8s} {'flash':>8s} {'stored':>8s} {'pf':>8s} {'pf16':>8s} "
        f"{'def/pf':>7s} {'fl/pf':>6s} {'def/pf16':>8s} {'rope+%':>6s} {'rate':>14s} {'best ms':>8s}"
    )
    lines = ["ms (median, CUDA graph replay); default/cudnn/flash = torch SDPA backends on the unpaged problem", head]
    lines.append("-" * len(head))
    for r in rows:

        def ms(key, r=r):
            return f"{r[key]:8.3f}" if key in r else f"{'-':>8s}"

        if r["kind"] == "prefill":
            rate = f"{r['pf_TFLOPs']:6.0f}/{r.get('sdpa_default_TFLOPs', 0):4.0f} TF/s"
        else:
            rate = f"{100 * r.get('pf16_frac_copy', 0):5.1f}% copy pf16"
        best = min((b["ms"] for b in r.get("best", {}).values()), default=None)
        lines.append(
            f"{r['name']:24s} {ms('sdpa_default_ms')} {ms('sdpa_cudnn_ms')} {ms('sdpa_flash_ms')} "
            f"{ms('op_none_ms')} {ms('op_pf_ms')} {ms('op_pf16_ms')} {r.get('default_over_pf', 0):7.2f} "
            f"{r.get('flash_over_pf', 0):6.2f} {r.get('default_over_pf16', 0):8.2f} {100 * r['rope_overhead']:6.1f} "
            f"{rate:>14s} {'-' if best is None else f'{best:.3f}':>8s}"
        )
    if ceilings:
        lines.append(
            f"ceilings: copy {ceilings['copy_GBps']:.0f} GB/s (read + write), "
            f"bf16 matmul {ceilings['bf16_matmul_TFLOPs']:.0f} TFLOP/s"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sweep", action="store_true", help="also sweep the kernel's tile configs")
    parser.add_argument("--sweep-rows", default=",".join(SWEPT), help="comma-separated benchmark names to sweep")
    parser.add_argument(
        "--sweep-set",
        default="tiles",
        choices=("tiles", "order", "halves", "fourk", "halves-order"),
        help="prefill configs swept",
    )
    parser.add_argument("--smoke", action="store_true", help="CPU dry run (TRITON_INTERPRET=1), tiny shapes")
    parser.add_argument("--only", default="", help="run only benchmarks whose name contains this")
    parser.add_argument("--skip-validation", action="store_true")
    parser.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    parser.add_argument("--budget-s", type=float, default=400.0, help="stop sweeping after this many seconds")
    args = parser.parse_args()
    start = time.time()
    deadline = start + args.budget_s
    device = torch.device("cpu" if args.smoke else "cuda")
    if args.smoke:
        from ops.testing import patch_interpreter_bf16

        patch_interpreter_bf16()
    os.makedirs(args.out, exist_ok=True)
    clock = Clock(args.smoke)
    report: dict = dict(meta=dict(torch=torch.__version__, smoke=args.smoke))
    if not args.smoke:
        import triton

        report["meta"].update(triton=triton.__version__, device=torch.cuda.get_device_name(), git=git_sha())
    json_path = os.path.join(args.out, "gpu_ops.json")

    def save():
        with open(json_path, "w") as f:
            json.dump(report, f, indent=1, default=str)

    report["ceilings"] = {} if args.smoke else measure_ceilings(clock, device)
    print("ceilings", report["ceilings"], flush=True)
    report["validation"] = []
    for case in [] if args.skip_validation else validation_cases(args.smoke):
        try:
            result = run_validation_case(case, device)
        except Exception:  # noqa: BLE001 -- record and go on: the rest of the run still informs
            result = dict(name=case["name"], ok=False, error=traceback.format_exc()[-800:])
        print("validate", result, flush=True)
        report["validation"].append(result)
        save()
    if not (args.smoke or args.skip_validation):
        try:
            result = run_int64_case(device)
        except Exception:  # noqa: BLE001
            result = dict(name="int64 offsets", ok=False, error=traceback.format_exc()[-800:])
        print("validate", result, flush=True)
        report["validation"].append(result)
    save()
    rows = []
    for name, kind, batch, length, heads in benchmark_plan(args.smoke):
        if args.only not in name:
            continue
        try:
            row = run_benchmark(name, kind, batch, length, heads, clock, device)
        except Exception:  # noqa: BLE001
            print("bench failed", name, traceback.format_exc()[-800:], flush=True)
            continue
        rows.append(summarize(row, report["ceilings"]))
        print("bench", row, flush=True)
        report["bench"] = rows
        save()
    if args.sweep:
        for row in rows:
            if time.time() < deadline and (row["name"] in args.sweep_rows.split(",") or args.smoke):
                run_sweep(row, clock, device, deadline, args.sweep_set)
                summarize(row, report["ceilings"])
                print("sweep best", row["name"], row["best"], flush=True)
                save()
    text = table(rows, report["ceilings"])
    num_ok = sum(r["ok"] for r in report["validation"])
    text += f"\nvalidation: {num_ok}/{len(report['validation'])} cases pass; wall {time.time() - start:.0f} s"
    with open(os.path.join(args.out, "gpu_ops.txt"), "w") as f:
        f.write(text + "\n")
    save()
    print(text)


if __name__ == "__main__":
    main()
