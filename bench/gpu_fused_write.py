"""A decode step's RoPE, K/V write and attention a layer: the engine's two launches (Inductor's compiled
`rope_and_write_kv`, then the op) against `ops.triton_kernel.rope_write_attend`'s one (issue 13: a decode step's
small kernels), on the H200.

Each case replays a CUDA graph of 32 layers, each with its own K/V cache (so every layer reads its keys from HBM, as
the engine's do), and reports microseconds a layer; the two ways' outputs and written caches are checked against
each other first. Cases as `gpu_read_profile.py`'s: a batch-1 and a batch-64 decode over 576 keys in 8k-wide tables
(the engine's graphed decode) and a batch-1 decode over 8k keys.

    python bench/gpu_fused_write.py [--cases b1x576w8k,b64x576w8k,b1x8k] [--out DIR]   # on the H200
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_ops import Clock  # noqa: E402
from gpu_read_profile import HEADS, case_args  # noqa: E402

from minipic_lite.models.llama import Kernels  # noqa: E402
from ops import rope_paged_attention  # noqa: E402
from ops.triton_kernel import rope_write_attend  # noqa: E402

LAYERS = 32


def layer(name: str, device) -> dict:
    """One layer's inputs: the case's problem with K and V in one [2, blocks, B, KVH, D] tensor (the engine's
    layout), and unrotated queries, new keys and values as views of one fused projection's output."""
    args = case_args(name, device)
    n = args[0].shape[0]
    h, kvh, d = HEADS["num_heads"], HEADS["num_kv_heads"], HEADS["head_dim"]
    kv = torch.stack([args[1], args[2]])
    qkv = torch.randn(n, (h + 2 * kvh) * d, device=device, dtype=torch.bfloat16)
    q, k_new, v_new = qkv.split([h * d, kvh * d, kvh * d], dim=-1)
    tables, positions = args[3], args[5].long()
    slots = tables[torch.arange(n, device=device), positions // 16].long() * 16 + positions % 16
    return dict(args=args, kv=kv, q=q.view(n, h, d), k_new=k_new.view(n, kvh, d), v_new=v_new.view(n, kvh, d),
                slots=slots, positions=positions)  # fmt: skip


def separate(layers: list[dict], kernels: Kernels) -> list[torch.Tensor]:
    """As the model: the queries' rotation and the K/V write in one compiled kernel, then the op."""
    outs = []
    for x in layers:
        a, kv = x["args"], x["kv"]
        q = kernels.rope_and_write_kv(x["q"], x["k_new"], x["v_new"], x["positions"], a[8], x["slots"],
                                      kv.flatten(1, 2), False)  # fmt: skip
        outs.append(rope_paged_attention(q, kv[0], kv[1], *a[3:], check=False, num_decode_seqs=q.shape[0]))
    return outs


def fused(layers: list[dict]) -> list[torch.Tensor]:
    outs = []
    for x in layers:
        a, kv = x["args"], x["kv"]
        outs.append(rope_write_attend(x["q"], x["k_new"], x["v_new"], x["slots"], kv[0], kv[1], *a[3:]))
    return outs


def run_case(name: str, kernels: Kernels, clock: Clock, device) -> dict:
    torch.manual_seed(0)
    layers = [layer(name, device) for _ in range(LAYERS)]
    # -- the two ways agree: outputs, and the caches they wrote --
    base = [x["kv"].clone() for x in layers]
    want = separate(layers, kernels)
    written = [x["kv"].clone() for x in layers]
    for x, kv in zip(layers, base, strict=True):
        x["kv"].copy_(kv)
    got = fused(layers)
    torch.cuda.synchronize()
    same_caches = all(torch.equal(x["kv"], w) for x, w in zip(layers, written, strict=True))
    err = max((g.float() - w.float()).abs().max().item() for g, w in zip(got, want, strict=True))
    # -- timed: a graph of 32 layers each way --
    two = clock(lambda: separate(layers, kernels)) * 1e3 / LAYERS
    one = clock(lambda: fused(layers)) * 1e3 / LAYERS
    print(f"{name}: separate {two:.2f} us a layer, fused {one:.2f} ({two / one:.3f}x); max |diff| {err:.3g}, "
          f"caches {'equal' if same_caches else 'DIFFER'}", flush=True)  # fmt: skip
    return {"separate_us": two, "fused_us": one, "ratio": two / one, "max_abs_diff": err, "same_caches": same_caches}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="b1x576w8k,b64x576w8k,b1x8k")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()
    device = torch.device("cuda")
    kernels = Kernels.compiled()
    clock = Clock(smoke=False)
    results = {"device": torch.cuda.get_device_name(), "git_sha": os.environ.get("GIT_SHA", "unknown"), "cases": {}}
    for name in args.cases.split(","):
        results["cases"][name] = run_case(name, kernels, clock, device)
        torch.cuda.empty_cache()
    path = Path(args.out) / f"gpu_fused_write_{results['git_sha']}_h200.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1))
    print(f"saved {path}")


if __name__ == "__main__":
    main()
