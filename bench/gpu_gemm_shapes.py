"""The decode step's matmuls on their own: how close cuBLAS reads the weights to the copy rate (issue 13).

Decode at batch 1 reads every weight once a step, so its roofline is the weights over the copy bandwidth; the
engine's batch-1 profile puts the four projections of a layer at 113 us against ~104 us of weights at that rate,
and cuBLAS adds a split-K reduction kernel after two of them (`dyn24-*`). This times each projection of the
Llama-3-8B shape (and the LM head) at the engine's decode and short-prefill row counts, as the engine calls it
(`F.linear(x, W)`) beside the same product with the operands swapped (`(W @ x^T)^T`, which hands cuBLAS another
shape to choose a kernel for) and, for one row, `torch.mv`; each timed by its kernels' device time (as in a CUDA
graph, where the engine runs them) with the kernels it launched; and `F.linear` under max-autotune (at one row
Inductor's tuned reduction, at more rows cuBLAS against Triton's matmul templates). At one row also the product
written as a sum over K (a reduction kernel, one pass over the weights; for `gate_up` also with SiLU·up fused
in). Weights rotate over enough copies that every call reads them from HBM, not from the 50 MB L2. (At a687ea2
the timing was wall time of eager calls back to back: the small projections measured Python's launch time.)

    python bench/gpu_gemm_shapes.py --out bench/results/gpu_gemm_shapes_<sha>_h200.json   # on the H200
    python bench/gpu_gemm_shapes.py --tiny                                                  # the CPU: runs
    python bench/gpu_gemm_shapes.py --split-k --rows 64    # F.linear beside a Triton split-K matmul (16 configs)
    python bench/gpu_gemm_shapes.py --blas --rows 1,17,64  # F.linear through cuBLAS and through cuBLASLt
    python bench/gpu_gemm_shapes.py --few-rows --rows 2,4,8  # cuBLAS beside few-row reductions (weights read once)
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import triton
import triton.language as tl
from torch.nn import functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

HIDDEN, INTERMEDIATE, VOCAB, Q, KV = 4096, 14336, 128256, 4096, 1024  # Llama-3-8B
SHAPES = {  # name: (in_features, out_features)
    "qkv": (HIDDEN, Q + 2 * KV), "o": (Q, HIDDEN), "gate_up": (HIDDEN, 2 * INTERMEDIATE),
    "down": (INTERMEDIATE, HIDDEN), "lm_head": (HIDDEN, VOCAB),
}  # fmt: skip
ROWS = (1, 17, 32, 64)
L2_BYTES = 50 << 20
CALLS = 50


def gemv_as_reduction(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [1, K] @ w [N, K]^T written as a sum over K, so Inductor makes a reduction kernel of it (one pass over w)."""
    return (x[:, None, :].float() * w.float()).sum(-1).to(x.dtype)  # (1, N)


def gemv_silu_as_reduction(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """SiLU(x @ w_gate^T) * (x @ w_up^T) for w = [w_gate; w_up]: both sums in one reduction kernel, no [1, 2I]
    intermediate and no SiLU kernel after it."""
    half = w.shape[0] // 2
    gate = (x[:, None, :].float() * w[:half].float()).sum(-1)
    up = (x[:, None, :].float() * w[half:].float()).sum(-1)
    return (F.silu(gate) * up).to(x.dtype)  # (1, I)


def few_rows_as_reduction(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [M, K] @ w [N, K]^T for a few rows M, as a sum over K laid out [N, M]: the M outputs of a weight row are
    neighbours, so the M lanes that load one weight element read the same address (one pass over w, as the one-row
    reduction makes); returned as its [M, N] transpose (a view)."""
    return (w[:, None, :].float() * x[None, :, :].float()).sum(-1).to(x.dtype).t()


@triton.jit
def _split_k_matmul_kernel(
    x_ptr,  # [M, K]
    w_ptr,  # [N, K]
    part_ptr,  # [SPLITS, M, N] fp32: each split's partial product
    M,
    N,
    k_per_split,  # a multiple of BLOCK_K
    stride_xm,
    stride_wn,
    stride_ps,
    stride_pm,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """x @ w^T over one split of K for one BLOCK_N slice of N: every row of x at once (M <= BLOCK_M), so the
    weights are read once, by (N / BLOCK_N) x SPLITS programs where cuBLAS's tiles give N / 128."""
    pid_n, split = tl.program_id(0), tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = split * k_per_split + tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :]  # [BLOCK_M, BLOCK_K]
    w_ptrs = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :]  # [BLOCK_N, BLOCK_K]
    row_ok, col_ok = offs_m[:, None] < M, offs_n[:, None] < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for _ in range(0, k_per_split, BLOCK_K):
        x = tl.load(x_ptrs, mask=row_ok, other=0.0)
        w = tl.load(w_ptrs, mask=col_ok, other=0.0)
        acc = tl.dot(x, tl.trans(w), acc)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    out_ptrs = part_ptr + split * stride_ps + offs_m[:, None] * stride_pm + offs_n[None, :]
    tl.store(out_ptrs, acc, mask=row_ok & (offs_n[None, :] < N))


