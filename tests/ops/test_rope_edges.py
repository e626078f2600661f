"""Edges of ops/rope.py that the op's tests leave open: an odd or zero rotary_dim is refused by the table builder
and an odd one by apply_rope, apply_rope names positions of the wrong length, the table's default base is
the RoPE paper's 10000, tables with leading batch dims rotate each batch row by its own table (out of place
and in place), and partial rotary passes the tail through whatever the head count."""

import pytest
import torch

from ops import apply_rope
from ops.rope import rope_cos_sin, rotate_in_place_, rotate_with_rows


def test_rope_cos_sin_refuses_an_odd_rotary_dim():
    with pytest.raises(ValueError, match="rotary_dim must be a positive even number, got 7"):
        rope_cos_sin(16, 7)


def test_apply_rope_refuses_an_odd_rotary_dim():
    x, positions = torch.randn(3, 2, 8), torch.arange(3)
    with pytest.raises(ValueError, match="^cos_sin must be"):
        apply_rope(x, positions, torch.randn(16, 7))


def test_apply_rope_refuses_positions_of_another_length():
    x, cos_sin = torch.randn(3, 2, 8), rope_cos_sin(16, 8)
    with pytest.raises(ValueError, match=r"^positions must be \[3\], got shape \(2,\)"):
        apply_rope(x, torch.arange(2), cos_sin)


def test_apply_rope_refuses_x_without_a_heads_axis():
    x, cos_sin = torch.randn(3, 8), rope_cos_sin(16, 8)
    with pytest.raises(ValueError, match=r"^x must be \[num_tokens, num_heads, head_dim\], got shape \(3, 8\)$"):
        apply_rope(x, torch.arange(3), cos_sin)


def rotated_float64(x: torch.Tensor, positions: torch.Tensor, rotary_dim: int, base: float) -> torch.Tensor:
    """Neox rotate-half of x [..., heads, head_dim] at positions [...] (x's leading dims), in float64."""
    half = rotary_dim // 2
    inv_freq = base ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    angles = positions.double()[..., None, None] * inv_freq  # (..., 1, r/2)
    x1, x2, rest = x[..., :half].double(), x[..., half:rotary_dim].double(), x[..., rotary_dim:].double()
    return torch.cat([x1 * angles.cos() - x2 * angles.sin(), x2 * angles.cos() + x1 * angles.sin(), rest], -1)


def test_rope_cos_sin_refuses_a_rotary_dim_of_zero():
    with pytest.raises(ValueError, match="rotary_dim must be a positive even number, got 0"):
        rope_cos_sin(16, 0)


def test_rope_cos_sin_defaults_to_the_rope_papers_base_of_10000():
    # RoFormer's theta_i = 10000^(-2i/d), the rope_theta transformers' Llama config defaults to
    positions = torch.arange(64)
    x = torch.eye(16).expand(64, 16, 16)  # each head a unit vector: the rotation's matrix, column by column
    actual = apply_rope(x, positions, rope_cos_sin(64, 16))
    torch.testing.assert_close(actual, rotated_float64(x, positions, 16, 10000.0).float(), rtol=1e-5, atol=1e-5)


def test_tables_with_a_batch_dim_rotate_each_batch_row_by_its_own_rows():
    torch.manual_seed(0)
    positions = torch.tensor([[0, 3, 9, 40, 7], [100, 1, 63, 2, 5]])  # (batch 2, n 5)
    rows = rope_cos_sin(128, 8)[positions]  # (2, 5, 8): rotary_dim 8 of head_dim 16
    x = torch.randn(2, 5, 3, 16)
    expected = rotated_float64(x, positions, 8, 10000.0).float()
    torch.testing.assert_close(rotate_with_rows(x, rows), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rotate_in_place_(x.clone(), rows), expected, rtol=1e-5, atol=1e-5)


def test_partial_rotary_passes_the_tail_through_when_the_head_count_equals_rotary_dim():
    torch.manual_seed(0)
    x, positions = torch.randn(4, 8, 16), torch.tensor([0, 5, 17, 30])  # 8 heads, rotary_dim 8 of 16
    actual = apply_rope(x, positions, rope_cos_sin(32, 8))
    torch.testing.assert_close(actual, rotated_float64(x, positions, 8, 10000.0).float(), rtol=1e-5, atol=1e-5)
