"""A skinny matmul for steps of few rows (a cached prompt's new tokens, a small decode batch): x [M, K] @ W[N, K]^T
with M <= SKINNY_MAX_ROWS, every weight read once from HBM.

The kernel swaps the operands (out^T = W x^T): the weight's rows fill the tensor cores' 64-row side and x's few rows
their narrow side. Each program streams a [block_n, K / splits] slab of W through tensor-descriptor (TMA) loads;
with splits it stores a float32 partial, and the last program of a column tile to finish (an atomic count a tile)
adds the partials in split order and writes the output: no reduction launch, where cuBLAS's split-K runs one.

Why a Triton matmul at all: measured alone on the H200 (bench/results/gpu_skinny_gemm_d23dd17_h200.json, each
projection replayed in a CUDA graph from HBM) it ran 1.02x cuBLAS over a Llama-3-8B layer's four projections at 17
and 64 rows. What it may add in a step is its launch: it is launched as a programmatic dependent (`PDL`, Hopper and
later: it may be scheduled while the kernel before it drains, and waits with `gdc_wait` before reading anything),
where cuBLAS's kernels are launched plainly, and a cached prompt's step runs four projections a layer between
Triton kernels. The CUDA graphs' buckets of few rows take it on Hopper (models/routed_linear.py;
`MINIPIC_SKINNY_MATMUL=0` keeps the BLAS libraries): the cached 8 x 2,048 prompt's next question took 6.50 ms
against 6.56 on the H200 (793b7b0, one process each) and 7.99-8.51 against 8.45-8.54 ms on an H100 (5a1675b, three
processes against two), with no split-K reduction kernels in the step; the engine's decode at batch 64 7,830 tok/s
against 7,687 / 7,700 on the H100, at batch 1 even (bench/results/ttft_spans-{793b7b0,5a1675b}-*,
gpu_decode_5a1675b_*).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

SKINNY_MAX_ROWS = 64
SKINNY_DTYPES = (torch.float16, torch.bfloat16)
SHARED_MEMORY_BUDGET = 200 * 1024  # bytes of pipelined tiles a program (H100 / H200: 227 KB a block at most)


@dataclass(frozen=True, slots=True)
class SkinnyConfig:
    block_n: int = 64  # weight rows a program (the tensor cores' 64-row side)
    block_k: int = 128
    splits: int = 1  # K ranges: column tiles x splits programs
    num_stages: int = 4
    num_warps: int = 4

    def __post_init__(self):
        if self.block_n not in (64, 128, 256) or self.block_k not in (32, 64, 128, 256) or self.splits < 1:
            raise ValueError(f"bad skinny matmul config {self}")


@triton.jit
def _skinny_matmul_kernel(
    x_desc,  # [M, K] activations, blocks [BLOCK_M, BLOCK_K]: rows past M read as zeros
    w_desc,  # [N, K] weight (nn.Linear's), blocks [BLOCK_N, BLOCK_K]
    out_ptr,  # [M, N]
    part_ptr,  # [SPLITS, M, N] float32: each split's partial product (SPLITS > 1)
    count_ptr,  # [cdiv(N, BLOCK_N)] int32: splits finished a column tile, zero between calls
    M,
    N,
    k_per_split,  # a multiple of BLOCK_K
    stride_om,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLITS: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    PDL: tl.constexpr = False,  # launched as a programmatic dependent: wait for the kernel before it
):
    if PDL:
        tl.extra.cuda.gdc_wait()  # NOTE: before any load or count: x and the counts may come from the kernel before
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    n_start = pid_n * BLOCK_N
    k_start = split * k_per_split
    # -- out^T tile: W [BLOCK_N, BLOCK_K] @ x^T [BLOCK_K, BLOCK_M], over this split's K --
    acc = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
    for k in tl.range(k_start, k_start + k_per_split, BLOCK_K, num_stages=NUM_STAGES):
        w = w_desc.load([n_start, k])  # [BLOCK_N, BLOCK_K]
        x = x_desc.load([0, k])  # [BLOCK_M, BLOCK_K]
        acc = tl.dot(w, tl.trans(x), acc)
    offs_n = n_start + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    mask = (offs_n[:, None] < N) & (offs_m[None, :] < M)
    tile = offs_m[None, :] * N + offs_n[:, None]  # [BLOCK_N, BLOCK_M] into a row-major [M, N]
    out_ptrs = out_ptr + offs_m[None, :] * stride_om + offs_n[:, None]
    if SPLITS == 1:
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(part_ptr + split * M * N + tile, acc, mask=mask)
        # NOTE: every thread's partial is stored before the count is raised (release), and the last program reads
        # the others' partials from L2 (".cg": not from a stale L1) after it sees the count (acquire)
        tl.debug_barrier()
        finished = tl.atomic_add(count_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
        if finished == SPLITS - 1:
            total = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
            for s in tl.static_range(SPLITS):  # in split order: the same sum whichever program finishes last
                total += tl.load(part_ptr + s * M * N + tile, mask=mask, other=0.0, cache_modifier=".cg")
            tl.store(out_ptrs, total.to(out_ptr.dtype.element_ty), mask=mask)
            tl.atomic_xchg(count_ptr + pid_n, 0, sem="relaxed", scope="gpu")  # zero again for the next call


def block_m_for(num_rows: int) -> int:
    return max(16, triton.next_power_of_2(num_rows))


def pick_skinny_config(num_rows: int, k: int, n: int) -> SkinnyConfig:
    """The tiles for x [num_rows, k] @ W [n, k]^T, from the H200's fastest at Llama-3-8B's projections
    (gpu_skinny_gemm_d23dd17_h200.json, 17 rows): wide outputs (gate_up, 28,672) 128-row tiles, one split; square
    ones (o, 4,096) two splits of 256-wide K steps; long K (down, 14,336) 128-wide K steps, two splits, six stages;
    qkv (6,144) one split of 256-wide steps. Stages shrink until the pipelined tiles fit in shared memory."""
    block_n = 128 if n >= 16384 else 64
    splits = 2 if n <= 4096 else 1
    block_k = 128 if k > 8192 or block_n == 128 else 256
    stages = {(64, 128): 6, (64, 256): 3 if splits > 1 else 4, (128, 128): 4}[(block_n, block_k)]
    while k % (splits * block_k) and block_k > 32:  # K not a multiple of the steps: smaller steps
        block_k //= 2
    if k % (splits * block_k):
        splits = 1
    tile_bytes = 2 * block_k * (block_n + block_m_for(num_rows))  # a stage's W and x tiles, 16-bit
    while stages > 2 and stages * tile_bytes > SHARED_MEMORY_BUDGET:
        stages -= 1
    return SkinnyConfig(block_n, block_k, splits, stages)


def skinny_unsupported(x: torch.Tensor, weight: torch.Tensor, config: SkinnyConfig) -> str | None:
    """Why the kernel cannot take these operands, or None: it needs 2-D 16-bit operands of one dtype with K
    contiguous and 16-byte aligned rows, at most SKINNY_MAX_ROWS rows, and K a multiple of splits x block_k."""
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        return f"x {tuple(x.shape)} and weight {tuple(weight.shape)} are not [M, K] and [N, K]"
    if x.dtype != weight.dtype or x.dtype not in SKINNY_DTYPES:
        return f"x is {x.dtype} and weight {weight.dtype}: both must be float16 or bfloat16"
    (m, k) = x.shape
    if not 1 <= m <= SKINNY_MAX_ROWS:
        return f"{m} rows (1 to {SKINNY_MAX_ROWS})"
    if k % (config.splits * config.block_k):
        return f"K={k} is not a multiple of {config.splits} splits x {config.block_k}"
    for name, t in (("x", x), ("weight", weight)):
        if t.stride(1) != 1 or (t.stride(0) * t.element_size()) % 16 or t.data_ptr() % 16:
            return f"{name} must have K contiguous and 16-byte aligned rows"
    return None


def skinny_device_ok(device: torch.device) -> bool:
    """A GPU whose TMA the kernel's tensor-descriptor loads need (Hopper and later); elsewhere the libraries serve."""
    from ops.triton_kernel import _has_tma

    return device.type == "cuda" and _has_tma(device.index or 0)


