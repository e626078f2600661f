"""The fused add + RMSNorm + projection of batch-1 decode (models/fused_one_row.py), against its reference, and the
reference against the unfused kernels the model runs otherwise (llama.py's add_rms_norm, F.linear, silu_and_mul)."""

import os

import pytest
import torch
import torch.nn.functional as F

from minipic_lite.models.fused_one_row import add_norm_matmul, add_norm_matmul_reference
from minipic_lite.models.llama import add_rms_norm, rms_norm, silu_and_mul

EPS = 1e-5


def operands(K, N, dtype, seed=0, gated=False):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(1, K, generator=gen).to(dtype)
    delta = torch.randn(1, K, generator=gen).to(dtype)
    norm_weight = (1 + 0.1 * torch.randn(K, generator=gen)).to(dtype)
    weight = (0.05 * torch.randn(2 * N if gated else N, K, generator=gen)).to(dtype)
    return x, delta, norm_weight, weight


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("gated", [False, True], ids=["plain", "gated"])
@pytest.mark.parametrize("with_delta", [True, False], ids=["add", "first_layer"])
def test_the_reference_is_the_unfused_kernels(dtype, gated, with_delta):
    x, delta, norm_weight, weight = operands(96, 40, dtype, gated=gated)
    delta = delta if with_delta else None
    y, h = add_norm_matmul_reference(x, delta, norm_weight, EPS, weight, gated)
    if with_delta:
        h_unfused, normed = add_rms_norm(x, delta, norm_weight, EPS)
    else:
        h_unfused, normed = x, rms_norm(x, norm_weight, EPS)
    y_unfused = F.linear(normed, weight)
    y_unfused = silu_and_mul(y_unfused) if gated else y_unfused
    assert torch.equal(h, h_unfused)
    assert torch.equal(y, y_unfused)


@pytest.fixture
def interpreter(monkeypatch):
    """Triton's interpreter runs the kernel on CPU tensors (set before the kernel is first launched)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    yield


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(
    "K, N, gated, config",
    [
        (96, 40, False, {"BLOCK_N": 16, "BLOCK_K": 32}),  # K and N not multiples of the blocks
        (96, 40, True, {"BLOCK_N": 16, "BLOCK_K": 32}),
        (63, 7, True, {"BLOCK_N": 4, "BLOCK_K": 64}),  # one K block, odd sizes
        (256, 33, False, {"BLOCK_N": 8, "BLOCK_K": 128}),
    ],
    ids=["96x40", "96x40-gated", "63x7-gated", "256x33"],
)
@pytest.mark.parametrize("with_delta", [True, False], ids=["add", "first_layer"])
def test_the_kernel_matches_the_reference(interpreter, dtype, K, N, gated, config, with_delta):
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.fail("the interpreter is not on")
    x, delta, norm_weight, weight = operands(K, N, dtype, seed=K + N, gated=gated)
    delta = delta if with_delta else None
    y_ref, h_ref = add_norm_matmul_reference(x, delta, norm_weight, EPS, weight, gated)
    y, h = add_norm_matmul(x, delta, norm_weight, EPS, weight, gated, config=config)
    assert y.shape == y_ref.shape == (1, N) and y.dtype == dtype
    if dtype == torch.float32:
        assert torch.equal(h, h_ref)  # x + delta rounds once, as the residual stream does
    else:  # NOTE: the interpreter truncates a float32 -> bfloat16 cast (the GPU rounds to nearest): one ulp
        torch.testing.assert_close(h, h_ref, rtol=2**-7, atol=0)
    tol = 1e-5 if dtype == torch.float32 else 2e-2  # the sum's order differs from F.linear's
    torch.testing.assert_close(y.float(), y_ref.float(), rtol=tol, atol=tol)


def test_bad_shapes_are_clear_errors():
    x, delta, norm_weight, weight = operands(64, 8, torch.float32)
    with pytest.raises(ValueError, match="one row"):
        add_norm_matmul(x.expand(2, 64), None, norm_weight, EPS, weight)
    with pytest.raises(ValueError, match="shapes do not fit"):
        add_norm_matmul(x, delta, norm_weight, EPS, weight[:, :32])
    with pytest.raises(ValueError, match="shapes do not fit"):
        add_norm_matmul(x, delta, norm_weight, EPS, weight[:7], gated=True)


def test_a_batch_1_engine_with_the_fused_layers_gives_the_unfused_tokens(tmp_path, interpreter, monkeypatch):
    """The engine's one-row steps through `add_norm_matmul` (the interpreter here; CUDA turns it on at start-up):
    the same greedy tokens as the unfused layers, and only one-row steps take it."""
    import minipic_lite.models.llama as llama
    from minipic_lite import LLM, SamplingParams
    from minipic_lite.models.fused_one_row import enable_fused_one_row
    from tests.conftest import save_tiny_llama

    save_tiny_llama(tmp_path)
    prompt, params = [[5, 9, 14, 3, 22, 40, 7]], SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    llm = LLM(str(tmp_path), device="cpu", dtype="float32", max_model_len=64)
    try:
        expected = llm.generate(prompt, params, use_tqdm=False)[0].token_ids
        rows, real = [], llama.add_norm_matmul
        monkeypatch.setattr(llama, "add_norm_matmul", lambda x, *a, **k: rows.append(x.shape[0]) or real(x, *a, **k))
        model = llm.engine.runner.model
        shapes = enable_fused_one_row(model)
        assert all(layer.fused_one_row for layer in model.layers)
        got = llm.generate(prompt, params, use_tqdm=False)[0].token_ids
    finally:
        llm.close()
    assert got == expected
    # the prompt's step is not one row; each of the 5 decode steps takes 2 calls a layer
    assert rows == [1] * (5 * 2 * len(model.layers))
    cfg = model.cfg
    qkv_rows = (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
    assert shapes == [(qkv_rows, cfg.hidden_size, False), (cfg.intermediate_size, cfg.hidden_size, True)]


def test_the_switch_turns_it_off(monkeypatch, tmp_path):
    from minipic_lite import LLM
    from minipic_lite.models.fused_one_row import enable_fused_one_row
    from tests.conftest import save_tiny_llama

    monkeypatch.setenv("MINIPIC_FUSED_ONE_ROW", "0")
    llm = LLM(str(save_tiny_llama(tmp_path)), device="cpu", dtype="float32", max_model_len=64)
    try:
        assert enable_fused_one_row(llm.engine.runner.model) == []
        assert not any(layer.fused_one_row for layer in llm.engine.runner.model.layers)
    finally:
        llm.close()
