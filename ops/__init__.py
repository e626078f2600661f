"""Attention ops of minipic_lite: paged attention with RoPE applied to keys at read time."""

from ops.launcher import rope_paged_attention
from ops.reference import rope_paged_attention_ref
from ops.rope import apply_rope, rope_cos_sin

__all__ = ["apply_rope", "rope_cos_sin", "rope_paged_attention", "rope_paged_attention_ref"]
