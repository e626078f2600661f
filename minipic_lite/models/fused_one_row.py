"""Batch-1 decode: the residual add and RMSNorm as the prologue of the next projection, one kernel instead of two.

A batch-1 decode step on the H200 spends ~2 µs a call on each `add_rms_norm` (65 a step for Llama-3-8B) and ~1.2
µs on each SiLU·up: kernels that move 8-56 KB and wait on the one before. Here the projection that follows a norm
does the norm itself. Every program of the kernel reads the whole row (x + delta: 8 KB, from L2) as it streams its
rows of the weight, multiplies them by norm_weight * (x + delta) and reduces the row's squares beside them; rstd
scales the sums at the end. Program 0 also writes x + delta, the residual stream the layer carries on. For
`gate_up`, each program takes the same rows of the gate and the up halves and writes SiLU(gate) · up: the MLP's
activation needs no kernel of its own either.

    y = W @ norm(x + delta)            norm(h) = weight * (h * rsqrt(mean(h^2) + eps))   (transformers' rounding)
    y = silu(W_gate @ n) * (W_up @ n)  (GATED)

`add_norm_matmul_reference` is the same math in plain PyTorch (the unfused kernels' order and roundings; the kernel
skips the rounding of the normed row to the model dtype); the Triton kernel is held to it by
tests/test_fused_one_row.py (interpreter on the CPU, the GPU in tests/test_gpu.py).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover (triton ships with the CUDA build of torch; the CPU engine never calls it)
    triton = None


def add_norm_matmul_reference(x, delta, norm_weight, eps: float, weight, gated: bool = False):
    """(y, x + delta): x, delta [1, K] (delta may be None), norm_weight [K], weight [N, K] ([2N, K]: gate, then up).
    y [1, N]: weight @ rms_norm(x + delta), or SiLU(gate) * up when `gated`."""
    h = x if delta is None else x + delta  # the residual stream, in the model dtype
    hf = h.float()
    normed = norm_weight * (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)).to(h.dtype)
    y = F.linear(normed, weight)
    if gated:
        gate, up = y.chunk(2, dim=-1)
        y = F.silu(gate) * up
    return y, h


if triton is not None:

    @triton.autotune(
        configs=[
            triton.Config({"BLOCK_N": bn, "BLOCK_K": bk}, num_warps=w, num_stages=s)
            # NOTE: one stage: the programs in flight hide the loads' latency (Inductor's tuned one-row reduction for
            # gate_up took 4 rows x 1,024 features, 8 warps, 1 stage: next35b-7bfa47a's compile cache)
            for bn, bk, w, s in [
                (4, 1024, 8, 1),
                (2, 1024, 8, 1),
                (2, 1024, 4, 1),
                (4, 512, 4, 1),
                (8, 512, 8, 1),
                (1, 2048, 8, 1),
                (2, 2048, 16, 1),
                (1, 1024, 16, 1),
                (8, 1024, 8, 1),
                (4, 1024, 8, 2),
                (8, 512, 4, 3),
            ]
        ],
        key=["N", "K", "GATED"],
    )
    @triton.jit
    def _add_norm_matmul_kernel(
        x_ptr,  # [K] the residual stream
        delta_ptr,  # [K] added to it first (HAS_DELTA)
        norm_w_ptr,  # [K]
        w_ptr,  # [N or 2N, K], rows contiguous: the weight (GATED: gate rows, then up rows)
        y_ptr,  # [N]
        h_ptr,  # [K] x + delta, written by program 0 (HAS_DELTA)
        N,
        K,
        stride_w,
        eps,
        HAS_DELTA: tl.constexpr,
        GATED: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
    ):
        pid = tl.program_id(0)
        dtype = x_ptr.dtype.element_ty
        rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
        row_ok = rows < N
        w_rows = w_ptr + rows.to(tl.int64)[:, None] * stride_w  # [BLOCK_N, 1]
        # -- one pass: this program's rows of the weight against norm_weight * h, and h's squares beside them --------
        # NOTE: rstd scales the sums at the end, so no pass over h comes before the weights stream (a first version
        # reduced the squares in a loop of its own and took 42 µs a call against the unfused 36: next35-3dad8ca)
        squares = tl.zeros([BLOCK_K], dtype=tl.float32)
        acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        acc_up = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            k_ok = offs_k < K
            # NOTE: the row stays in L2 for every program (evict_last); each weight is read once (evict_first)
            h = tl.load(x_ptr + offs_k, mask=k_ok, other=0.0, eviction_policy="evict_last")
            if HAS_DELTA:
                d = tl.load(delta_ptr + offs_k, mask=k_ok, other=0.0, eviction_policy="evict_last")
                h = (h.to(tl.float32) + d.to(tl.float32)).to(dtype)
                if pid == 0:
                    tl.store(h_ptr + offs_k, h, mask=k_ok)
            hf = h.to(tl.float32)
            squares += hf * hf
            g = tl.load(norm_w_ptr + offs_k, mask=k_ok, other=0.0, eviction_policy="evict_last")
            n = (g.to(tl.float32) * hf)[None, :]  # [1, BLOCK_K]
            w_ok = row_ok[:, None] & k_ok[None, :]
            w = tl.load(w_rows + offs_k[None, :], mask=w_ok, other=0.0, eviction_policy="evict_first")
            acc += w.to(tl.float32) * n
            if GATED:
                w_up = w_rows + N * stride_w + offs_k[None, :]
                acc_up += tl.load(w_up, mask=w_ok, other=0.0, eviction_policy="evict_first").to(tl.float32) * n
        rstd = 1.0 / tl.sqrt(tl.sum(squares, axis=0) / K + eps)
        y = tl.sum(acc, axis=1) * rstd
        if GATED:
            gate = y.to(dtype).to(tl.float32)  # each rounded as the unfused kernels round them
            silu = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
            y = silu * (tl.sum(acc_up, axis=1) * rstd).to(dtype).to(tl.float32)
        tl.store(y_ptr + rows, y.to(dtype), mask=row_ok)


INTERPRETER_CONFIG = {"BLOCK_N": 16, "BLOCK_K": 64}  # CPU tensors run in Triton's interpreter: no autotuning


def add_norm_matmul(x, delta, norm_weight, eps: float, weight, gated: bool = False, config: dict | None = None):
    """`add_norm_matmul_reference` as one Triton kernel (x of one row). Returns (y, x + delta); without a delta,
    x itself. `config` ({"BLOCK_N", "BLOCK_K"}) skips the autotuner (tests, the interpreter); otherwise the
    first call of each shape tunes, so call it once before a CUDA graph captures it (`warm_up`)."""
    if x.dim() != 2 or x.shape[0] != 1:
        raise ValueError(f"add_norm_matmul takes one row, got x of shape {tuple(x.shape)}")
    K = x.shape[1]
    rows = weight.shape[0]
    N = rows // 2 if gated else rows
    if weight.shape[1] != K or norm_weight.shape != (K,) or (gated and rows % 2):
        raise ValueError(f"shapes do not fit: x {tuple(x.shape)}, norm {tuple(norm_weight.shape)}, weight "
                         f"{tuple(weight.shape)}, gated={gated}")  # fmt: skip
    if weight.stride(1) != 1 or not x.is_contiguous() or (delta is not None and not delta.is_contiguous()):
        raise ValueError("add_norm_matmul needs contiguous rows")
    y = torch.empty(1, N, device=x.device, dtype=x.dtype)
    h = x if delta is None else torch.empty_like(x)
    config = config or (None if x.is_cuda else INTERPRETER_CONFIG)
    kernel = _add_norm_matmul_kernel if config is None else _add_norm_matmul_kernel.fn
    grid = lambda meta: (triton.cdiv(N, meta["BLOCK_N"]),)  # noqa: E731
    kernel[grid](
        x, x if delta is None else delta, norm_weight, weight, y, h, N, K, weight.stride(0), eps,
        HAS_DELTA=delta is not None, GATED=gated, **(config or {}),
    )  # fmt: skip
    return y, h


def enable_fused_one_row(model) -> list[tuple[int, int, bool]]:
    """Route the one-row steps of every layer that has the switch (llama.DecoderLayer.fused_one_row) and no qkv bias
    through `add_norm_matmul`, unless `MINIPIC_FUSED_ONE_ROW=0`; each shape is tuned here, before CUDA graphs capture
    the steps. Returns the shapes (N, K, gated) tuned."""
    if triton is None or os.environ.get("MINIPIC_FUSED_ONE_ROW", "1") == "0":
        return []
    layers = [m for m in model.modules() if hasattr(m, "fused_one_row") and m.self_attn.qkv_proj.bias is None]
    if not layers:
        return []
    first = layers[0]
    norm, post = first.input_layernorm, first.post_attention_layernorm
    x = torch.randn(1, norm.weight.shape[0], device=norm.weight.device, dtype=norm.weight.dtype)
    with torch.inference_mode():
        add_norm_matmul(x, x, norm.weight, norm.eps, first.self_attn.qkv_proj.weight)
        add_norm_matmul(x, None, norm.weight, norm.eps, first.self_attn.qkv_proj.weight)
        add_norm_matmul(x, x, post.weight, post.eps, first.mlp.gate_up_proj.weight, gated=True)
    for layer in layers:
        layer.fused_one_row = True
    qkv, gate_up = first.self_attn.qkv_proj.weight.shape, first.mlp.gate_up_proj.weight.shape
    return [(qkv[0], qkv[1], False), (gate_up[0] // 2, gate_up[1], True)]
