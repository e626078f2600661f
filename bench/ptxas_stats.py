"""Registers, spills and pipelining of the op's split-KV read kernel for Hopper (sm_90a), compiled here, no GPU.

Triton compiles a kernel for a target it is told, and its wheel carries ptxas and cuobjdump, so the code a config
gets on the H200 can be read on the CPU machine before any device time is spent: registers per thread, the bytes
spilled to the stack, shared memory, and whether the key loop's loads became asynchronous copies (cp.async, i.e.
software-pipelined). The arguments are the engine's short read (Llama-3-8B heads: group 4, d128, bf16, block size
16, rotary keys, split-KV); integer arguments that Triton specializes at run time (strides divisible by 16) get the
same hint here, or the loads would not vectorize and the loop would not pipeline. This machine's Triton may be newer
than the GPU machine's, so the figures are a guide, not the H200's (they agreed this far: 255 registers with spills
for the 4-warp short read, as ncu read it on the H200).

    python bench/ptxas_stats.py                              # the short read's default and a few neighbours
    python bench/ptxas_stats.py --config 128,32,8,2,128      # BLOCK_M,TILE_N,num_warps,num_stages,maxnreg (0: none)
    python bench/ptxas_stats.py --table-ahead --config 128,64,8,3,0   # the short read's default (pick_config)
    python bench/ptxas_stats.py --table-ahead --decode --config 16,32,4,2,128   # a long batch-1 decode's default
    python bench/ptxas_stats.py --decode --split-ids 8 --config 16,32,4,2,128   # ... its split's block ids held
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from ops import triton_kernel  # noqa: E402

HOPPER = GPUTarget("cuda", 90, 32)
POINTERS = {  # argument -> element type, as the engine passes them
    "out_ptr": "*bf16", "q_ptr": "*bf16", "k_cache_ptr": "*bf16", "v_cache_ptr": "*bf16",
    "k_block_tables_ptr": "*i32", "v_block_tables_ptr": "*i32", "cu_seqlens_q_ptr": "*i32",
    "q_positions_ptr": "*i64", "visible_start_ptr": "*i32", "cos_sin_ptr": "*bf16",
    "partial_out_ptr": "*fp32", "partial_m_ptr": "*fp32", "partial_l_ptr": "*fp32",
}  # fmt: skip
UNSPECIALIZED = ("stride_kbt_seq", "stride_vbt_seq")  # the kernel's do_not_specialize strides
DEFAULT_CONFIGS = [  # BLOCK_M, TILE_N, num_warps, num_stages, maxnreg
    (128, 32, 4, 2, None),  # the short read before the register cap
    (128, 32, 8, 2, 128),  # the short read from 2f1f877 until TABLE_AHEAD
    (128, 16, 8, 2, 128),
    (128, 32, 16, 2, 128),
    (128, 64, 16, 2, 128),
    (16, 128, 4, 4, None),  # decode over a long context
]


def compile_read(block_m: int, tile_n: int, num_warps: int, num_stages: int, maxnreg: int | None, **extra):
    """The split-KV read kernel compiled for sm_90a with this config (a short read's constexprs; `extra` overrides
    them or sets an option such as TABLE_AHEAD)."""
    kernel = triton_kernel._rope_paged_attention_kernel
    names = kernel.arg_names
    constexprs = {p.name: p.default for p in kernel.params if p.is_constexpr and p.has_default}
    short_read = dict(BLOCK_SIZE=16, GROUP=4, HEAD_DIM=128, ROTARY_DIM=128, HALF_PAD=64, BLOCK_M=block_m,
                      BLOCK_Q=block_m // 4, TILE_N=tile_n, SPLIT_KV=True, TILES_LAST=True,
                      DOT_PRECISION="tf32")  # fmt: skip
    constexprs.update({**short_read, **extra})
    signature = {n: POINTERS.get(n, "constexpr" if n in constexprs else "fp32" if n == "qk_scale" else "i32")
                 for n in names}  # fmt: skip
    aligned = [n for n in names if n in POINTERS or (n.startswith("stride_") and n not in UNSPECIALIZED)]
    aligned.append("num_heads")  # 32: divisible by 16, so specialized at run time
    source = ASTSource(
        fn=kernel,
        signature=signature,
        constexprs={(names.index(n),): v for n, v in constexprs.items()},
        attrs={(names.index(n),): [["tt.divisibility", 16]] for n in aligned},
    )
    options = dict(num_warps=num_warps, num_stages=num_stages, maxnreg=maxnreg)
    return triton.compile(source, target=HOPPER, options=options)


def cuobjdump(cubin: bytes, *flags: str) -> str:
    """What the cuobjdump of Triton's wheel prints for the cubin."""
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        return subprocess.run([tool, *flags, f.name], capture_output=True, text=True).stdout
    finally:
        os.unlink(f.name)


