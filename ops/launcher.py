"""``rope_paged_attention``: argument validation and dispatch to the Triton / torch / reference paths.

Checks come in two kinds: shape, dtype, device and stride checks read only metadata and always run when
``check=True``; value checks (``cu_seqlens_q`` monotone, block ids in range, positions within bounds) read
tensor contents, which costs a host sync on the GPU. ``check=False`` skips both: the engine validates its own
metadata once and passes ``check=False`` on the hot path.
"""

from __future__ import annotations

import os

import torch

from ops.reference import rope_paged_attention_ref
from ops.torch_impl import rope_paged_attention_torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INT_DTYPES = (torch.int32, torch.int64)
IMPLS = ("auto", "triton", "torch", "ref")


def pdl_requested() -> bool:
    """`MINIPIC_PDL` is not "0": launch the op's kernels and Inductor's as programmatic dependents where the device
    and the compilers allow it (ops/triton_kernel.py's `use_pdl`, models/llama.py's `compile_kernel`)."""
    return os.environ.get("MINIPIC_PDL", "1") != "0"


def _fail(name: str, message: str) -> None:
    raise ValueError(f"{name}: {message}")


def _check_rank(name: str, tensor: torch.Tensor, rank: int, layout: str) -> None:
    if not isinstance(tensor, torch.Tensor):
        _fail(name, f"expected a torch.Tensor {layout}, got {type(tensor).__name__}")
    if tensor.dim() != rank:
        _fail(name, f"expected {layout} (rank {rank}), got shape {tuple(tensor.shape)}")


