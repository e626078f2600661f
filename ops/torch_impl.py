"""Vectorized PyTorch implementation of ``rope_paged_attention`` (the engine's CPU path).

Per group of sequences with similar query counts:

1. gather each sequence's keys/values through its block table into a padded ``[n, max_kv, H_kv, d]``
   tensor (one ``index_select`` each),
2. in position-free mode rotate all gathered keys at positions ``0..max_kv-1`` in one shot,
3. pad the queries per sequence into ``[n, H, max_q, d]``,
4. build the boolean mask ``visible_start[i] <= j <= q_positions[i]``,
5. one ``F.scaled_dot_product_attention`` call, scattered back to the packed token layout.

Sequences are grouped by ``ceil(log2(q_len))`` so a mixed batch (one 512-token prefill chunk + 31 decode
tokens) does not pad every decode sequence to 512 query rows: padding waste stays under 2x per group.
Math in float32 (inputs are upcast), output in ``q``'s dtype.

A group of long query runs (prefill chunks: ``RUNS_MIN_QUERIES`` or more a sequence) goes run by run instead
(``attend_runs``): a sequence's queries are cut where ``visible_start`` changes, and each run reads only its own
window of keys, causally (SDPA's ``is_causal``, which skips the masked half) where the run's queries are its
window's keys. A span attends to itself alone, so a prompt of many spans costs the sum of its spans' squares,
not the square of their sum, the CPU's side of "each span attends only to itself".
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ops.rope import rotate_in_place_

RUNS_MIN_QUERIES = 32  # a group whose sequences have this many queries or more goes run by run (attend_runs)


def group_by_query_len(q_lens: list[int]) -> list[list[int]]:
    """Sequence ids bucketed by ``ceil(log2(q_len))`` (decode tokens form one bucket)."""
    buckets: dict[int, list[int]] = {}
    for seq_id, q_len in enumerate(q_lens):
        buckets.setdefault((q_len - 1).bit_length(), []).append(seq_id)
    return [buckets[key] for key in sorted(buckets)]


def gather_padded_kv(
    cache: torch.Tensor, block_tables: torch.Tensor, kv_lens: torch.Tensor, max_kv: int
) -> torch.Tensor:
    """Keys (or values) of each sequence, padded: ``[n, max_kv, num_kv_heads, head_dim]``.

    Block-table entries past a sequence's last used block may hold anything (e.g. -1): they are
    replaced by block 0, whose rows land past ``kv_len`` and are masked out.
    """
    block_size = cache.shape[1]
    num_blocks = -(-max_kv // block_size)
    tables = block_tables[:, :num_blocks].long()  # (n, nb)
    block_starts = torch.arange(num_blocks, device=tables.device) * block_size  # (nb,)
    tables = torch.where(block_starts[None, :] < kv_lens[:, None], tables, 0)
    # NOTE: index_select on the 2-D view copies whole blocks as rows; on the 4-D tensor it is ~10x slower.
    kv = cache.view(cache.shape[0], -1).index_select(0, tables.flatten())  # (n * nb, B * H_kv * d)
    kv = kv.view(tables.shape[0], num_blocks * block_size, *cache.shape[2:])  # (n, nb * B, H_kv, d)
    return kv[:, :max_kv]


def gather_rotated_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    kv_lens: torch.Tensor,
    max_kv: int,
    cos_sin: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values of each sequence in float32, ``[n, max_kv, H_kv, d]`` each, key j rotated at position j in
    position-free mode (``cos_sin`` given). The gather is a fresh copy, so rotating it in place leaves the cache
    untouched."""
    k = gather_padded_kv(k_cache, block_tables, kv_lens, max_kv).float()
    v = gather_padded_kv(v_cache, block_tables, kv_lens, max_kv).float()
    return (k if cos_sin is None else rotate_in_place_(k, cos_sin[:max_kv])), v


def attend_group(
    out: torch.Tensor,
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
    max_q: int,
) -> None:
    """Attention for the sequences whose metadata is passed (already sliced to the group); writes ``out``."""
    device = q.device
    num_seqs = block_tables.shape[0]
    max_kv = int(kv_lens.max())
    k, v = gather_rotated_kv(k_cache, v_cache, block_tables, kv_lens, max_kv, cos_sin)  # (n, max_kv, H_kv, d) each
    # -- pad queries per sequence: token t of seq s goes to row s * max_q + (t - cu[s]) --
    q_lens = cu_seqlens_q[1:] - cu_seqlens_q[:-1]  # (n,)
    seq_of_token = torch.repeat_interleave(torch.arange(num_seqs, device=device), q_lens)  # (T_g,)
    first_of_seq = torch.cumsum(q_lens, 0) - q_lens  # (n,) exclusive prefix sum
    offset = torch.arange(seq_of_token.numel(), device=device) - first_of_seq[seq_of_token]  # (T_g,)
    token_ids = cu_seqlens_q[:-1].long()[seq_of_token] + offset  # rows of q / out
    slots = seq_of_token * max_q + offset  # rows of the padded layout
    qp = q.new_zeros((num_seqs * max_q, *q.shape[1:]), dtype=torch.float32)  # (n * max_q, H, d)
    qp[slots] = q[token_ids].float()
    # NOTE: padded query rows get position 0 and visible_start 0: they see key 0 (always valid), so no
    # softmax row is empty (an empty row would be NaN); they are dropped below.
    pos = torch.zeros(num_seqs * max_q, dtype=torch.long, device=device)
    start = torch.zeros(num_seqs * max_q, dtype=torch.long, device=device)
    pos[slots] = q_positions[token_ids].long()
    start[slots] = visible_start[token_ids].long()
    j = torch.arange(max_kv, device=device)
    mask = (j[None, :] >= start[:, None]) & (j[None, :] <= pos[:, None])  # (n * max_q, max_kv)
    # -- one SDPA call for the whole group --
    # NOTE: GQA by folding the G query heads of a kv head into the query-row axis (rows g * max_q + t), so
    # keys and values are never replicated per query head (enable_gqa on the CPU copies them G times).
    num_kv_heads, head_dim = k_cache.shape[2], q.shape[2]
    group = q.shape[1] // num_kv_heads
    qf = qp.view(num_seqs, max_q, num_kv_heads, group, head_dim).permute(0, 2, 3, 1, 4)  # (n, H_kv, G, max_q, d)
    maskf = mask.view(num_seqs, 1, 1, max_q, max_kv).expand(num_seqs, 1, group, max_q, max_kv)
    o = F.scaled_dot_product_attention(
        qf.reshape(num_seqs, num_kv_heads, group * max_q, head_dim),  # (n, H_kv, G * max_q, d)
        k.transpose(1, 2),  # (n, H_kv, max_kv, d)
        v.transpose(1, 2),  # (n, H_kv, max_kv, d)
        attn_mask=maskf.reshape(num_seqs, 1, group * max_q, max_kv),
        scale=scale,
    )  # (n, H_kv, G * max_q, d)
    o = o.view(num_seqs, num_kv_heads, group, max_q, head_dim).permute(0, 3, 1, 2, 4)  # (n, max_q, H_kv, G, d)
    out[token_ids] = o.reshape(num_seqs * max_q, *q.shape[1:])[slots].to(out.dtype)


