"""The plain reference: the op's math, one sequence and one query token at a time, in float32.

For query token i of sequence s at logical position p_i, and each head h (kv head g = h // (H / H_kv)):

    K_j = rope(k_cache[block_table[s, j // B], j % B, g], j)   if cos_sin is given, else the stored key
    out_i,h = softmax_j( scale * q_i,h . K_j ) @ V_j            over  visible_start[i] <= j <= p_i

Slow and obvious by design; the tests compare every other implementation against it.
"""

from __future__ import annotations

import torch

from ops.rope import apply_rope


def gather_sequence_kv(cache: torch.Tensor, block_table: torch.Tensor, kv_len: int) -> torch.Tensor:
    """Keys (or values) 0..kv_len-1 of one sequence: ``[kv_len, num_kv_heads, head_dim]``."""
    block_size = cache.shape[1]
    j = torch.arange(kv_len, device=cache.device)  # logical key positions
    blocks = block_table[j // block_size].long()  # physical block of each key
    return cache[blocks, j % block_size]


def rope_paged_attention_ref(
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
) -> torch.Tensor:
    """Reference for ``rope_paged_attention`` (same arguments; see ``ops/launcher.py``)."""
    num_heads = q.shape[1]
    group = num_heads // k_cache.shape[2]  # query heads per kv head
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    for s in range(block_tables.shape[0]):
        kv_len = int(kv_lens[s])
        k = gather_sequence_kv(k_cache, block_tables[s], kv_len).float()  # (kv_len, H_kv, d)
        v = gather_sequence_kv(v_cache, block_tables[s], kv_len).float()  # (kv_len, H_kv, d)
        if cos_sin is not None:
            positions = torch.arange(kv_len, device=k.device)
            k = apply_rope(k, positions, cos_sin.float())  # key j rotated at its index j
        k = k.repeat_interleave(group, dim=1)  # (kv_len, H, d)
        v = v.repeat_interleave(group, dim=1)  # (kv_len, H, d)
        for i in range(int(cu_seqlens_q[s]), int(cu_seqlens_q[s + 1])):
            lo, hi = int(visible_start[i]), int(q_positions[i]) + 1  # visible keys: [lo, hi)
            scores = torch.einsum("hd,nhd->hn", q[i].float(), k[lo:hi]) * scale  # (H, n)
            weights = scores.softmax(dim=-1)  # (H, n)
            out[i] = torch.einsum("hn,nhd->hd", weights, v[lo:hi])  # (H, d)
    return out.to(q.dtype)
