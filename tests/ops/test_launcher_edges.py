"""Edges of the launcher's checks (ops/launcher.py) that test_launcher_rejects leaves open: each bound at the
first value past it and at the last value inside it, and the checks whose bad values would otherwise fail elsewhere
without naming the argument. One prefill of 20 keys over blocks of 16 (its second block partial) and, for the decode
hint, a decode then a two-token chunk; impl="ref" is the reference itself."""

import math

import pytest
import torch

from ops import rope_paged_attention, rope_paged_attention_ref
from ops.testing import SeqSpec, make_problem

NAMES = ["q", "k_cache", "v_cache", "block_tables", "cu_seqlens_q", "q_positions", "kv_lens", "visible_start"]
NAMES += ["cos_sin", "scale"]


def args_of(specs: list[SeqSpec]) -> dict:
    problem = make_problem(specs, 4, 2, 16, 16, torch.float32, seed=3)
    return dict(zip(NAMES, problem.args(), strict=True))


@pytest.fixture
def args() -> dict:
    return args_of([SeqSpec.prefill(20)])


def changed(a: dict, name: str, fn) -> dict:
    t = a[name].clone()
    fn(t)
    return {**a, name: t}


def test_the_fixture_passes(args):
    assert rope_paged_attention(**args).shape == args["q"].shape


def test_cu_seqlens_q_must_end_at_num_tokens(args):
    short = changed(args, "cu_seqlens_q", lambda t: t.__setitem__(-1, t[-1] - 1))
    with pytest.raises(ValueError, match="^cu_seqlens_q: must start at 0 and end at num_tokens"):
        rope_paged_attention(**short)


def test_kv_lens_one_past_the_tables_capacity_is_rejected(args):
    capacity = args["block_tables"].shape[1] * args["k_cache"].shape[1]
    with pytest.raises(ValueError, match=r"^kv_lens: each must lie in \[1, max_blocks"):
        rope_paged_attention(**changed(args, "kv_lens", lambda t: t.__setitem__(0, capacity + 1)))


def test_a_bad_block_id_in_a_partial_last_block_is_rejected(args):
    num_blocks = args["k_cache"].shape[0]
    bad = changed(args, "block_tables", lambda t: t.__setitem__((0, 1), num_blocks))  # keys 16..19
    with pytest.raises(ValueError, match=rf"^block_tables: block id {num_blocks} out of range"):
        rope_paged_attention(**bad)


def test_a_query_at_its_sequences_kv_len_is_rejected(args):
    with pytest.raises(ValueError, match="^q_positions"):
        rope_paged_attention(**changed(args, "q_positions", lambda t: t.__setitem__(-1, 20)))


def test_visible_start_one_past_its_position_is_rejected(args):
    bad = changed(args, "visible_start", lambda t: t.__setitem__(-1, 20))  # the last query sits at 19
    with pytest.raises(ValueError, match="^visible_start"):
        rope_paged_attention(**bad)


def test_cos_sin_one_row_short_is_rejected(args):
    with pytest.raises(ValueError, match="^cos_sin: has 19 rows"):
        rope_paged_attention(**{**args, "cos_sin": args["cos_sin"][:19]})


@pytest.mark.parametrize("rotary_dim", [0, 18], ids=["zero", "head_dim-plus-2"])
def test_a_rotary_dim_of_zero_or_past_head_dim_is_rejected(args, rotary_dim):
    cos_sin = torch.ones(args["cos_sin"].shape[0], rotary_dim)
    with pytest.raises(ValueError, match=rf"^cos_sin: rotary_dim \({rotary_dim}\) must be even, > 0"):
        rope_paged_attention(**{**args, "cos_sin": cos_sin})


def test_no_kv_heads_is_rejected_by_name(args):
    empty = args["k_cache"][:, :, :0]
    with pytest.raises(ValueError, match="^k_cache: num_heads"):
        rope_paged_attention(**{**args, "k_cache": empty, "v_cache": empty})


def test_caches_of_another_float_dtype_than_q_are_rejected(args):
    with pytest.raises(ValueError, match="^k_cache: dtype torch.float16 differs"):
        rope_paged_attention(**{**args, "k_cache": args["k_cache"].half(), "v_cache": args["v_cache"].half()})