def split_k_linear(x: torch.Tensor, w: torch.Tensor, block_n: int, block_k: int, splits: int, stages: int):
    """F.linear(x, w) as `_split_k_matmul_kernel` plus a sum over the splits (torch's reduction kernel)."""
    (m, k), n = x.shape, w.shape[0]
    part = torch.empty(splits, m, n, device=x.device, dtype=torch.float32)
    grid = (triton.cdiv(n, block_n), splits)
    _split_k_matmul_kernel[grid](
        x, w, part, m, n, k // splits, x.stride(0), w.stride(0), part.stride(0), part.stride(1),
        BLOCK_M=max(16, triton.next_power_of_2(m)), BLOCK_N=block_n, BLOCK_K=block_k, num_warps=4, num_stages=stages,
    )  # fmt: skip
    return (part[0] if splits == 1 else part.sum(0)).to(x.dtype)


# (BLOCK_N, BLOCK_K, splits, stages): programs = N / BLOCK_N x splits (qkv at 128: 48 x splits for 132 SMs)
SPLIT_K_CONFIGS = [(bn, 128, s, st) for bn in (64, 128) for s in (1, 2, 4, 8) for st in (3, 4)]
SPLIT_K_TINY = [(16, 16, s, 2) for s in (1, 2)]


def split_k_variants(k_in: int, n_out: int, tiny: bool) -> dict:
    """`--split-k`: one variant a config whose splits cut K into whole BLOCK_K steps."""
    return {
        f"splitk_{bn}_{bk}_{s}_{st}": (lambda x, w, c=(bn, bk, s, st): split_k_linear(x, w, *c))
        for bn, bk, s, st in (SPLIT_K_TINY if tiny else SPLIT_K_CONFIGS)
        if k_in % (s * bk) == 0
    }


def variants(name: str, rows: int) -> dict:
    out = {"linear": lambda x, w: F.linear(x, w), "swapped": lambda x, w: (w @ x.t()).t()}
    # NOTE: max-autotune: for one row Inductor's tuned reduction; for more, cuBLAS against Triton's matmul templates
    out["autotune"] = torch.compile(lambda x, w: F.linear(x, w), dynamic=False, mode="max-autotune-no-cudagraphs")
    if rows == 1:
        out["mv"] = lambda x, w: torch.mv(w, x[0])
        out["reduce"] = torch.compile(gemv_as_reduction, dynamic=False, fullgraph=True)
        if name == "gate_up":
            out["reduce_silu"] = torch.compile(gemv_silu_as_reduction, dynamic=False, fullgraph=True)
    return out


def blas_linear(library: str):
    """F.linear with torch's preferred BLAS library set to `library` for the call (a process-wide setting; on the CPU
    (`--tiny`) plain F.linear)."""

    def fn(x, w):
        if not x.is_cuda:
            return F.linear(x, w)
        before = torch.backends.cuda.preferred_blas_library()
        torch.backends.cuda.preferred_blas_library(library)
        try:
            return F.linear(x, w)
        finally:
            torch.backends.cuda.preferred_blas_library(before)

    return fn


