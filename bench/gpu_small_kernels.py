"""Small kernels of a step on the H200 (issues 10, 13): the split-KV merge, cuBLAS's split-K reduction, and the
residual add + RMSNorm.

A cached 8 x 2,048 prompt's step (17 new tokens in a (2, 32) graph bucket, Llama-3-8B shape) runs ~10 kernels a
layer; its profile (`ttft_spans-785ef88-cuda-b32.json`) holds the merge of the short read's 16 splits at 5.4 us a
layer (the decode's merge of 32 splits takes 2.3) and, after `o` and after `down`, cuBLAS's split-K reduction at
2.0 us each. Here:

- the merge (`ops.triton_kernel._reduce_splits_kernel`) alone at the engine's shapes with 1, 2, 4 (the default) and
  8 warps, each checked against the default's output;
- each projection at 17 and 32 rows as cuBLAS runs it (a graph over copies of the weight that together exceed the
  L2, so each call reads from HBM), and how many kernels a call launches. Run a second time with
  `CUBLAS_WORKSPACE_CONFIG=:0:0 CUBLASLT_WORKSPACE_SIZE=0` (no workspace: no split-K reduction) to see what a
  projection costs without its reduction kernel.

- the residual add + RMSNorm at Llama-3-8B's hidden size (`--norms-only`: 1, 24 and 64 rows, 32 calls a graph as
  a step's layers make them) as Inductor compiles it by default (a looped reduction), with Inductor's
  `triton.multi_kernel` 2 (it may write a persistent reduction beside the looped one and launch the faster), and as a
  hand-written Triton kernel (one program a row, the row in registers), each checked against the eager function.

    python bench/gpu_small_kernels.py [--tag NAME] [--projections-only | --norms-only]   # -> bench/results/...
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_ops import Clock  # noqa: E402
from provenance import git_sha  # noqa: E402

from ops import triton_kernel  # noqa: E402

HIDDEN, INTERMEDIATE, Q, KV = 4096, 14336, 4096, 1024  # Llama-3-8B
PROJECTIONS = {"qkv": (HIDDEN, Q + 2 * KV), "o": (Q, HIDDEN), "gate_up": (HIDDEN, 2 * INTERMEDIATE),
               "down": (INTERMEDIATE, HIDDEN)}  # fmt: skip
# (name, tokens, heads, splits): the short read of the (2, 32) bucket, a batch-1 decode, the RAG table's decode step
MERGES = [("short_read_2x32", 32, 32, 16), ("decode_b1", 1, 32, 32), ("decode_b32_2200", 32, 32, 2)]
L2_BYTES = 50 << 20


def merge(parts, out, num_warps: int) -> None:
    triton_kernel.merge_splits(out, *parts, num_warps=num_warps)


def measure_merges(clock: Clock, device) -> dict:
    results = {}
    for name, tokens, heads, splits in MERGES:
        g = torch.Generator(device).manual_seed(0)
        parts = (torch.randn(tokens, heads, splits, 128, device=device, generator=g),
                 torch.randn(tokens, heads, splits, device=device, generator=g) * 4,
                 torch.rand(tokens, heads, splits, device=device, generator=g) + 0.5)  # fmt: skip
        reference = torch.empty(tokens, heads, 128, device=device, dtype=torch.bfloat16)
        merge(parts, reference, 4)
        row = {}
        for num_warps in (1, 2, 4, 8):
            out = torch.empty_like(reference)
            merge(parts, out, num_warps)
            torch.cuda.synchronize()
            same = torch.equal(out, reference)
            row[num_warps] = {"us": 1e3 * clock(lambda nw=num_warps, o=out, p=parts: merge(p, o, nw)), "same": same}
        results[name] = row
        print(name, json.dumps(row), flush=True)
    return results


def replayed(one_pass, calls: int) -> tuple[float, list]:
    """`one_pass` (warmed up) captured as a CUDA graph: the median microseconds a call over 20 replays (`calls` calls
    a pass), and torch.profiler's averages of one more replay."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        one_pass()
    times = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    return sorted(times)[len(times) // 2], list(prof.key_averages())


def measure_projections(device) -> dict:
    results = {}
    for name, (k, n) in PROJECTIONS.items():
        weight_bytes = k * n * 2
        copies = max(2, -(-3 * L2_BYTES // weight_bytes))
        weights = [torch.randn(n, k, device=device, dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
        for rows in (17, 32):
            x = torch.randn(rows, k, device=device, dtype=torch.bfloat16)

            def one_pass(x=x, weights=weights):
                for w in weights:
                    torch.mm(x, w.t())

            one_pass()
            us, events = replayed(one_pass, copies)
            kernels = {e.key[:70]: e.count / copies for e in events if e.self_device_time_total > 0}
            results[f"{name}_{rows}"] = {"us_per_call_median": us, "kernels_per_call": kernels}
            print(name, rows, json.dumps(results[f"{name}_{rows}"]), flush=True)
    return results


@triton.jit
def _add_rms_norm_kernel(x_ptr, delta_ptr, weight_ptr, sum_ptr, out_ptr, eps, N: tl.constexpr, BLOCK: tl.constexpr):
    """One row a program: sum = x + delta (in the input dtype), out = weight * (sum * rsqrt(mean(sum^2) + eps)), the
    statistics in float32 and the scaled row rounded to the input dtype before the weight (as `add_rms_norm`)."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    # NOTE: 16-bit products and sums written as float32 ones rounded once, as torch computes them (and as the
    # interpreter, which has no bfloat16 arithmetic, can run them)
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=0.0)
    delta = tl.load(delta_ptr + row * N + cols, mask=mask, other=0.0)
    total = (x.to(tl.float32) + delta.to(tl.float32)).to(x.dtype)
    tl.store(sum_ptr + row * N + cols, total, mask=mask)
    h = total.to(tl.float32)
    h = h * tl.rsqrt(tl.sum(h * h, axis=0) / N + eps)
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * N + cols, (weight * h.to(x.dtype).to(tl.float32)).to(x.dtype), mask=mask)


def triton_add_rms_norm(x, delta, weight, eps):
    total, out = torch.empty_like(x), torch.empty_like(x)
    n = x.shape[-1]
    _add_rms_norm_kernel[(x.shape[0],)](x, delta, weight, total, out, eps, N=n, BLOCK=triton.next_power_of_2(n),
                                        num_warps=8)  # fmt: skip
    return total, out


def measure_norms(device) -> dict:
    """Each variant's microseconds a call (a graph of 32 calls on 32 layers' buffers, median of 20 replays) and the
    kernels it launched, at 1, 24 and 64 rows of Llama-3-8B's hidden size."""
    from minipic_lite.models.llama import add_rms_norm, compile_kernel

    variants = {"looped": compile_kernel(add_rms_norm), "persistent": compile_kernel(add_rms_norm,
                options={"triton.multi_kernel": 2}), "triton": triton_add_rms_norm}  # fmt: skip
    results = {}
    for rows in (1, 24, 64):
        layers = [[torch.randn(rows, HIDDEN, device=device, dtype=torch.bfloat16) for _ in range(2)]
                  + [torch.randn(HIDDEN, device=device, dtype=torch.bfloat16)] for _ in range(32)]  # fmt: skip
        want = add_rms_norm(*layers[0], 1e-5)
        for name, fn in variants.items():
            got = fn(*layers[0], 1e-5)
            torch.testing.assert_close(got[0], want[0])
            torch.testing.assert_close(got[1], want[1], atol=2e-2, rtol=2e-2)
            us, events = replayed(lambda fn=fn, layers=layers: [fn(*args, 1e-5) for args in layers], len(layers))
            kernels = {e.key[:70]: e.self_device_time_total / e.count for e in events if e.self_device_time_total > 0}
            results[f"{name}_{rows}"] = {"us_per_call_median": us, "kernel_us": kernels}
            print(name, rows, json.dumps(results[f"{name}_{rows}"]), flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tag", default="default")
    parser.add_argument("--projections-only", action="store_true")
    parser.add_argument("--norms-only", action="store_true")
    args = parser.parse_args()
    device = torch.device("cuda")
    env = {k: os.environ.get(k) for k in ("CUBLAS_WORKSPACE_CONFIG", "CUBLASLT_WORKSPACE_SIZE")}
    result = {"bench": "gpu_small_kernels", "git_sha": git_sha(), "env": env,
              "device": torch.cuda.get_device_name()}  # fmt: skip
    if args.norms_only:
        result["norms"] = measure_norms(device)
    else:
        if not args.projections_only:
            result["merges"] = measure_merges(Clock(False), device)
        result["projections"] = measure_projections(device)
    out = Path(__file__).parent / "results" / f"gpu_small_kernels_{result['git_sha']}_h200_{args.tag}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"saved {out}")


if __name__ == "__main__":
    main()