def skinny_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    config: SkinnyConfig | None = None,
    counts: torch.Tensor | None = None,
    pdl: bool | None = None,
) -> torch.Tensor:
    """x [M, K] @ weight [N, K]^T -> [M, N] in x's dtype (M <= SKINNY_MAX_ROWS). `config`: None picks one
    (`pick_skinny_config`). `counts`: int32 zeros of at least cdiv(N, block_n) (the kernel leaves them zero; one
    buffer may serve calls one after another on a stream, not calls running at once); made here when None. `pdl`:
    launch as a programmatic dependent (None: where the device allows it, `ops.triton_kernel.use_pdl`)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from ops.triton_kernel import use_pdl

    config = config or pick_skinny_config(x.shape[0], x.shape[1], weight.shape[0])
    reason = skinny_unsupported(x, weight, config)
    if reason is not None:
        raise ValueError(f"skinny matmul: {reason}")
    (m, k), n = x.shape, weight.shape[0]
    block_m = block_m_for(m)
    num_tiles = triton.cdiv(n, config.block_n)
    out = torch.empty(m, n, device=x.device, dtype=x.dtype)
    part = out
    if config.splits > 1:
        part = torch.empty(config.splits, m, n, device=x.device, dtype=torch.float32)
        if counts is None:
            counts = torch.zeros(num_tiles, device=x.device, dtype=torch.int32)
    else:
        counts = out
    pdl = use_pdl(x) if pdl is None else pdl
    x_desc = TensorDescriptor.from_tensor(x, block_shape=[block_m, config.block_k])
    w_desc = TensorDescriptor.from_tensor(weight, block_shape=[config.block_n, config.block_k])
    _skinny_matmul_kernel[(num_tiles, config.splits)](
        x_desc, w_desc, out, part, counts, m, n, k // config.splits, out.stride(0),
        BLOCK_M=block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k, SPLITS=config.splits,
        NUM_STAGES=config.num_stages, PDL=pdl, num_warps=config.num_warps,
        **({"launch_pdl": True} if pdl else {}),
    )  # fmt: skip
    return out


class SkinnyRoute:
    """fn(x, weight, bias) for RoutedLinear: `skinny_linear` with one config a (rows, K, N) and one counts buffer a
    weight shape and device (the kernel leaves it zero; the step's calls run one after another on its stream)."""

    def __init__(self):
        self.counts: dict[tuple, torch.Tensor] = {}

    def supports(self, num_rows: int, weight: torch.Tensor) -> bool:
        """A weight on a GPU with TMA that the kernel takes at `num_rows` rows (x as the step makes it: contiguous,
        aligned)."""
        x = torch.empty(num_rows, weight.shape[1], dtype=weight.dtype, device="meta")  # NOTE: its data_ptr is 0
        config = pick_skinny_config(num_rows, weight.shape[1], weight.shape[0])
        return skinny_device_ok(weight.device) and skinny_unsupported(x, weight, config) is None

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        config = pick_skinny_config(x.shape[0], weight.shape[1], weight.shape[0])
        key = (weight.shape[0], config.block_n, weight.device)
        if config.splits > 1 and key not in self.counts:  # NOTE: made before a graph's capture (the probe's warm-up)
            self.counts[key] = torch.zeros(triton.cdiv(weight.shape[0], config.block_n), dtype=torch.int32,
                                           device=weight.device)  # fmt: skip
        out = skinny_linear(x, weight, config, self.counts.get(key))
        return out if bias is None else out + bias
