"""Rotary position embedding, neox style (rotate-half), in vLLM's ``cos_sin`` layout.

``cos_sin`` is ``[max_position, rotary_dim]``; row p is ``[cos(p * inv_freq), sin(p * inv_freq)]`` with
``rotary_dim / 2`` values each. Only the first ``rotary_dim`` dims of a head are rotated (partial rotary,
as in Qwen3.5); the rest pass through. With ``x1 = x[:r/2]``, ``x2 = x[r/2:r]``:

    x1' = x1 * cos - x2 * sin
    x2' = x2 * cos + x1 * sin

The math runs in float32 and the result is rounded once to ``x``'s dtype, as the op's torch path and the Triton
scratch pass of long prefills do for keys in position-free mode, so "rotate at write" and "rotate at read" agree to
the last rounding. (The Triton kernel's in-loop rotation, decode and short reads, runs in the cache dtype: one more
rounding in 16 bits; ops/README.md says why.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def rope_cos_sin(
    max_position: int,
    rotary_dim: int,
    base: float = 10000.0,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Build the ``[max_position, rotary_dim]`` table: row p = [cos(p * inv_freq), sin(p * inv_freq)]."""
    if rotary_dim <= 0 or rotary_dim % 2:
        raise ValueError(f"rotary_dim must be a positive even number, got {rotary_dim}")
    inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim))
    angles = torch.arange(max_position, dtype=torch.float64)[:, None] * inv_freq[None, :]  # (P, r/2)
    return torch.cat([angles.cos(), angles.sin()], dim=-1).to(device=device, dtype=dtype)  # (P, r)


def rotate_with_rows(x: torch.Tensor, cos_sin_rows: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``[..., n, heads, head_dim]`` by per-row tables ``cos_sin_rows`` ``[..., n, rotary_dim]``.

    Leading dims of ``cos_sin_rows`` broadcast against ``x``'s; float32 math, result in ``x.dtype``.
    """
    rotary_dim = cos_sin_rows.shape[-1]
    half = rotary_dim // 2
    cos = cos_sin_rows[..., None, :half].float()  # (..., n, 1, r/2)
    sin = cos_sin_rows[..., None, half:].float()  # (..., n, 1, r/2)
    x1 = x[..., :half].float()  # (..., n, heads, r/2)
    x2 = x[..., half:rotary_dim].float()  # (..., n, heads, r/2)
    rotated = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)
    if rotary_dim == x.shape[-1]:
        return rotated
    return torch.cat([rotated, x[..., rotary_dim:]], dim=-1)


@dataclass(frozen=True, slots=True)
class RotationTables:
    """``rotate_with_rows``'s rotation as three multiplies and an add, for rows looked up once and used many times
    (the CPU decode mirror: one step's positions, every layer). Over a head, with ``x[swap]`` = [x2, x1, x_pass]:

        x' = x * cos_full + x[swap] * sin_signed      cos_full = [cos, cos, 1],  sin_signed = [-sin, sin, 0]

    Each product rounds as ``rotate_with_rows``'s do, and x1 cos + x2 (-sin) is x1 cos - x2 sin exactly: the same
    bits, in three eager ops where ``rotate_with_rows`` takes about fifteen."""

    cos_full: torch.Tensor  # [n, 1, head_dim] float32
    sin_signed: torch.Tensor  # [n, 1, head_dim] float32
    swap: torch.Tensor  # [head_dim] int64: the halves of the rotary part exchanged, the rest in place

    @classmethod
    def build(cls, cos_sin_rows: torch.Tensor, head_dim: int) -> RotationTables:
        """From ``cos_sin_rows`` ``[n, rotary_dim]`` for heads of ``head_dim``."""
        num_rows, rotary_dim = cos_sin_rows.shape
        half = rotary_dim // 2
        cos, sin = cos_sin_rows.float().split(half, dim=-1)  # (n, r/2) each
        rest = head_dim - rotary_dim
        cos_full = torch.cat([cos, cos, cos.new_ones(num_rows, rest)], dim=-1)  # (n, D)
        sin_signed = torch.cat([-sin, sin, sin.new_zeros(num_rows, rest)], dim=-1)  # (n, D)
        dims = torch.arange(head_dim)
        swap = torch.cat([dims[half:rotary_dim], dims[:half], dims[rotary_dim:]])
        return cls(cos_full[:, None], sin_signed[:, None], swap)

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` ``[n, heads, head_dim]`` rotated, in float32 (``rotate_with_rows`` rounds this to ``x.dtype``)."""
        x = x.float()
        return x * self.cos_full + x.index_select(-1, self.swap) * self.sin_signed


def rotate_in_place_(x: torch.Tensor, cos_sin_rows: torch.Tensor) -> torch.Tensor:
    """In-place ``rotate_with_rows`` for a float32 ``x`` that the caller owns (fewer passes over memory)."""
    half = cos_sin_rows.shape[-1] // 2
    cos = cos_sin_rows[..., None, :half].float()  # (..., n, 1, r/2)
    sin = cos_sin_rows[..., None, half:].float()  # (..., n, 1, r/2)
    x1, x2 = x[..., :half], x[..., half : 2 * half]  # views into x
    x1_orig = x1.clone()
    x1.mul_(cos).addcmul_(x2, sin, value=-1.0)  # x1' = x1 cos - x2 sin
    x2.mul_(cos).addcmul_(x1_orig, sin)  # x2' = x2 cos + x1 sin
    return x


def apply_rope(x: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``[num_tokens, num_heads, head_dim]`` at ``positions`` ``[num_tokens]`` (neox style).

    ``cos_sin`` is ``[max_position, rotary_dim]`` (see the module docstring); returns a new tensor of
    ``x``'s shape and dtype. The model uses it for queries, and for keys at write time in rotated-key mode.
    """
    if x.dim() != 3:
        raise ValueError(f"x must be [num_tokens, num_heads, head_dim], got shape {tuple(x.shape)}")
    if positions.shape != (x.shape[0],):
        raise ValueError(f"positions must be [{x.shape[0]}], got shape {tuple(positions.shape)}")
    if cos_sin.dim() != 2 or cos_sin.shape[1] % 2 or cos_sin.shape[1] > x.shape[-1]:
        raise ValueError(
            f"cos_sin must be [max_position, rotary_dim] with rotary_dim even and <= head_dim "
            f"({x.shape[-1]}), got shape {tuple(cos_sin.shape)}"
        )
    return rotate_with_rows(x, cos_sin.index_select(0, positions.long()))