def _check_shapes(q, k_cache, v_cache, block_tables, cu_seqlens_q, q_positions, kv_lens, visible_start, cos_sin):
    _check_rank("q", q, 3, "[num_tokens, num_heads, head_dim]")
    _check_rank("k_cache", k_cache, 4, "[num_blocks, block_size, num_kv_heads, head_dim]")
    _check_rank("v_cache", v_cache, 4, "[num_blocks, block_size, num_kv_heads, head_dim]")
    _check_rank("block_tables", block_tables, 2, "[num_seqs, max_blocks]")
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("q_positions", q_positions), ("kv_lens", kv_lens)):
        _check_rank(name, t, 1, "1-D")
    _check_rank("visible_start", visible_start, 1, "[num_tokens]")
    num_tokens, num_heads, head_dim = q.shape
    num_seqs = block_tables.shape[0]
    if v_cache.shape != k_cache.shape:
        _fail("v_cache", f"shape {tuple(v_cache.shape)} differs from k_cache {tuple(k_cache.shape)}")
    if k_cache.shape[3] != head_dim:
        _fail("k_cache", f"head_dim {k_cache.shape[3]} differs from q's head_dim {head_dim}")
    num_kv_heads = k_cache.shape[2]
    if num_kv_heads == 0 or num_heads % num_kv_heads:
        _fail("k_cache", f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    if num_seqs == 0 or num_tokens == 0:
        _fail("block_tables" if num_seqs == 0 else "q", "needs at least one sequence and one query token")
    expected = {
        "cu_seqlens_q": (cu_seqlens_q, num_seqs + 1),
        "q_positions": (q_positions, num_tokens),
        "kv_lens": (kv_lens, num_seqs),
        "visible_start": (visible_start, num_tokens),
    }
    for name, (tensor, length) in expected.items():
        if tensor.shape[0] != length:
            _fail(name, f"expected length {length}, got {tensor.shape[0]}")
    if cos_sin is not None:
        _check_rank("cos_sin", cos_sin, 2, "[max_position, rotary_dim]")
        rotary_dim = cos_sin.shape[1]
        if rotary_dim == 0 or rotary_dim % 2 or rotary_dim > head_dim:
            _fail("cos_sin", f"rotary_dim ({rotary_dim}) must be even, > 0 and <= head_dim ({head_dim})")


def _check_dtypes_devices(q, k_cache, v_cache, ints: dict[str, torch.Tensor], cos_sin) -> None:
    if q.dtype not in FLOAT_DTYPES:
        _fail("q", f"dtype {q.dtype} is not one of float32/float16/bfloat16")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dtype != q.dtype:
            _fail(name, f"dtype {t.dtype} differs from q's {q.dtype}")
    for name, t in ints.items():
        if t.dtype not in INT_DTYPES:
            _fail(name, f"dtype {t.dtype} must be int32 or int64")
    if cos_sin is not None and cos_sin.dtype not in FLOAT_DTYPES:
        _fail("cos_sin", f"dtype {cos_sin.dtype} is not a float dtype")
    tensors = {"k_cache": k_cache, "v_cache": v_cache, **ints}
    if cos_sin is not None:
        tensors["cos_sin"] = cos_sin
    for name, t in tensors.items():
        if t.device != q.device:
            _fail(name, f"on {t.device}, but q is on {q.device}")


def _check_strides(q, k_cache, v_cache, ints: dict[str, torch.Tensor], cos_sin) -> None:
    # NOTE: the Triton kernel takes explicit strides for q, the caches, block_tables and cos_sin, but assumes
    # unit stride along head_dim / rows, and contiguous 1-D metadata.
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(-1) != 1:
            _fail(name, f"head_dim must be contiguous (stride 1), got strides {t.stride()}")
    for name, t in ints.items():
        if t.stride(-1) != 1:
            _fail(name, f"must be contiguous along its last dim, got strides {t.stride()}")
    if cos_sin is not None and cos_sin.stride(-1) != 1:
        _fail("cos_sin", f"rows must be contiguous, got strides {cos_sin.stride()}")


def _check_values(k_cache, block_tables, cu_seqlens_q, q_positions, kv_lens, visible_start, cos_sin) -> None:
    num_blocks, block_size = k_cache.shape[:2]
    cu = cu_seqlens_q.long()
    if int(cu[0]) != 0 or int(cu[-1]) != q_positions.shape[0]:
        _fail(
            "cu_seqlens_q",
            f"must start at 0 and end at num_tokens ({q_positions.shape[0]}), got {cu.tolist()}",
        )
    if bool((cu[1:] <= cu[:-1]).any()):
        _fail("cu_seqlens_q", f"must be strictly increasing (>= 1 query token per sequence), got {cu.tolist()}")
    lens = kv_lens.long()
    capacity = block_tables.shape[1] * block_size
    if bool((lens < 1).any()) or bool((lens > capacity).any()):
        _fail("kv_lens", f"each must lie in [1, max_blocks * block_size = {capacity}], got {lens.tolist()}")
    num_used = (lens + block_size - 1) // block_size  # blocks each sequence reads
    used = torch.arange(block_tables.shape[1], device=lens.device)[None, :] < num_used[:, None]
    ids = block_tables.long()[used]
    if bool(((ids < 0) | (ids >= num_blocks)).any()):
        bad = ids[(ids < 0) | (ids >= num_blocks)][0].item()
        _fail("block_tables", f"block id {bad} out of range [0, {num_blocks})")
    seq_of_token = torch.repeat_interleave(torch.arange(len(lens), device=lens.device), cu[1:] - cu[:-1])
    pos, vis = q_positions.long(), visible_start.long()
    if bool((pos < 0).any()) or bool((pos >= lens[seq_of_token]).any()):
        _fail("q_positions", "each must lie in [0, kv_len of its sequence)")
    if bool((vis < 0).any()) or bool((vis > pos).any()):
        _fail("visible_start", "each must lie in [0, its query position]")
    if cos_sin is not None and int(lens.max()) > cos_sin.shape[0]:
        _fail("cos_sin", f"has {cos_sin.shape[0]} rows, but keys reach position {int(lens.max()) - 1}")


def _check_decode_hint(num_decode_seqs: int, cu_seqlens_q: torch.Tensor, num_seqs: int) -> None:
    if not 0 <= num_decode_seqs <= num_seqs:
        _fail("num_decode_seqs", f"must lie in [0, num_seqs = {num_seqs}], got {num_decode_seqs}")
    if num_decode_seqs and int(cu_seqlens_q[num_decode_seqs]) != num_decode_seqs:
        _fail("num_decode_seqs", f"the first {num_decode_seqs} sequences must have one query token each")


def validate(q, k_cache, v_cache, block_tables, cu_seqlens_q, q_positions, kv_lens, visible_start, cos_sin, scale):
    """All launcher checks; raises ``ValueError`` naming the offending argument."""
    _check_shapes(q, k_cache, v_cache, block_tables, cu_seqlens_q, q_positions, kv_lens, visible_start, cos_sin)
    ints = {
        "block_tables": block_tables,
        "cu_seqlens_q": cu_seqlens_q,
        "q_positions": q_positions,
        "kv_lens": kv_lens,
        "visible_start": visible_start,
    }
    _check_dtypes_devices(q, k_cache, v_cache, ints, cos_sin)
    _check_strides(q, k_cache, v_cache, ints, cos_sin)
    if not isinstance(scale, (float, int)) or not scale > 0:
        _fail("scale", f"must be a positive float, got {scale!r}")
    _check_values(k_cache, block_tables, cu_seqlens_q, q_positions, kv_lens, visible_start, cos_sin)


def rope_paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    q_positions: torch.Tensor,
    kv_lens: torch.Tensor,
    visible_start: torch.Tensor,
    cos_sin: torch.Tensor | None,
    scale: float,
    impl: str = "auto",
    check: bool = True,
    num_decode_seqs: int = 0,
) -> torch.Tensor:
    """Paged attention over a block-table KV cache, with RoPE applied to keys at read time.

    Args:
        q: ``[num_tokens, num_heads, head_dim]`` queries, already rotated at their positions.
        k_cache, v_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``; key j of sequence s lives at
            ``k_cache[block_tables[s, j // block_size], j % block_size]``. Never written.
        block_tables: ``[num_seqs, max_blocks]`` int32 (entries past a sequence's last block are ignored).
        cu_seqlens_q: ``[num_seqs + 1]``; query tokens of sequence s are ``q[cu[s]:cu[s + 1]]`` (>= 1 each).
        q_positions: ``[num_tokens]`` logical position of each query token (holes allowed).
        kv_lens: ``[num_seqs]`` number of valid keys per sequence (including the current tokens' keys).
        visible_start: ``[num_tokens]``; token i attends to keys ``visible_start[i] <= j <= q_positions[i]``.
        cos_sin: ``[max_position, rotary_dim]`` rows ``[cos(p * inv_freq), sin(p * inv_freq)]``: keys are
            rotated neox-style at their index j (position-free mode); ``None``: keys are used as stored.
        scale: softmax scale, normally ``head_dim ** -0.5``.
        impl: ``"triton"``, ``"torch"``, ``"ref"`` or ``"auto"`` (Triton on CUDA, torch otherwise).
        check: validate arguments (value checks sync the GPU); ``False`` skips every check.
        num_decode_seqs: a hint, how many sequences at the start of the batch have one query token each (0:
            unknown). The Triton path then reads them in a decode launch of their own where the batch would
            otherwise take a prefill path that copies every sequence's keys (a mixed step's decodes).

    Returns:
        ``[num_tokens, num_heads, head_dim]`` in ``q``'s dtype (softmax and accumulation in float32).
    """
    args = (
        q,
        k_cache,
        v_cache,
        block_tables,
        cu_seqlens_q,
        q_positions,
        kv_lens,
        visible_start,
        cos_sin,
        scale,
    )
    if impl not in IMPLS:
        raise ValueError(f"impl: must be one of {IMPLS}, got {impl!r}")
    if check:
        validate(*args)
    if check:
        _check_decode_hint(num_decode_seqs, cu_seqlens_q, block_tables.shape[0])
    if impl == "auto":
        impl = "triton" if q.is_cuda else "torch"
    if impl == "torch":
        return rope_paged_attention_torch(*args)
    if impl == "ref":
        return rope_paged_attention_ref(*args)
    from ops.triton_kernel import rope_paged_attention_triton  # triton imported only when used

    if check:
        from ops.triton_kernel import check_triton_support

        check_triton_support(q, k_cache, cos_sin)
    return rope_paged_attention_triton(*args, num_decode_seqs=num_decode_seqs)