def query_runs(visible_start: list[int]) -> list[tuple[int, int]]:
    """[start, end) of each run of equal ``visible_start`` in one sequence's queries."""
    cuts = [i for i in range(1, len(visible_start)) if visible_start[i] != visible_start[i - 1]]
    bounds = [0, *cuts, len(visible_start)]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def attend_runs(
    out: torch.Tensor,
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
) -> None:
    """``attend_group``'s result, one sequence and one run of equal ``visible_start`` at a time: the run's
    queries read keys [start, last position] only; causally where they are exactly those keys' positions (a span,
    a prompt from its start), through a mask over that window where not (a final part that sees the spans before
    it, a chunk after cached blocks, a hole where blocks hit)."""
    cu, positions, starts = cu_seqlens_q.tolist(), q_positions.tolist(), visible_start.tolist()
    group = q.shape[1] // k_cache.shape[2]
    for s in range(block_tables.shape[0]):
        one = slice(s, s + 1)
        k, v = gather_rotated_kv(k_cache, v_cache, block_tables[one], kv_lens[one], int(kv_lens[s]), cos_sin)
        k, v = k[0], v[0]  # (kv_len, H_kv, d)
        first = cu[s]
        for a, b in query_runs(starts[cu[s] : cu[s + 1]]):
            pos = positions[first + a : first + b]
            start, end = starts[first + a], pos[-1] + 1
            # NOTE: 4-D (a batch of one): torch's CPU flash kernel takes 4-D inputs; 3-D ones went to its math path
            keys = k[start:end].repeat_interleave(group, dim=1).transpose(0, 1)[None]  # (1, H, window, d)
            values = v[start:end].repeat_interleave(group, dim=1).transpose(0, 1)[None]
            queries = q[first + a : first + b].float().transpose(0, 1)[None]  # (1, H, n, d)
            if pos == list(range(start, end)):
                o = F.scaled_dot_product_attention(queries, keys, values, is_causal=True, scale=scale)
            else:
                seen = torch.arange(start, end, device=q.device)[None, :] <= q_positions[first + a : first + b, None]
                o = F.scaled_dot_product_attention(queries, keys, values, attn_mask=seen, scale=scale)
            out[first + a : first + b] = o[0].transpose(0, 1).to(out.dtype)  # (n, H, d)


def rope_paged_attention_torch(
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
    """Vectorized ``rope_paged_attention`` (same arguments; see ``ops/launcher.py``)."""
    out = torch.empty_like(q)
    cu = cu_seqlens_q.tolist()
    q_lens = [cu[s + 1] - cu[s] for s in range(len(cu) - 1)]
    groups = group_by_query_len(q_lens)
    for seq_ids in groups:
        max_q = max(q_lens[s] for s in seq_ids)
        if len(groups) == 1:
            tables, lens, cu_g = block_tables, kv_lens, cu_seqlens_q
            pos, vis, q_g = q_positions, visible_start, q
            token_ids = None
        else:
            idx = torch.tensor(seq_ids, device=q.device)
            token_ids = torch.cat([torch.arange(cu[s], cu[s + 1]) for s in seq_ids]).to(q.device)
            lens_g = torch.tensor([q_lens[s] for s in seq_ids])
            cu_g = torch.cat([lens_g.new_zeros(1), lens_g.cumsum(0)]).to(q.device)
            tables, lens = block_tables[idx], kv_lens[idx]
            pos, vis, q_g = q_positions[token_ids], visible_start[token_ids], q[token_ids]
        out_g = out if token_ids is None else torch.empty_like(q_g)
        args = (out_g, q_g, k_cache, v_cache, tables, cu_g, pos, lens, vis, cos_sin, scale)
        if min(q_lens[s] for s in seq_ids) >= RUNS_MIN_QUERIES:
            attend_runs(*args)  # prefill chunks: each run over its own window of keys
        else:
            attend_group(*args, max_q)
        if token_ids is not None:
            out[token_ids] = out_g
    return out