def resource_usage(cubin: bytes) -> dict:
    """Registers, stack (spill) bytes of the cubin's kernel, read by cuobjdump."""
    regs, stack = re.search(r"REG:(\d+).*?STACK:(\d+)", cuobjdump(cubin, "--dump-resource-usage")).groups()
    return {"registers": int(regs), "stack_bytes": int(stack)}


MIN_LOOP_BYTES = 0x400  # a back edge farther than this (64 instructions) closes a key loop, not a small inner one


def loop_instructions(cubin: bytes) -> list[int]:
    """SASS instructions per iteration of each long loop, in code order: the key loop's masked head, unmasked body
    and masked tail (`_rope_paged_attention_kernel`'s three parts). On the H200 the short read is bound by the
    latency between dependent instructions, not by bytes (ncu_87b1122_h200_short16k_full.log): fewer
    instructions a tile is what makes it faster."""
    code = [(int(a, 16), text) for a, text in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", cuobjdump(cubin, "-sass"))]
    counts = []
    for address, text in code:
        target = re.search(r"BRA\s+0x([0-9a-f]+)", text)
        if target and 0 < address - int(target.group(1), 16) > MIN_LOOP_BYTES:
            counts.append(sum(int(target.group(1), 16) <= a <= address for a, _ in code))
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", action="append", help="BLOCK_M,TILE_N,num_warps,num_stages,maxnreg (0: none)")
    parser.add_argument("--table-ahead", action="store_true", help="the TABLE_AHEAD option")
    parser.add_argument("--decode", action="store_true", help="a decode launch: one token a sequence "
                        "(ONE_TOKEN_SEQS), int32 offsets and PDL, as a bf16 decode on Hopper compiles")  # fmt: skip
    parser.add_argument("--split-ids", type=int, default=0, help="SPLIT_IDS: a split's table entries held "
                        "(a power of two; 0: off)")  # fmt: skip
    args = parser.parse_args()
    configs = [tuple(int(x) for x in c.split(",")) for c in args.config] if args.config else DEFAULT_CONFIGS
    print(
        "| BLOCK_M | TILE_N | warps | stages | maxnreg | registers | stack (spills) B | shared B | cp.async | wgmma "
        "| copy groups in flight at a wait | SASS instructions an iteration (key loop's head / body / tail) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for block_m, tile_n, warps, stages, maxnreg in configs:
        options = dict(TABLE_AHEAD=args.table_ahead, SPLIT_IDS=args.split_ids)
        if args.decode:
            options.update(ONE_TOKEN_SEQS=True, INT32_OFFSETS=True, PDL=True)
        compiled = compile_read(block_m, tile_n, warps, stages, maxnreg or None, **options)
        usage, ptx = resource_usage(compiled.asm["cubin"]), compiled.asm["ptx"]
        loops = " / ".join(map(str, loop_instructions(compiled.asm["cubin"])))
        # NOTE: copies a loop leaves in flight while it computes (cp.async groups): 0 means no overlap
        waits = sorted({int(n) for n in re.findall(r"async_wait[^{]*[{]num = (\d+)", compiled.asm["ttgir"])})
        print(f"| {block_m} | {tile_n} | {warps} | {stages} | {maxnreg or '-'} | {usage['registers']} | "
              f"{usage['stack_bytes']} | {compiled.metadata.shared} | {ptx.count('cp.async.')} | "
              f"{ptx.count('wgmma.mma_async')} | {waits} | {loops} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
