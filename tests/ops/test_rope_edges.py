"""Edges of ops/rope.py that the op's tests leave open: an odd rotary_dim is refused by the table builder and by
apply_rope, and apply_rope names positions of the wrong length."""

import pytest
import torch

from ops import apply_rope
from ops.rope import rope_cos_sin


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
