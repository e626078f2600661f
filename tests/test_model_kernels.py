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
        q, k, v = torch.randn(num_tokens, 6, 32), torch.randn(num_tokens, 3, 32), torch.randn(num_tokens, 3, 32)
        pos, slots = torch.randint(0, 100, (num_tokens,)), torch.randperm(40)[:num_tokens]
        cos_sin = rope_cos_sin(128, 32)
        for rotate_keys in (False, True):
            caches = [torch.zeros(2, 10, 4, 3, 32) for _ in range(2)]  # eager's and compiled's (k, v) caches
            outs = [
                kernels.rope_and_write_kv(q, k, v, pos, cos_sin, cache[0], cache[1], slots, rotate_keys)
                for kernels, cache in ((eager, caches[0]), (compiled, caches[1]))
            ]
            for a, b in zip(*outs, strict=True):
                torch.testing.assert_close(a, b)
            torch.testing.assert_close(caches[0], caches[1])
            assert torch.equal(caches[0][1].view(-1, 3, 32)[slots], v)  # values land in their slots as they are


def test_add_rms_norm_is_the_residual_add_then_norm():
    x, delta, w = torch.randn(5, 16), torch.randn(5, 16), torch.randn(16)
    summed, normed = add_rms_norm(x, delta, w, 1e-6)
    torch.testing.assert_close(summed, x + delta)
    expected = w * (summed / summed.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt())
    torch.testing.assert_close(normed, expected)
    gate, up = torch.randn(4, 8), torch.randn(4, 8)
    torch.testing.assert_close(silu_and_mul(torch.cat([gate, up], -1)), gate * torch.sigmoid(gate) * up)
