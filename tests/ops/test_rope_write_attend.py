"""`rope_write_attend`: a decode's RoPE, K/V write and attention in one launch, held (under the Triton
interpreter) to what the three steps compute apart: `apply_rope` on the queries, the keys and values written to
their slots, and the reference attention over the written cache."""

from __future__ import annotations

import pytest
import torch

from ops import apply_rope, rope_paged_attention_ref
from ops.testing import SeqSpec, assert_close, make_problem
from ops.triton_kernel import rope_write_attend

TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 3e-2}
HEADS, KV_HEADS, HEAD_DIM, BLOCK = 8, 2, 64, 16

DECODES = [  # kv_len (the new key is at kv_len - 1), and where its span starts (visible_start) if not at 0
    SeqSpec.decode(1),  # the new key alone
    SeqSpec.decode(17),
    SeqSpec.decode(33),  # the new key opens a 16-key tile
    SeqSpec.decode(90),
    SeqSpec(40, ((39, 40),), ((39, 40),)),  # a span that starts at the new key: nothing to read from the cache
    SeqSpec(65, ((64, 65),), ((64, 65),)),  # ... on a tile's first key: no key tile either
    SeqSpec(70, ((69, 70),), ((20, 70),)),  # a span past the first keys
]


def problem_with_new_kv(dtype: torch.dtype, seed: int):
    """(problem, q, k_new, v_new, slots): unrotated queries and the new keys and values as views of one fused
    projection's output (strided, as the model's), each written to block_tables[s, p // B] at offset p % B."""
    problem = make_problem(DECODES, HEADS, KV_HEADS, HEAD_DIM, BLOCK, dtype, seed=seed)
    n = problem.q.shape[0]
    gen = torch.Generator().manual_seed(seed + 1)
    qkv = torch.randn(n, (HEADS + 2 * KV_HEADS) * HEAD_DIM, generator=gen).to(dtype)
    q, k_new, v_new = qkv.split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], dim=-1)
    pos = problem.q_positions
    slots = problem.block_tables[torch.arange(n), pos // BLOCK].long() * BLOCK + pos % BLOCK
    shape = (n, KV_HEADS, HEAD_DIM)
    return problem, q.view(n, HEADS, HEAD_DIM), k_new.view(shape), v_new.view(shape), slots


def three_steps(problem, q, k_new, v_new, slots):
    """(output, k_cache, v_cache) of the model's separate steps, on copies of the caches."""
    k_cache, v_cache = problem.k_cache.clone(), problem.v_cache.clone()
    k_cache.view(-1, KV_HEADS, HEAD_DIM).index_copy_(0, slots, k_new)
    v_cache.view(-1, KV_HEADS, HEAD_DIM).index_copy_(0, slots, v_new)
    q_rot = apply_rope(q, problem.q_positions, problem.cos_sin)
    args = list(problem.args())
    args[0], args[1], args[2] = q_rot, k_cache, v_cache
    return rope_paged_attention_ref(*args), k_cache, v_cache


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(
    "config",
    [None, {"NUM_SPLITS": 3}, {"NUM_SPLITS": 4, "TILE_N": 16, "TABLE_AHEAD": True, "num_stages": 2}],
    ids=["default", "3_splits", "4_splits_ahead"],
)
def test_one_launch_computes_what_rope_write_and_attention_do_apart(dtype, config):
    problem, q, k_new, v_new, slots = problem_with_new_kv(dtype, seed=7)
    expected, k_expected, v_expected = three_steps(problem, q, k_new, v_new, slots)
    k_cache, v_cache = problem.k_cache.clone(), problem.v_cache.clone()
    args = problem.args()
    out = torch.full_like(problem.q, float("nan"))  # poisoned: every element must be written
    got = rope_write_attend(q, k_new, v_new, slots, k_cache, v_cache, *args[3:], config=config, out=out)
    assert torch.equal(k_cache, k_expected) and torch.equal(v_cache, v_expected)  # written once, nothing else
    tol = TOLERANCE[dtype]
    assert_close(got, expected, atol=tol, rtol=tol, what=f"{dtype} {config}")


def test_it_refuses_what_it_cannot_do():
    problem, q, k_new, v_new, slots = problem_with_new_kv(torch.float32, seed=3)
    args = problem.args()
    with pytest.raises(ValueError, match="position-free"):
        rope_write_attend(q, k_new, v_new, slots, *args[1:8], None, problem.scale)
    with pytest.raises(ValueError, match="k_new must be"):
        rope_write_attend(q, k_new[:, :1], v_new, slots, *args[1:])
    with pytest.raises(ValueError, match="slot_mapping"):
        rope_write_attend(q, k_new, v_new, slots[:-1], *args[1:])
    with pytest.raises(ValueError, match="one query token a sequence"):
        rope_write_attend(q[:-1], k_new[:-1], v_new[:-1], slots[:-1], *args[1:])
