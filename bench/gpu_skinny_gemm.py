"""A skinny matmul in Triton against cuBLAS at the Llama-3-8B projections (issues 10 and 13): a cached prompt's step
computes 17 rows, a batch-64 decode step 64, and both read every weight once, where cuBLAS reads the small
projections at 0.6-0.8 of the copy rate (`gpu_gemm_l2_ced4645_h200.json`; its tiles leave SMs idle).

The kernel (ops/skinny_matmul.py; launched as a programmatic dependent on Hopper since stop 59) swaps the operands
(out^T = W x^T): the weight's rows fill the tensor cores' 64-row side and x's few rows their narrow side; K may be cut
into splits so that column tiles x splits cover the SMs. Each program streams a [block_n, K / splits] slab of W
through tensor-descriptor (TMA) loads; with splits it stores a float32 partial, and the last program of a column tile
to finish (an atomic count a tile) adds the partials in split order and writes the output (no reduction launch).
Measured at d23dd17 (`gpu_skinny_gemm_d23dd17_h200.json`, no PDL then): 1.02x cuBLAS over a layer's four projections
at 17 and at 64 rows (0.078 ms a step), the fewest splits tried fastest there.

Each variant runs as the engine runs it, replayed in a CUDA graph, over enough copies of the weight that every call
reads it from HBM (not from the 50 MB L2); the figure is the graph's time over its calls (launch gaps inside the
graph included, as in a step). Every config is checked against F.linear first. Prints, per (matmul, rows),
cuBLAS, the best config and its ratio, and the layer's four projections summed.

    python bench/gpu_skinny_gemm.py --out bench/results/gpu_skinny_gemm_<sha>_h200.json   # on the H200
    TRITON_INTERPRET=1 python bench/gpu_skinny_gemm.py --tiny                              # the CPU: runs
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from types import SimpleNamespace

import torch
from provenance import git_sha  # bench/provenance.py, beside this file
from torch.nn import functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from minipic_lite.models.routed_linear import _seconds  # noqa: E402
from ops.skinny_matmul import SkinnyConfig, skinny_linear  # noqa: E402

HIDDEN, INTERMEDIATE, Q, KV = 4096, 14336, 4096, 1024  # Llama-3-8B
SHAPES = {"qkv": (HIDDEN, Q + 2 * KV), "o": (Q, HIDDEN), "gate_up": (HIDDEN, 2 * INTERMEDIATE),
          "down": (INTERMEDIATE, HIDDEN)}  # fmt: skip
# (block_n, block_k, stages)
TILES = [
    (64, 128, 4),
    (64, 128, 6),
    (64, 256, 3),
    (64, 256, 4),
    (128, 128, 3),
    (128, 128, 4),
    (128, 256, 2),
    (128, 256, 3),
]
SPLITS = (1, 2, 3, 4, 6, 8, 12, 16)
NUM_SMS = 132
L2_BYTES = 50 << 20


def configs(k_in: int, n_out: int, tiny: bool) -> list[SkinnyConfig]:
    """Per tile shape, the (up to 3) split counts whose programs come nearest 1-4 waves of NUM_SMS."""
    if tiny:
        return [SkinnyConfig(64, 32, s, 2) for s in (1, 2)]
    out = []
    for bn, bk, stages in TILES:
        tiles = -(-n_out // bn)
        splits = [s for s in SPLITS if k_in % (s * bk) == 0 and tiles * s <= 4 * NUM_SMS]
        splits.sort(key=lambda s: abs(tiles * s / NUM_SMS - round(max(1, tiles * s / NUM_SMS))) + 0.01 * s)
        out += [SkinnyConfig(bn, bk, s, stages) for s in sorted(splits[:3])]
    return out


def graph_seconds(fn, x: torch.Tensor, ws: list[torch.Tensor]) -> float:
    """Seconds a call: one CUDA graph calling fn(x, w) for every w in turn (the engine's start-up probe's timer,
    `routed_linear._seconds`), over the number of calls; on the CPU the calls run once and time nothing."""
    if not x.is_cuda:
        for w in ws:
            fn(x, w)
        return float("nan")
    group = [SimpleNamespace(weight=w, bias=None) for w in ws]
    return _seconds(lambda x, w, bias: fn(x, w), group, x) / len(ws)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="small shapes on the CPU (checks the script runs)")
    parser.add_argument("--rows", default="17,64")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    device, dtype, scale = ("cpu", torch.float16, 64) if args.tiny else ("cuda", torch.bfloat16, 1)
    copy_gbps = float("nan")
    if device == "cuda":
        from bench.gpu_engine import ceilings

        copy_gbps = ceilings(device)["copy_gbps"]
    results = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "copy_gbps": copy_gbps,
               "git_sha": git_sha(), "rows": []}  # fmt: skip
    print(f"copy {copy_gbps:.0f} GB/s")
    per_rows = {}
    for name, (k_in, n_out) in SHAPES.items():
        k_in, n_out = k_in // scale, n_out // scale
        weight_bytes = k_in * n_out * 2
        copies = 2 if args.tiny else max(4, -(-2 * L2_BYTES // weight_bytes))
        ws = [torch.randn(n_out, k_in, device=device, dtype=dtype) for _ in range(copies)]
        for rows in map(int, args.rows.split(",")):
            x = torch.randn(rows, k_in, device=device, dtype=dtype)
            reference = F.linear(x.float(), ws[0].float())
            cublas = graph_seconds(lambda x, w: F.linear(x, w), x, ws)
            tried = []
            for cfg in configs(k_in, n_out, args.tiny):
                counts = torch.zeros(-(-n_out // cfg.block_n), device=device, dtype=torch.int32)
                fn = lambda x, w, cfg=cfg, counts=counts: skinny_linear(x, w, cfg, counts)  # noqa: E731
                try:
                    check(fn(x, ws[0]), reference)
                    seconds = graph_seconds(fn, x, ws)
                    check(fn(x, ws[0]), reference)  # again after the replays: each call left its counts at zero
                except Exception as e:  # noqa: BLE001 (a config past the shared memory: left out, said why)
                    print(f"  {name} {rows} {cfg}: {type(e).__name__}: {str(e)[:120]}")
                    continue
                tried.append({"config": _fields(cfg), "us": seconds * 1e6})
            best = min(tried, key=lambda t: t["us"]) if tried else None
            row = {"matmul": name, "rows": rows, "cublas_us": cublas * 1e6, "weight_bytes": weight_bytes,
                   "best": best, "tried": tried}  # fmt: skip
            results["rows"].append(row)
            ours = best["us"] if best else float("nan")
            per_rows.setdefault(rows, [0.0, 0.0])
            per_rows[rows][0] += cublas * 1e6
            per_rows[rows][1] += min(ours, cublas * 1e6)
            gbps = weight_bytes / ours / 1e3 if best else float("nan")
            cublas_of_copy = weight_bytes / cublas / 1e9 / copy_gbps
            print(f"{name:>8} {rows:>3} rows: cuBLAS {cublas * 1e6:7.1f} us ({cublas_of_copy:.2f} of copy), skinny "
                  f"{ours:7.1f} us ({gbps / copy_gbps:.2f}), {cublas * 1e6 / ours:.2f}x  "
                  f"{best and best['config']}")  # fmt: skip
        del ws
    for rows, (cub, ours) in per_rows.items():
        print(f"a layer's four projections at {rows} rows: cuBLAS {cub:.1f} us, the faster of the two each "
              f"{ours:.1f} us ({cub / ours:.3f}x; x32 layers: {(cub - ours) * 32 / 1e3:.3f} ms a step)")  # fmt: skip
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
        print(f"saved {args.out}")


def check(got: torch.Tensor, reference: torch.Tensor) -> None:
    torch.testing.assert_close(got.float(), reference, atol=2e-2 * reference.abs().max().item(), rtol=0)


def _fields(cfg) -> dict:
    return {f: getattr(cfg, f) for f in cfg.__slots__}


if __name__ == "__main__":
    main()
