"""The `o` projection's weights brought into the GPU's L2 cache while the attention read runs (CUDA only).

In a step of few new tokens over a long cached context (a RAG prompt whose documents hit) the attention read is
bound by latency, not bytes (ops/README: ~1.8 TB/s of the H200's ~4.2), and the `o` projection after it reads its
weights from memory at 0.57 of the copy rate (32 MiB in 13.8 µs; bench/results/next42-d23dd17-cuda-skinny_gemm.log).
Here a small kernel on a side stream asks for those weights with bulk L2 prefetches (`cp.async.bulk.prefetch.L2`,
Hopper) while the read runs; the projection then finds them in the L2 (50 MB on the H200). Inside a CUDA graph the
side stream is a branch: forked before the read, joined before the projection. The prefetch is a hint: it changes
no value, only where the projection's loads are served from.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

CHUNK_BYTES = 4096  # bytes one bulk prefetch asks for
PROGRAMS = 64  # one warp each: they fit beside the attention read's programs on the SMs
# NOTE: evict_last marks the lines to stay while the read streams the keys and values (evict_normal) through the L2
EVICT_LAST_ASM = (
    "{ .reg .b64 pol; createpolicy.fractional.L2::evict_last.b64 pol, 1.0; "
    f"cp.async.bulk.prefetch.L2.global.L2::cache_hint [$1], {CHUNK_BYTES}, pol; mov.u32 $0, 0; }}"
)
PLAIN_ASM = f"cp.async.bulk.prefetch.L2.global [$1], {CHUNK_BYTES}; mov.u32 $0, 0;"


@triton.jit
def _l2_prefetch_kernel(base_ptr, dummy_ptr, num_chunks, ASM: tl.constexpr, CHUNK: tl.constexpr,
                        CHUNKS_PER_PROGRAM: tl.constexpr):  # fmt: skip
    pid = tl.program_id(0)
    idx = pid * CHUNKS_PER_PROGRAM + tl.arange(0, CHUNKS_PER_PROGRAM)
    idx = tl.where(idx < num_chunks, idx, 0)  # NOTE: past the end: the first chunk again (a hint, asked twice)
    ptrs = base_ptr.to(tl.pointer_type(tl.uint8)) + idx.to(tl.int64) * CHUNK
    r = tl.inline_asm_elementwise(ASM, "=r,l", [ptrs], dtype=tl.int32, is_pure=False, pack=1)
    tl.store(dummy_ptr + pid, tl.sum(r, 0), mask=num_chunks < 0)  # NOTE: never stored: keeps the asm's result used


class L2Prefetch:
    """`start(weight)` forks a side stream off the current one and prefetches `weight` there; `join()` makes the
    current stream wait for it. Both are captured by a CUDA graph as they run eagerly."""

    def __init__(self, device: torch.device, evict_last: bool = True):
        self.side = torch.cuda.Stream(device)
        self.dummy = torch.zeros(PROGRAMS, dtype=torch.int32, device=device)
        self.asm = EVICT_LAST_ASM if evict_last else PLAIN_ASM

    def start(self, weight: torch.Tensor) -> None:
        num_chunks = weight.numel() * weight.element_size() // CHUNK_BYTES
        per_program = triton.next_power_of_2(triton.cdiv(num_chunks, PROGRAMS))
        self.side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.side):
            _l2_prefetch_kernel[(triton.cdiv(num_chunks, per_program),)](
                weight, self.dummy, num_chunks, ASM=self.asm, CHUNK=CHUNK_BYTES, CHUNKS_PER_PROGRAM=per_program,
                num_warps=1,
            )  # fmt: skip

    def join(self) -> None:
        torch.cuda.current_stream().wait_stream(self.side)
