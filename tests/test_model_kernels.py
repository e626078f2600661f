"""The model's fused pieces: torch.compile'd versions equal the eager ones (the GPU path uses them)."""

import math
import re

import pytest
import torch

from minipic_lite.models.llama import (
    Kernels,
    add_rms_norm,
    compile_kernel,
    eager_add_rms_norm,
    eager_rms_norm,
    rms_norm,
    silu_and_mul,
)
from ops import apply_rope, rope_cos_sin
from ops.rope import RotationTables, rotate_with_rows


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
        torch.testing.assert_close(compile_kernel(apply_rope)(q, pos, cos_sin), apply_rope(q, pos, cos_sin))
        for rotate_keys in (False, True):  # position-free, vanilla
            k, v = torch.randn(num_tokens, 1, 32), torch.randn(num_tokens, 1, 32)
            slots = torch.randperm(40)[:num_tokens]
            caches = [torch.zeros(2, 40, 1, 32) for _ in range(2)]
            args = (q, k, v, pos, cos_sin, slots)
            got = compiled.rope_and_write_kv(*args, caches[0], rotate_keys)
            torch.testing.assert_close(got, eager.rope_and_write_kv(*args, caches[1], rotate_keys))
            assert torch.equal(caches[0], caches[1]) and caches[0].abs().sum() > 0


def test_rope_and_write_kv_rotates_the_queries_and_writes_keys_as_the_mode_says():
    q, k, v = torch.randn(3, 4, 16), torch.randn(3, 2, 16), torch.randn(3, 2, 16)
    pos, slots, cos_sin = torch.tensor([5, 0, 9]), torch.tensor([7, 2, 4]), rope_cos_sin(32, 16)
    for rotate_keys in (False, True):
        cache = torch.zeros(2, 8, 2, 16)
        q_rot = Kernels().rope_and_write_kv(q, k, v, pos, cos_sin, slots, cache, rotate_keys)
        torch.testing.assert_close(q_rot, apply_rope(q, pos, cos_sin))
        torch.testing.assert_close(cache[0, slots], apply_rope(k, pos, cos_sin) if rotate_keys else k)
        torch.testing.assert_close(cache[1, slots], v)
        assert cache[:, [0, 1, 3, 5, 6]].abs().sum() == 0


def test_add_rms_norm_is_the_residual_add_then_norm():
    x, delta, w = torch.randn(5, 16), torch.randn(5, 16), torch.randn(16)
    summed, normed = add_rms_norm(x, delta, w, 1e-6)
    torch.testing.assert_close(summed, x + delta)
    expected = w * (summed / summed.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt())
    torch.testing.assert_close(normed, expected)
    gate, up = torch.randn(4, 8), torch.randn(4, 8)
    torch.testing.assert_close(silu_and_mul(torch.cat([gate, up], -1)), gate * torch.sigmoid(gate) * up)


