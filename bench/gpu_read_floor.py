"""The floor of a decode's read: its keys and values loaded through the block table with no attention math.

Issue 13 asks for position-free decode at batch 1 x 8k no slower than torch SDPA's default (cuDNN on the H200),
which reads the same bytes unpaged. This bench times, side by side in one process:
- the op's default launch (position-free and keys as stored) and SDPA's default on the unpaged problem;
- a read-only Triton kernel (`_paged_read_kernel`: load each K and V tile, add it up, one float32 row a program)
  over the op's own problem with the blocks shuffled (as the op's benches place them), the same blocks in order,
  and the keys head-major and contiguous (SDPA's layout), each at the fastest of a sweep of splits, tiles, warps
  and stages. Its block ids are read a tile ahead, as the op's TABLE_AHEAD does.

The read kernel's time is what no attention kernel on that layout and grid can beat by much: the rest of the op's
time is its math and its split merge. `_cold` cases cycle through COLD_COPIES copies of the inputs so that K and V
come from HBM (the engine reads a layer's K and V once a step); the others stay in the 60 MB L2 between replays
where they fit (33.5 MB for 1 x 8k), for every kernel alike.

    python bench/gpu_read_floor.py --out DIR      # DIR/read_floor_<sha>.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_ops import Clock, sdpa_baselines  # noqa: E402
from gpu_read_profile import COLD_COPIES, DECODE_CASES, case_args  # noqa: E402
from gpu_short_prefill import HEADS, copy_bandwidth  # noqa: E402
from provenance import git_sha  # noqa: E402

from ops import triton_kernel  # noqa: E402


@triton.jit
def _paged_read_kernel(
    k_ptr, v_ptr, table_ptr, out_ptr, num_keys, tiles_per_split, stride_blk, stride_slot, stride_head, stride_table,
    NUM_KV_HEADS: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, TILE_N: tl.constexpr,
):  # fmt: skip
    """Program (sequence x kv head, split): the sum of its split's keys and values, read through the table."""
    seq = tl.program_id(0) // NUM_KV_HEADS
    head = tl.program_id(0) % NUM_KV_HEADS
    offs_n = tl.arange(0, TILE_N)
    offs_d = tl.arange(0, HEAD_DIM)
    table = table_ptr + seq.to(tl.int64) * stride_table
    tile_begin = tl.program_id(1) * tiles_per_split
    tile_end = tl.minimum(tile_begin + tiles_per_split, tl.cdiv(num_keys, TILE_N))
    acc = tl.zeros([TILE_N, HEAD_DIM], tl.float32)
    ids = tl.load(table + (tile_begin * TILE_N + offs_n) // BLOCK_SIZE, mask=tile_begin * TILE_N + offs_n < num_keys)
    for tile in range(tile_begin, tile_end):
        key_pos = tile * TILE_N + offs_n
        key_ok = key_pos < num_keys
        blocks = ids
        ids = tl.load(table + (key_pos + TILE_N) // BLOCK_SIZE, mask=key_pos + TILE_N < num_keys, other=0)
        rows = blocks.to(tl.int64) * stride_blk + (key_pos % BLOCK_SIZE) * stride_slot + head * stride_head
        ptrs = rows[:, None] + offs_d[None, :]
        k = tl.load(k_ptr + ptrs, mask=key_ok[:, None], other=0.0)
        v = tl.load(v_ptr + ptrs, mask=key_ok[:, None], other=0.0)
        acc += k.to(tl.float32) + v.to(tl.float32)
    tl.store(out_ptr + (tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)) * HEAD_DIM + offs_d, tl.sum(acc, 0))


def paged_read(k, v, tables, num_keys, splits, tile_n, num_warps, num_stages):
    """Launch the read over `k` / `v` ([blocks, block_size, kv heads, d], or head-major viewed so) and `tables`."""
    num_seqs, block_size, num_kv_heads, head_dim = tables.shape[0], k.shape[1], k.shape[2], k.shape[3]
    tiles_per_split = triton.cdiv(triton.cdiv(num_keys, tile_n), splits)
    out = torch.empty(num_seqs * num_kv_heads, splits, head_dim, device=k.device, dtype=torch.float32)
    _paged_read_kernel[(num_seqs * num_kv_heads, splits)](
        k, v, tables, out, num_keys, tiles_per_split, k.stride(0), k.stride(1), k.stride(2), tables.stride(0),
        NUM_KV_HEADS=num_kv_heads, BLOCK_SIZE=block_size, HEAD_DIM=head_dim, TILE_N=tile_n,
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    return out


def layouts(args: list, num_keys: int) -> dict:
    """(k, v, tables) of one problem: its shuffled blocks, the same blocks in order, and head-major contiguous
    keys (seen through a block view with an identity table: key j of head h at h * keys * d + j * d)."""
    k, v, tables = args[1], args[2], args[3].int()
    used = (num_keys + k.shape[1] - 1) // k.shape[1]
    tables = tables[:, :used].contiguous()
    ordered = torch.arange(tables.numel(), device=k.device, dtype=torch.int32).view_as(tables)
    in_order = (k[tables.flatten().long()].contiguous(), v[tables.flatten().long()].contiguous(), ordered)
    num_seqs, block_size, heads, d = tables.shape[0], k.shape[1], k.shape[2], k.shape[3]

    def head_major(cache):  # [seqs * heads, keys, d] viewed as [blocks, block_size, heads, d]-strided (a view
        # holds its storage: the dense copy lives as long as it)
        flat = cache[tables.flatten().long()].view(num_seqs, used * block_size, heads, d)
        dense = flat.permute(0, 2, 1, 3).contiguous()  # [seqs, heads, keys, d]
        return dense.as_strided((num_seqs * used, block_size, heads, d), (block_size * d, d, used * block_size * d, 1))

    # NOTE: sequence s's block i of a head-major cache starts at s * heads * keys * d + i * block_size * d; the
    # view's block stride reaches it for s = 0 only, so head-major is timed for one sequence
    contiguous = (head_major(k), head_major(v), ordered) if num_seqs == 1 else None
    return {"shuffled": (k, v, tables), "in_order": in_order, "head_major": contiguous}


def sweep(batch: int) -> list[dict]:
    splits = (16, 32, 64) if batch == 1 else (1,)
    return [dict(splits=s, tile_n=n, num_warps=w, num_stages=st)
            for s, n, w, st in itertools.product(splits, (32, 64, 128), (4, 8), (2, 4))]  # fmt: skip


def measure(name: str, clock: Clock, device) -> dict:
    base, copies = (name[: -len("_cold")], COLD_COPIES) if name.endswith("_cold") else (name, 1)
    batch, num_keys = DECODE_CASES[base]
    inputs = [case_args(base, device) for _ in range(copies)]
    per_copy = lambda fn: clock(fn) / copies  # noqa: E731
    row = dict(case=name, bytes=2 * batch * num_keys * HEADS["num_kv_heads"] * HEADS["head_dim"] * 2)
    row["op_ms"] = per_copy(lambda: [triton_kernel.rope_paged_attention_triton(*a) for a in inputs])
    stored = [[*a[:8], None, *a[9:]] for a in inputs]
    row["op_keys_as_stored_ms"] = per_copy(lambda: [triton_kernel.rope_paged_attention_triton(*a) for a in stored])
    fns = [sdpa_baselines("decode", batch, num_keys, HEADS, device)["default"][0] for _ in range(copies)]
    row["sdpa_default_ms"] = per_copy(lambda: [fn() for fn in fns])
    placed = [layouts(a, num_keys) for a in inputs]
    k, v, tables = placed[0]["in_order"]
    expected = (k.double().sum() + v.double().sum()).item()  # every block of the problem holds keys < num_keys
    tolerance = 1e-5 * (k.double().abs().sum() + v.double().abs().sum()).item()
    row["floor"] = {}
    for layout in ("shuffled", "in_order", "head_major"):
        if placed[0][layout] is None:
            continue
        timings = []
        for cfg in sweep(batch):
            try:
                got = paged_read(*placed[0][layout], num_keys=num_keys, **cfg).double().sum().item()
                ok = abs(got - expected) <= tolerance
                ms = per_copy(
                    lambda cfg=cfg, lay=layout: [paged_read(*p[lay], num_keys=num_keys, **cfg) for p in placed]
                )
                timings.append(dict(config=cfg, ms=ms, ok=bool(ok)))
            except Exception as exc:  # noqa: BLE001 -- a config may not fit (shared memory, registers)
                timings.append(dict(config=cfg, error=f"{type(exc).__name__}: {str(exc)[:120]}"))
        best = min((t for t in timings if t.get("ok")), key=lambda t: t["ms"], default=None)
        row["floor"][layout] = dict(best=best, sweep=timings)
        if best:
            print(f"{name} {layout}: {best['ms'] * 1e3:.2f} us {best['config']} "
                  f"({row['bytes'] / best['ms'] / 1e9:.2f} TB/s)", flush=True)  # fmt: skip
    print(f"{name}: op {row['op_ms'] * 1e3:.2f} us, keys as stored {row['op_keys_as_stored_ms'] * 1e3:.2f}, "
          f"SDPA default {row['sdpa_default_ms'] * 1e3:.2f}", flush=True)  # fmt: skip
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="b1x8k,b1x8k_cold,b64x576w8k,b64x8k", help="comma-separated")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    device = torch.device("cuda")
    clock = Clock(smoke=False)
    result = dict(git_sha=git_sha(), device=torch.cuda.get_device_name())
    result["copy_bandwidth"] = copy_bandwidth(clock, device)
    print(f"copy bandwidth {result['copy_bandwidth'] / 1e12:.2f} TB/s", flush=True)
    result["rows"] = [measure(name, clock, device) for name in args.cases.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"read_floor_{result['git_sha']}.json"
    path.write_text(json.dumps(result, indent=1))
    print("wrote", path)


if __name__ == "__main__":
    main()
