"""ops/skinny_matmul.py under the interpreter: the skinny matmul against F.linear in float64 at few rows, with one
split and with the last program of a column tile adding the splits' partials; its counts left zero for the next call;
its configs; and the operands it refuses, by name."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ops.skinny_matmul import (
    SHARED_MEMORY_BUDGET,
    SkinnyConfig,
    SkinnyRoute,
    block_m_for,
    pick_skinny_config,
    skinny_device_ok,
    skinny_linear,
    skinny_unsupported,
)


def reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return F.linear(x.double(), weight.double())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    ("rows", "k", "n", "config"),
    [
        (1, 64, 64, SkinnyConfig(64, 32, 1, 2)),
        (5, 128, 96, SkinnyConfig(64, 32, 2, 2)),  # 2 column tiles, the second half past N; two splits
        (17, 256, 64, SkinnyConfig(64, 64, 4, 2)),  # a 32-row x tile, four splits
        (24, 128, 128, SkinnyConfig(128, 32, 1, 3)),
    ],
)  # fmt: skip
def test_the_skinny_matmul_is_f_linear(dtype, rows, k, n, config):
    torch.manual_seed(rows)
    x, weight = torch.randn(rows, k, dtype=dtype), torch.randn(n, k, dtype=dtype)
    counts = torch.zeros(-(-n // config.block_n), dtype=torch.int32)
    expected = reference(x, weight)
    for _ in range(2):  # the counts are left zero: a second call adds its splits up as the first did
        got = skinny_linear(x, weight, config, counts, pdl=False)
        assert got.dtype == dtype and got.shape == (rows, n)
        torch.testing.assert_close(got.double(), expected, atol=2e-2 * expected.abs().max().item(), rtol=0)
        assert not counts.any()


def test_a_route_adds_the_bias_and_keeps_one_counts_buffer_a_shape():
    torch.manual_seed(0)
    route = SkinnyRoute()
    weight, bias = torch.randn(96, 256, dtype=torch.float16), torch.randn(96, dtype=torch.float16)
    x = torch.randn(3, 256, dtype=torch.float16)
    assert pick_skinny_config(3, 256, 96).splits == 2  # an output this narrow takes two splits
    expected = reference(x, weight) + bias.double()
    buffers = []
    for _ in range(2):  # NOTE: one buffer, made at the first call (the probe's warm-up, before any graph's capture)
        torch.testing.assert_close(route(x, weight, bias).double(), expected, atol=2e-2 * expected.abs().max(), rtol=0)
        buffers += route.counts.values()
    assert len(route.counts) == 1 and buffers[0] is buffers[1] and not buffers[0].any()
    assert not route.supports(3, weight)  # a CPU weight: the route is for CUDA graphs' steps


def test_configs_follow_the_measured_projections_and_fit():
    """pick_skinny_config's rule gives the H200's fastest at Llama-3-8B's projections (its docstring), divides K,
    and keeps its pipelined tiles within the shared-memory budget at every row count."""
    measured = {(4096, 6144): (64, 256, 1, 4), (4096, 4096): (64, 256, 2, 3), (4096, 28672): (128, 128, 1, 4),
                (14336, 4096): (64, 128, 2, 6)}  # fmt: skip
    for (k, n), tiles in measured.items():
        c = pick_skinny_config(17, k, n)
        assert (c.block_n, c.block_k, c.splits, c.num_stages) == tiles, (k, n, c)
    for rows in (1, 16, 17, 24, 32, 48, 64):
        # NOTE: 4160 and 4128 are multiples of 64 and of 32 only: smaller K steps, then (4128) one split
        for k, n in [*measured, (128256, 4096), (4096, 128256), (576, 1536), (1536, 576), (4160, 64), (4128, 64)]:
            c = pick_skinny_config(rows, k, n)
            assert k % (c.splits * c.block_k) == 0, (rows, k, n, c)
            assert c.num_stages * 2 * c.block_k * (c.block_n + block_m_for(rows)) <= SHARED_MEMORY_BUDGET


def test_operands_the_kernel_cannot_take_are_named():
    c = SkinnyConfig(64, 64, 2, 2)
    w = torch.zeros(64, 256, dtype=torch.float16)
    assert skinny_unsupported(torch.zeros(4, 256, dtype=torch.float16), w, c) is None
    assert "65 rows (1 to 64)" in skinny_unsupported(torch.zeros(65, 256, dtype=torch.float16), w, c)
    assert "torch.float32" in skinny_unsupported(torch.zeros(4, 256), w.float(), c)
    assert "bfloat16" in skinny_unsupported(torch.zeros(4, 256, dtype=torch.bfloat16), w, c)
    assert "K=192 is not a multiple of 2 splits x 64" in skinny_unsupported(
        torch.zeros(4, 192, dtype=torch.float16), torch.zeros(64, 192, dtype=torch.float16), c
    )
    assert "are not [M, K] and [N, K]" in skinny_unsupported(torch.zeros(4, 128, dtype=torch.float16), w, c)
    strided = torch.zeros(4, 512, dtype=torch.float16)[:, ::2]
    assert "x must have K contiguous" in skinny_unsupported(strided, w, c)
    with pytest.raises(ValueError, match=r"^skinny matmul: 65 rows"):
        skinny_linear(torch.zeros(65, 256, dtype=torch.float16), w, c)


def test_the_route_takes_only_gpus_with_tma(monkeypatch):
    """The kernel's weight loads are tensor descriptors (TMA: Hopper and later): an older GPU, and the CPU, keep the
    libraries' routes. (A CUDA device object needs no GPU; the capability probe is replaced.)"""
    import ops.triton_kernel as tk

    capabilities = {0: 9, 1: 8}
    monkeypatch.setattr(tk, "_has_tma", lambda index: capabilities[index] >= 9)
    assert skinny_device_ok(torch.device("cuda", 0))
    assert skinny_device_ok(torch.device("cuda"))  # no index: the current device, 0 here
    assert not skinny_device_ok(torch.device("cuda", 1))
    assert not skinny_device_ok(torch.device("cpu"))
    assert not SkinnyRoute().supports(16, torch.zeros(64, 256, dtype=torch.bfloat16))  # a CPU weight