def test_the_norms_of_per_head_rows_take_each_heads_own_statistics():
    """qk-norm (Qwen3) normalizes q and k as [T, H, D]: each head's D values by their own mean square, in the form
    Inductor compiles (CUDA) and the eager one (CPU)."""
    torch.manual_seed(0)
    x, w = torch.randn(5, 3, 16) * torch.tensor([1.0, 4.0, 0.25])[:, None], torch.randn(16)
    expected = w * (x / x.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt())
    torch.testing.assert_close(rms_norm(x, w, 1e-6), expected)
    torch.testing.assert_close(eager_rms_norm(x, w, 1e-6), expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_the_eager_norm_gives_the_explicit_forms_bits(dtype):
    """The CPU runs `eager_rms_norm` (one F.rms_norm call); transformers and Inductor the explicit form."""
    torch.manual_seed(0)
    for width in (64, 576, 2048):  # SmolLM2's head and hidden sizes, and a wider one
        x, delta, w = (
            (torch.randn(33, width) * 4).to(dtype),
            torch.randn(33, width).to(dtype),
            torch.randn(width).to(dtype),
        )
        summed, normed = eager_add_rms_norm(x, delta, w, 1e-5)
        assert torch.equal(summed, x + delta) and torch.equal(normed, rms_norm(x + delta, w, 1e-5))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("head_dim,rotary_dim", [(64, 64), (128, 64), (64, 16)], ids=["full", "half", "quarter"])
def test_rotation_tables_give_rotate_with_rows_bits(dtype, head_dim, rotary_dim):
    """The decode mirror rotates with tables built once a step; `rotate_with_rows` is the reference."""
    torch.manual_seed(0)
    cos_sin, positions = rope_cos_sin(4096, rotary_dim), torch.tensor([0, 1, 17, 4095, 600])
    x = (torch.randn(5, 3, head_dim) * 8).to(dtype)
    rotated = RotationTables.build(cos_sin[positions], head_dim).rotate(x)
    assert rotated.dtype == torch.float32
    assert torch.equal(rotated, rotate_with_rows(x.float(), cos_sin[positions]))
    assert torch.equal(rotated.to(dtype), apply_rope(x, positions, cos_sin))


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_write_kv_puts_each_key_and_value_in_its_slot_of_one_layer_only(compiled):
    """A step's keys and values (views of the qkv projection's output, as the Llama layer passes them) go into the
    layer's K and V caches at slot_mapping; other slots and other layers stay as they were. Compiled (as on CUDA),
    the caches are written in place (no buffer the size of a layer's cache in the generated code), and the next
    layer's row views run the same compiled graph."""
    import torch._dynamo.utils
    from torch._inductor.utils import run_and_get_code

    from minipic_lite.models.llama import write_kv

    torch.manual_seed(0)
    layers, blocks, B, kvh, d, T = 3, 5, 4, 2, 8, 6
    kv_cache = torch.randn(2, layers, blocks, B, kvh, d)
    before = kv_cache.clone()
    qkv = torch.randn(T, 16 + 2 * kvh * d)
    k, v = qkv[:, 16:].view(T, 2, kvh, d).unbind(1)  # (T, KVH, D) each: strided views
    slots = torch.tensor([19, 0, 7, 8, 13, 2])  # block * B + offset, in any order

    def rows(layer):  # the layer's K and V caches as the row view the model passes
        return (kv_cache[:, layer].flatten(1, 2),)

    written_layers = (1, 2) if compiled else (1,)
    if compiled:
        torch._dynamo.reset()
        fn, graphs = compile_kernel(write_kv), torch._dynamo.utils.counters["stats"]
        num_graphs = graphs["unique_graphs"]
        code = "".join(run_and_get_code(fn, k, v, slots, *rows(1))[1])
        assert "index" in code, "no generated code was read"
        shapes = [eval(shape) for shape in re.findall(r"\bbuf\d+ = empty_strided\w*\((\([^)]*\))", code)]
        assert all(math.prod(shape) < blocks * B * kvh * d for shape in shapes), (
            f"the compiled write copies a cache instead of writing it: buffers {shapes}"
        )
        fn(k, v, slots, *rows(2))
        assert graphs["unique_graphs"] == num_graphs + 1, "the second layer's views compiled a graph of their own"
    else:
        write_kv(k, v, slots, *rows(1))
    untouched = torch.ones(blocks * B, dtype=torch.bool)
    untouched[slots] = False
    for layer in range(layers):
        written, was = kv_cache[:, layer].reshape(2, -1, kvh, d), before[:, layer].reshape(2, -1, kvh, d)
        if layer in written_layers:
            assert torch.equal(written[0, slots], k) and torch.equal(written[1, slots], v)
            assert torch.equal(written[:, untouched], was[:, untouched])
        else:
            assert torch.equal(written, was)


@pytest.mark.parametrize("position_free", [True, False])
def test_the_runner_warms_up_the_attention_variants_of_its_own_model(tmp_path, monkeypatch, position_free):
    """The engine's start-up call (CUDA only; called here directly on a CPU runner, the kernels in the interpreter):
    the model's heads, dtype and cos/sin table as its forward passes them, tables as wide as max_model_len, and its
    first layer's K and V to read (so that the variants compile with serving's offsets' width)."""
    import json

    import ops.triton_kernel as tk
    from minipic_lite import LLM

    config = {"model_type": "llama", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 96,
              "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
              "max_position_embeddings": 200}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    llm = LLM(str(tmp_path), device="cpu", load_format="dummy", max_model_len=200, max_num_batched_tokens=64,
              position_free=position_free)  # fmt: skip
    calls, real = [], tk.warm_up
    monkeypatch.setattr(tk, "warm_up", lambda *args, **kw: calls.append((args, kw)) or real(*args, **kw))
    runner = llm.engine.runner
    try:
        runner._warm_up_attention()
    finally:
        llm.close()
    (((num_heads, num_kv_heads, head_dim, block_size, dtype, cos_sin, device, max_tokens, max_context), kw),) = calls
    k_cache, v_cache = kw["caches"]
    assert (
        k_cache.data_ptr() == runner.kv_cache[0, 0].data_ptr()
        and v_cache.data_ptr() == runner.kv_cache[1, 0].data_ptr()
    )
    assert k_cache.shape == v_cache.shape == runner.kv_cache.shape[2:]
    assert (num_heads, num_kv_heads, head_dim, block_size, dtype) == (4, 2, 16, 16, torch.float32)
    assert cos_sin is (runner.model.cos_sin if position_free else None)
    assert (device, max_tokens, max_context) == (torch.device("cpu"), 64, 208)  # 200 keys in 13 blocks of 16


@pytest.mark.parametrize("mode", ["auto", "all"])
def test_compiled_kernels_keep_the_model_sizes_constant(mode, monkeypatch):
    """Compiled, a kernel's token count becomes symbolic once it changes, and the model's own sizes (here the
    hidden size 64) stay constants, so Inductor reduces and loads them as fixed sizes (on the H200: the engine's
    prefill 1.12x -> 1.24x transformers at 4 x 2048, bench/results/prefill24-*). MINIPIC_COMPILE_DYNAMIC=all makes
    every size symbolic from the first call, as before."""
    from minipic_lite.models.llama import compile_kernel, rms_norm

    graphs = []

    def recording_backend(gm, example_inputs):
        values = [n.meta["example_value"] for n in gm.graph.nodes if n.op == "placeholder"]
        # NOTE: symbolic sizes are graph inputs too, and with every size symbolic so is eps (a 0-d tensor)
        graphs.append([tuple(v.shape) for v in values if isinstance(v, torch.Tensor) and v.dim() > 0])
        return gm.forward

    if mode == "all":
        monkeypatch.setenv("MINIPIC_COMPILE_DYNAMIC", "all")
    torch._dynamo.reset()
    fn = compile_kernel(rms_norm, backend=recording_backend)
    weight = torch.randn(64)
    for num_tokens in (3, 7, 33):
        assert fn(torch.randn(num_tokens, 64), weight, 1e-5).shape == (num_tokens, 64)
    torch._dynamo.reset()
    is_symbolic = [[[isinstance(size, torch.SymInt) for size in shape] for shape in graph] for graph in graphs]
    if mode == "auto":  # exact shapes first, then one recompile with the token count symbolic
        assert is_symbolic == [[[False, False], [False]], [[True, False], [False]]]
    else:
        assert is_symbolic == [[[True, True], [True]]]