@pytest.mark.parametrize("scale", [0.0, math.nan], ids=["zero", "nan"])
def test_a_zero_or_nan_scale_is_rejected(args, scale):
    with pytest.raises(ValueError, match="^scale"):
        rope_paged_attention(**{**args, "scale": scale})


def test_a_decode_hint_that_takes_in_a_two_token_chunk_is_rejected():
    args = args_of([SeqSpec.decode(5), SeqSpec(9, ((7, 9),))])
    rope_paged_attention(**args, num_decode_seqs=1)
    with pytest.raises(ValueError, match="^num_decode_seqs: the first 2 sequences"):
        rope_paged_attention(**args, num_decode_seqs=2)


@pytest.mark.parametrize("head_dim", [8, 24])
def test_the_triton_path_refuses_a_head_dim_that_is_no_power_of_two_from_16(head_dim):
    """The torch path takes any even head_dim; the kernel's tiles need a power of two >= 16, said before launch."""
    args = make_problem([SeqSpec.prefill(5)], 4, 2, head_dim, 16, torch.float32, seed=3).args()
    assert rope_paged_attention(*args, impl="torch").shape == (5, 4, head_dim)
    message = f"^q: the Triton kernel needs head_dim a power of two >= 16, got {head_dim}$"
    with pytest.raises(ValueError, match=message):
        rope_paged_attention(*args, impl="triton")


def test_the_triton_path_refuses_cpu_tensors_unless_triton_interprets(args, monkeypatch):
    from ops import triton_kernel

    monkeypatch.setattr(triton_kernel, "_interpreting", lambda: False)
    message = r"^q: the Triton kernel needs CUDA tensors \(or TRITON_INTERPRET=1\), got cpu$"
    with pytest.raises(ValueError, match=message):
        rope_paged_attention(**args, impl="triton")


def test_kv_lens_filling_every_block_of_the_table_is_accepted():
    args = args_of([SeqSpec.prefill(32)])  # two blocks of 16, plus a spare column
    expected = rope_paged_attention(**args, impl="ref")
    full = {**args, "block_tables": args["block_tables"][:, :2].contiguous()}  # capacity 32 = kv_len
    torch.testing.assert_close(rope_paged_attention(**full), expected, rtol=2e-5, atol=2e-5)


def test_a_bad_block_id_in_a_last_block_holding_a_single_key_is_rejected():
    args = args_of([SeqSpec.prefill(17)])  # key 16 alone in the second block
    num_blocks = args["k_cache"].shape[0]
    bad = changed(args, "block_tables", lambda t: t.__setitem__((0, 1), num_blocks))
    with pytest.raises(ValueError, match=rf"^block_tables: block id {num_blocks} out of range"):
        rope_paged_attention(**bad)


def test_the_block_id_named_is_the_bad_one_not_a_block_0_before_it(args):
    num_blocks = args["k_cache"].shape[0]
    bad = changed(args, "block_tables", lambda t: t.__setitem__((0, slice(0, 2)), torch.tensor([0, -3])))
    with pytest.raises(ValueError, match=rf"^block_tables: block id -3 out of range \[0, {num_blocks}\)"):
        rope_paged_attention(**bad)


def test_cos_sin_with_exactly_one_row_per_key_is_accepted(args):
    expected = rope_paged_attention(**args)
    exact = {**args, "cos_sin": args["cos_sin"][:20]}  # keys 0..19
    torch.testing.assert_close(rope_paged_attention(**exact), expected, rtol=0, atol=0)


def test_cos_sin_on_another_device_than_q_is_rejected_by_name(args):
    with pytest.raises(ValueError, match="^cos_sin: on meta, but q is on cpu"):
        rope_paged_attention(**{**args, "cos_sin": args["cos_sin"].to("meta")})


def test_impl_ref_returns_the_references_output(args):
    assert torch.equal(rope_paged_attention(**args, impl="ref"), rope_paged_attention_ref(**args))


def test_the_triton_path_takes_cpu_tensors_while_triton_interprets(args):
    """tests/ops/conftest.py sets TRITON_INTERPRET=1: the checked launch runs the kernel on the CPU tensors."""
    expected = rope_paged_attention(**args, impl="ref")
    torch.testing.assert_close(rope_paged_attention(**args, impl="triton"), expected, rtol=2e-5, atol=2e-5)
