"""Edges of the Llama family's code (models/llama.py) that the engine tests leave open, on a tiny random Llama built
on the meta device (no engine): compile_kernel raises Dynamo's recompile limit, keeps a caller's Inductor options
beside PDL's (and PDL out unless requested) and compiles one graph, compile=True takes compiled kernels, the attention
scale is transformers', dummy weights are seeded, drawn around 0 with every norm at 1, and load_weights refuses a
folder without safetensors, skips tensors the model has no place for and names at most five missing weights."""

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch._inductor import config as inductor_config

from minipic_lite.config import ModelConfig
from minipic_lite.models import llama
from tests.conftest import save_tiny_llama


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("tiny_llama_edges"))


def empty_model(model_dir, compile=False):  # noqa: A002
    with torch.device("meta"):
        model = llama.LlamaForCausalLM(ModelConfig.from_dir(model_dir), True, compile)
    return model.to_empty(device="cpu")


@pytest.mark.skipif(not hasattr(inductor_config.triton, "enable_pdl"), reason="this torch's Inductor has no PDL")
def test_compile_kernel_raises_the_recompile_limit_and_keeps_the_callers_options_beside_pdl(monkeypatch):
    calls = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: calls.append(kw) or fn)
    monkeypatch.setattr(llama, "pdl_requested", lambda: True)
    # NOTE: Dynamo's own patch, not monkeypatch: monkeypatch's undo deleted the option (every later compile failed)
    with torch._dynamo.config.patch(recompile_limit=8):
        llama.compile_kernel(llama.rms_norm, options={"combo_kernels": True})
        assert torch._dynamo.config.recompile_limit == llama.RECOMPILE_LIMIT
    assert calls[-1]["options"] == {"triton.enable_pdl": True, "combo_kernels": True}
    with torch._dynamo.config.patch(recompile_limit=100):
        llama.compile_kernel(llama.rms_norm)
        assert torch._dynamo.config.recompile_limit == 100  # raised, never lowered


def test_compile_kernel_compiles_one_graph_and_leaves_pdl_out_unless_requested(monkeypatch):
    """Its docstring's "as one graph" (fullgraph) with its signature's defaults, and a caller's options as they are
    when PDL is not requested (no `triton.enable_pdl` added)."""
    calls = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: calls.append(kw) or fn)
    monkeypatch.setattr(llama, "pdl_requested", lambda: False)
    monkeypatch.delenv("MINIPIC_COMPILE_DYNAMIC", raising=False)
    with torch._dynamo.config.patch(recompile_limit=8):
        llama.compile_kernel(llama.rms_norm, options={"combo_kernels": True})
    assert calls == [{"dynamic": None, "fullgraph": True, "backend": "inductor", "options": {"combo_kernels": True}}]


def test_compile_takes_the_compiled_kernels(tiny_dir, monkeypatch):
    compiled = []
    monkeypatch.setattr(llama, "compile_kernel", lambda fn, **kw: compiled.append(fn) or (lambda *a: fn(*a)))
    model = empty_model(tiny_dir, compile=True)
    assert compiled == [llama.rms_norm, llama.add_rms_norm, llama.silu_and_mul, llama.rope_and_write_kv]
    assert model.kernels.rms_norm is not llama.eager_rms_norm


def test_the_attention_scale_is_transformers(tiny_dir):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaAttention

    expected = LlamaAttention(LlamaConfig.from_pretrained(tiny_dir), layer_idx=0).scaling
    assert empty_model(tiny_dir).layers[0].self_attn.scale == expected == 8**-0.5


def test_dummy_weights_are_seeded_and_every_norm_is_one(tiny_dir):
    a, b = empty_model(tiny_dir), empty_model(tiny_dir)
    a.init_dummy_weights()
    torch.manual_seed(123)  # the global generator is not the one drawn from
    b.init_dummy_weights()
    for (name, x), y in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(x, y), name
        if name.endswith("norm.weight"):
            assert torch.equal(x, torch.ones_like(x)), name
    assert a.norm.weight.tolist() == [1.0] * 32
    embed = a.embed_tokens.weight
    assert abs(embed.mean().item()) < 0.002 and 0.015 < embed.std().item() < 0.025  # drawn around 0 with std 0.02


def test_load_weights_refuses_a_folder_without_safetensors(tiny_dir, tmp_path):
    with pytest.raises(ValueError, match=r"no \*.safetensors weights in .* \(pickle checkpoints are not loaded\)"):
        empty_model(tiny_dir).load_weights(tmp_path)


def test_load_weights_skips_tensors_it_has_no_place_for(tiny_dir, tmp_path):
    tensors = load_file(tiny_dir / "model.safetensors")
    save_file(tensors, tmp_path / "model.safetensors")
    save_file({"model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(4)}, tmp_path / "extra.safetensors")
    model = empty_model(tiny_dir)
    model.load_weights(tmp_path)
    assert torch.equal(model.norm.weight, tensors["model.norm.weight"])


@pytest.mark.parametrize("num_missing", [5, 6])
def test_load_weights_names_at_most_five_missing_weights(tiny_dir, tmp_path, num_missing):
    """Layer 1's six weights (q, k, v fused into one; gate and up into one) left out, or five of them."""
    tensors = load_file(tiny_dir / "model.safetensors")
    kept = "model.layers.1.post_attention_layernorm.weight" if num_missing == 5 else None
    save_file({k: v for k, v in tensors.items() if not k.startswith("model.layers.1.") or k == kept},
              tmp_path / "model.safetensors")  # fmt: skip
    names = ["input_layernorm.weight", "mlp.down_proj.weight", "mlp.gate_up_proj.weight",
             "post_attention_layernorm.weight", "self_attn.o_proj.weight", "self_attn.qkv_proj.weight"]  # fmt: skip
    missing = [f"layers.1.{n}" for n in names if f"model.layers.1.{n}" != kept]
    listed = ", ".join(missing[:5]) + (" ..." if num_missing == 6 else "")
    with pytest.raises(ValueError) as info:
        empty_model(tiny_dir).load_weights(tmp_path)
    assert str(info.value) == f"{tmp_path} lacks weights for: {listed}"


def test_a_cpu_decode_step_attends_over_the_decode_mirror(tiny_dir, monkeypatch):
    """The mirror gives the op's results, so the outputs alone cannot tell that it serves the decode steps."""
    import minipic_lite as mp
    from minipic_lite.decode_mirror import MirrorStep

    layers, attend = [], MirrorStep.attend
    monkeypatch.setattr(MirrorStep, "attend", lambda self, layer, *a: layers.append(layer) or attend(self, layer, *a))
    llm = mp.LLM(str(tiny_dir), device="cpu", max_model_len=64, num_blocks=8)
    params = mp.SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True, detokenize=False)
    llm.generate([[5, 6, 7]], params, use_tqdm=False)
    llm.close()
    assert layers == [0, 1, 0, 1]  # two decode steps (the prefill samples the first token) over 2 layers
