"""The model's fused pieces: torch.compile'd versions equal the eager ones (the GPU path uses them)."""

import torch

from minipic_lite.models.llama import Kernels, add_rms_norm, silu_and_mul
from ops import rope_cos_sin


def test_compiled_kernels_equal_eager():
    torch.manual_seed(0)
    eager, compiled = Kernels(), Kernels.compiled()
    for num_tokens in (1, 7, 33):  # dynamic shapes: one compile serves every batch size
        x, delta = torch.randn(num_tokens, 64), torch.randn(num_tokens, 64)
        w = torch.randn(64)
        torch.testing.assert_close(compiled.rms_norm(x, w, 1e-5), eager.rms_norm(x, w, 1e-5))
        for a, b in zip(compiled.add_rms_norm(x, delta, w, 1e-5), eager.add_rms_norm(x, delta, w, 1e-5), strict=True):
            torch.testing.assert_close(a, b)
        gate_up = torch.randn(num_tokens, 96)
        torch.testing.assert_close(compiled.silu_and_mul(gate_up), eager.silu_and_mul(gate_up))
        q, pos = torch.randn(num_tokens, 3, 32), torch.randint(0, 100, (num_tokens,))
        cos_sin = rope_cos_sin(128, 32)
        torch.testing.assert_close(compiled.apply_rope(q, pos, cos_sin), eager.apply_rope(q, pos, cos_sin))


def test_add_rms_norm_is_the_residual_add_then_norm():
    x, delta, w = torch.randn(5, 16), torch.randn(5, 16), torch.randn(16)
    summed, normed = add_rms_norm(x, delta, w, 1e-6)
    torch.testing.assert_close(summed, x + delta)
    expected = w * (summed / summed.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt())
    torch.testing.assert_close(normed, expected)
    gate, up = torch.randn(4, 8), torch.randn(4, 8)
    torch.testing.assert_close(silu_and_mul(torch.cat([gate, up], -1)), gate * torch.sigmoid(gate) * up)
