"""Would the `o` projection run faster with its weights in the L2 cache? A question for the cached prompt's step.

In the step of a mostly cached prompt (17 new tokens over 16.7k cached keys, Llama-3-8B shape) the attention read is
latency-bound (~1.8 TB/s of the H200's ~4.2), and the `o` projection after it reads its 32 MiB of weights at 0.57 of
the copy rate. The H200's L2 holds 50 MB. Here, with cuBLAS at 17 rows, each step a replayed CUDA graph after an L2
flush: a projection cold, the same projection again straight after it (its weights in L2 where they fit), and `o`
after a small kernel asked for its weights with L2 prefetches (`cp.async.bulk.prefetch.L2`, Hopper).

Measured at 4b30257 (`bench/results/gpu_l2_prefetch_4b30257_h200.json`): `o` 13.8 us + its split-K reduction 2.2
cold, 9.8 + 2.1 warm; `qkv` (48 MiB) 19.7 cold, 19.1 warm. A small-row cuBLAS projection is bound by more than its
bytes: from L2, `o` gains 4 us of its 16. (That run's cases with the attention read in the graph failed to capture:
the op checks its arguments by default, a host sync.) After a prefetch (73a5cae, `gpu_l2_prefetch_73a5cae_h200.json`)
`o` took 11.0-11.2 + 2.3 us, the prefetch kernel itself 4.5 (bulk), 7.3 (bulk, evict_last) and 9.2 us (a line an
instruction, evict_last). The engine was then tried with
the weights prefetched on a side stream forked before each layer's attention read and joined before `o`, inside the
step graphs (part next57 at 4b30257, `ttft_spans-4b30257-cuda-b32-prefetch-{0,1,plain}.*`; the code is in 4b30257):
with an evict_last hint `o` took 0.345 ms a forward against 0.374 and the read 1.339 against 1.211 (the prefetch's
bytes beside its own); without the hint `o` 0.374 again (the keys and values streaming through the L2 evicted the
weights). A next question of 2 tokens: 7.2 / 7.4 ms against 7.3 without it. Not taken.

    python bench/gpu_l2_prefetch.py            # -> bench/results/gpu_l2_prefetch_<sha>_h200.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
import triton
import triton.language as tl
from provenance import git_sha  # bench/provenance.py, beside this file


@triton.jit
def _l2_prefetch_kernel(base_ptr, dummy_ptr, num_chunks, ASM: tl.constexpr, CHUNK_BYTES: tl.constexpr,
                        CHUNKS_PER_PROGRAM: tl.constexpr):  # fmt: skip
    pid = tl.program_id(0)
    idx = pid * CHUNKS_PER_PROGRAM + tl.arange(0, CHUNKS_PER_PROGRAM)
    idx = tl.where(idx < num_chunks, idx, 0)
    ptrs = base_ptr.to(tl.pointer_type(tl.uint8)) + idx.to(tl.int64) * CHUNK_BYTES
    r = tl.inline_asm_elementwise(ASM, "=r,l", [ptrs], dtype=tl.int32, is_pure=False, pack=1)
    tl.store(dummy_ptr + pid, tl.sum(r, 0), mask=num_chunks < 0)  # NOTE: never stored; keeps the asm alive


MODES = {  # name: (asm, bytes per instruction)
    "bulk_evict_last": ("{ .reg .b64 pol; createpolicy.fractional.L2::evict_last.b64 pol, 1.0; "
                        "cp.async.bulk.prefetch.L2.global.L2::cache_hint [$1], 4096, pol; mov.u32 $0, 0; }", 4096),
    "bulk": ("cp.async.bulk.prefetch.L2.global [$1], 4096; mov.u32 $0, 0;", 4096),
    "line_evict_last": ("prefetch.global.L2::evict_last [$1]; mov.u32 $0, 0;", 128),
}  # fmt: skip


def l2_prefetch(t: torch.Tensor, mode: str, dummy: torch.Tensor, programs: int = 64) -> None:
    asm, chunk = MODES[mode]
    num_chunks = t.numel() * t.element_size() // chunk
    per_program = triton.next_power_of_2(triton.cdiv(num_chunks, programs))
    grid = (triton.cdiv(num_chunks, per_program),)
    _l2_prefetch_kernel[grid](t, dummy, num_chunks, ASM=asm, CHUNK_BYTES=chunk, CHUNKS_PER_PROGRAM=per_program,
                              num_warps=1)  # fmt: skip


def profile_graph(fn, replays: int, names: dict) -> dict:
    """Replay fn's CUDA graph under the profiler; per replay the kernels' durations by role and the span from the
    first kernel after the flush to the last one."""
    graph = torch.cuda.CUDAGraph()
    fn()  # NOTE: compiles and warms up outside the capture
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(5):
        graph.replay()
    torch.cuda.synchronize()
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    kernels = sorted((e for e in prof.events() if e.device_type == DeviceType.CUDA), key=lambda e: e.time_range.start)
    groups, current = [], None
    for e in kernels:
        if "Fill" in e.name or "fill" in e.name:  # the flush starts a replay
            current = []
            groups.append(current)
        elif current is not None:
            current.append(e)
    spans, by_role = [], {}
    for group in groups:
        if not group:
            continue
        spans.append(max(e.time_range.end for e in group) - min(e.time_range.start for e in group))
        seen = {}
        for e in group:  # NOTE: a role's second kernel in a replay (the warm projection) is "<role>#1"
            role = next((r for r, key in names.items() if key in e.name), "gemm")
            seen[role] = seen.get(role, -1) + 1
            key = role if seen[role] == 0 else f"{role}#{seen[role]}"
            by_role.setdefault(key, []).append(e.time_range.end - e.time_range.start)
    return {"span_us": statistics.median(spans), "replays": len(spans),
            "kernels_us": {r: statistics.median(v) for r, v in by_role.items()},
            "kernel_counts": {r: len(v) / max(len(spans), 1) for r, v in by_role.items()}}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replays", type=int, default=40)
    args = parser.parse_args()
    device = torch.device("cuda")
    torch.manual_seed(0)
    hidden = 4096
    w_o = torch.randn(hidden, hidden, device=device, dtype=torch.bfloat16) * 0.02
    w_qkv = torch.randn(6144, hidden, device=device, dtype=torch.bfloat16) * 0.02
    flush = torch.empty(512 << 20, dtype=torch.uint8, device=device)
    dummy = torch.zeros(1024, dtype=torch.int32, device=device)
    x = torch.randn(17, hidden, device=device, dtype=torch.bfloat16)

    def step(weight: torch.Tensor, twice: bool = False, prefetch: str | None = None):
        def fn():
            flush.fill_(1)
            if prefetch is not None:
                l2_prefetch(weight, prefetch, dummy)
            y = x @ weight.t()
            if twice:
                y = x @ weight.t()
            return y

        return fn

    names = {"prefetch": "l2_prefetch"}
    results = {}
    cases = {
        "o_cold": step(w_o),
        "o_twice": step(w_o, twice=True),
        **{f"o_after_prefetch_{m}": step(w_o, prefetch=m) for m in MODES},
        "qkv_cold": step(w_qkv),
        "qkv_twice": step(w_qkv, twice=True),
    }
    for name, fn in cases.items():
        try:
            results[name] = profile_graph(fn, args.replays, names)
        except Exception as e:  # noqa: BLE001 (a mode the GPU refuses is a result too)
            results[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        print(name, json.dumps(results[name]), flush=True)
    sha = git_sha()
    out = Path(__file__).parent / "results" / f"gpu_l2_prefetch_{sha}_h200.json"
    out.write_text(json.dumps({"bench": "gpu_l2_prefetch", "git_sha": sha, "device": torch.cuda.get_device_name(),
                               "results": results}, indent=2) + "\n")  # fmt: skip
    print(f"saved {out}")


if __name__ == "__main__":
    main()