def reference_for(variant: str, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    product = F.linear(x, w).float()
    if variant == "reduce_silu":
        gate, up = product.chunk(2, dim=-1)
        return F.silu(gate) * up
    return product


def kernel_times(fn, xs, ws) -> tuple[float, list[str]]:
    """Device microseconds a call (its kernels' time, summed: launch gaps left out, since back-to-back eager calls
    of the small projections wait on Python, not on the GPU) and the names of the kernels a call launches; the
    weights taken in turn from `ws` (more bytes than L2 holds)."""
    from torch.profiler import ProfilerActivity, profile

    for i in range(3):
        fn(xs[i % len(xs)], ws[i % len(ws)])
    is_cuda = xs[0].is_cuda
    with profile(activities=[ProfilerActivity.CUDA if is_cuda else ProfilerActivity.CPU]) as prof:
        for i in range(CALLS):
            fn(xs[i % len(xs)], ws[i % len(ws)])
        if is_cuda:
            torch.cuda.synchronize()
    kind = "CUDA" if is_cuda else "CPU"
    events = [e for e in prof.key_averages() if e.device_type.name == kind]
    if not is_cuda:
        return float("nan"), [e.key[:60] for e in events]
    return sum(e.self_device_time_total for e in events) / CALLS, [e.key[:60] for e in events if e.count >= CALLS]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="small shapes on the CPU (checks the script runs)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--rows", default=",".join(map(str, ROWS)), help="comma-separated row counts")
    parser.add_argument("--split-k", action="store_true", help="F.linear beside a Triton split-K matmul only")
    parser.add_argument("--l2-warm", action="store_true", help="F.linear only, its weights read from HBM (cold) beside "
                        "the same weight every call (warm: L2 holds those under its size), for what reading the next "
                        "matmul's weights into L2 ahead could save")  # fmt: skip
    parser.add_argument("--few-rows", action="store_true", help="cuBLAS beside the product as a reduction over K "
                        "laid out so that each weight element is read once for every row (few_rows_as_reduction), "
                        "compiled with the one-row probe's options and with Inductor's defaults")  # fmt: skip
    parser.add_argument("--blas", action="store_true", help="F.linear through torch's preferred BLAS library: "
                        "cuBLAS (the default) beside cuBLASLt (TORCH_BLAS_PREFER_CUBLASLT=1), each with its own "
                        "heuristic's kernel")  # fmt: skip
    args = parser.parse_args()
    # NOTE: every (matmul, rows) compiles the same functions again (dynamic=False): past the default limit of 8
    # Dynamo would run them eagerly, and the table would time cuBLAS under another name
    torch._dynamo.config.recompile_limit = 64
    device = "cpu" if args.tiny else "cuda"
    dtype = torch.float32 if args.tiny else torch.bfloat16
    scale = 64 if args.tiny else 1
    from bench.gpu_engine import ceilings

    copy_gbps = ceilings(device)["copy_gbps"]
    results = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "copy_gbps": copy_gbps,
               "rows": []}  # fmt: skip
    print(f"copy {copy_gbps:.0f} GB/s (read + written)")
    print(f"{'matmul':>8} {'rows':>4} {'variant':>8} {'us':>8} {'GB/s':>7} {'of copy':>7}  kernels")
    for name, (k_in, n_out) in SHAPES.items():
        k_in, n_out = k_in // scale, n_out // scale
        weight_bytes = k_in * n_out * torch.finfo(dtype).bits // 8
        copies = max(2, -(-2 * L2_BYTES // weight_bytes))
        ws = [torch.randn(n_out, k_in, device=device, dtype=dtype) for _ in range(copies)]
        for rows in map(int, args.rows.split(",")):
            xs = [torch.randn(rows, k_in, device=device, dtype=dtype) for _ in range(2)]
            table = variants(name, rows) if not args.split_k else {
                "linear": lambda x, w: F.linear(x, w), **split_k_variants(k_in, n_out, args.tiny)}  # fmt: skip
            if args.l2_warm:
                table = {"cold": lambda x, w: F.linear(x, w), "l2_warm": lambda x, w: F.linear(x, w)}
            if args.blas:
                table = {library: blas_linear(library) for library in ("cublas", "cublaslt")}
            if args.few_rows:
                from minipic_lite.models.routed_linear import ONE_ROW_OPTIONS

                table = {
                    "linear": lambda x, w: F.linear(x, w),
                    "rows_tuned": torch.compile(few_rows_as_reduction, dynamic=False, options=ONE_ROW_OPTIONS),
                    "rows_red": torch.compile(few_rows_as_reduction, dynamic=False),
                }
            for variant, fn in table.items():
                reference = reference_for("linear" if args.l2_warm else variant, xs[0], ws[0])
                got = fn(xs[0], ws[0]).float().reshape(reference.shape)
                torch.testing.assert_close(got, reference, atol=2e-2 * reference.abs().max().item(), rtol=0)
                us, kernels = kernel_times(fn, xs, ws[:1] if variant == "l2_warm" else ws)
                gbps = weight_bytes / us / 1e3
                row = {"matmul": name, "rows": rows, "variant": variant, "us": us, "weight_gbps": gbps,
                       "of_copy": gbps / copy_gbps, "kernels": kernels}  # fmt: skip
                results["rows"].append(row)
                print(f"{name:>8} {rows:>4} {variant:>8} {us:8.1f} {gbps:7.0f} {gbps / copy_gbps:7.2f}  "
                      + ", ".join(kernels))  # fmt: skip
        del ws
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
        print(f"saved {args.out}")


if __name__ == "__main__":
    main()
