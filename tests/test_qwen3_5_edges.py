"""Edges of the Qwen3.5 hybrid's host-side code (models/qwen3_5.py) that test_hybrid_model leaves open, on a tiny
random hybrid that transformers saves: a forward with no state slots (the warm-up that sizes a CUDA cache) runs on
zero states, dummy weights draw as transformers initializes the model (dt_bias at 1, decays over [0.01, 16], the
rest from N(0, initializer_range)), the missing-weights error names up to five, fla is taken on CUDA only and only
where it imports, and each state slot holds one conv window and one recurrent state per linear layer."""

import pytest
import torch

import minipic_lite as mp
from minipic_lite.model_runner import allocate_kv_cache
from minipic_lite.models.step import StepMetadata
from tests.hybrid_models import make_hybrid


@pytest.fixture(scope="module")
def hybrid_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3_5_edges")
    make_hybrid(path)
    return path


def test_a_forward_with_no_state_slots_runs_on_zero_states(hybrid_dir):
    """The warm-up's one-sequence prefill gives the logits of the same prompt prefilled from a fresh slot."""
    llm = mp.LLM(str(hybrid_dir), device="cpu", dtype="float32", num_blocks=16, max_model_len=64,
                 enable_prefix_caching=False)  # fmt: skip
    engine, prompt = llm.engine, [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]
    request_id = engine.add_request(prompt, mp.SamplingParams(max_tokens=1))
    expected = engine.runner.prompt_logits(engine.scheduler.schedule())
    engine.abort(request_id)
    model, cfg = engine.runner.model, llm.config.model
    meta = StepMetadata.one_sequence(len(prompt), 16, torch.device("cpu"))
    cache = allocate_kv_cache(cfg, 1, 16, torch.float32, "cpu")
    with torch.inference_mode():
        logits = model.compute_logits(model(torch.tensor(prompt), meta, cache))
    llm.close()
    assert meta.recurrent is not None and torch.allclose(logits, expected, atol=1e-5)


def test_dummy_weights_start_dt_bias_at_one(hybrid_dir):
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    hf = Qwen3_5ForCausalLM(Qwen3_5TextConfig.from_pretrained(hybrid_dir))
    hf_dt = [p for n, p in hf.named_parameters() if n.endswith("dt_bias")]
    llm = mp.LLM(str(hybrid_dir), device="cpu", num_blocks=16, max_model_len=64, load_format="dummy")
    ours = [p for n, p in llm.engine.runner.model.named_parameters() if n.endswith("dt_bias")]
    llm.close()
    assert len(ours) == len(hf_dt) == 3
    assert all(torch.equal(p, q) and torch.equal(p, torch.ones_like(p)) for p, q in zip(ours, hf_dt, strict=True))


def test_six_missing_weights_are_named_five_and_more(hybrid_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    dropped = [f"model.layers.3.{n}.weight" for n in ("input_layernorm", "post_attention_layernorm",
               "self_attn.q_norm", "self_attn.k_norm", "self_attn.o_proj", "mlp.down_proj")]  # fmt: skip
    tensors = load_file(hybrid_dir / "model.safetensors")
    assert set(dropped) <= tensors.keys()
    save_file({k: v for k, v in tensors.items() if k not in dropped}, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text((hybrid_dir / "config.json").read_text())
    with pytest.raises(ValueError) as info:
        mp.LLM(str(tmp_path), device="cpu", num_blocks=16, max_model_len=64)
    listed = str(info.value).split("lacks weights for: ")[1]
    assert listed.endswith(" ...") and len(listed.removesuffix(" ...").split(", ")) == 5


def test_five_missing_weights_are_all_named_with_no_ellipsis(hybrid_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    dropped = [f"model.layers.3.{n}.weight" for n in ("input_layernorm", "post_attention_layernorm",
               "self_attn.q_norm", "self_attn.k_norm", "self_attn.o_proj")]  # fmt: skip
    tensors = load_file(hybrid_dir / "model.safetensors")
    save_file({k: v for k, v in tensors.items() if k not in dropped}, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text((hybrid_dir / "config.json").read_text())
    with pytest.raises(ValueError) as info:
        mp.LLM(str(tmp_path), device="cpu", num_blocks=16, max_model_len=64)
    listed = str(info.value).split("lacks weights for: ")[1]
    assert sorted(listed.split(", ")) == sorted(n.removeprefix("model.") for n in dropped)


def test_dummy_weights_draw_as_transformers_initializes_a_hybrid(hybrid_dir):
    """Decays A = exp(A_log) over all of transformers' range [0.01, 16] (16k value heads a layer, so that both ends
    show), and every other weight that is not a norm from N(0, initializer_range)."""
    from transformers import Qwen3_5TextConfig

    from minipic_lite.config import ModelConfig
    from minipic_lite.models.qwen3_5 import Qwen3_5ForCausalLM

    hf_config = Qwen3_5TextConfig.from_pretrained(hybrid_dir)
    wide = dict(linear_num_key_heads=1, linear_num_value_heads=16384, linear_key_head_dim=1, linear_value_head_dim=1)
    model = Qwen3_5ForCausalLM(ModelConfig._from_json({**hf_config.to_dict(), **wide}))
    model.init_dummy_weights()
    params = dict(model.named_parameters())
    decays = torch.cat([p.exp() for n, p in params.items() if n.endswith("A_log")])
    assert decays.numel() == 3 * 16384
    assert decays.min() >= 0.01 * (1 - 1e-5) and decays.max() <= 16 * (1 + 1e-5)
    assert decays.min() < 0.05 and decays.max() > 15.95
    drawn = torch.cat([p.flatten() for n, p in params.items()
                       if not n.endswith(("norm.weight", "norm_weight", "dt_bias", "A_log"))])  # fmt: skip
    std = Qwen3_5TextConfig().initializer_range
    assert abs(drawn.mean()) < 0.01 * std and abs(drawn.std() / std - 1) < 0.01


def test_fla_kernels_are_taken_on_cuda_only_and_only_where_fla_imports(monkeypatch):
    """CUDA without fla: None (the torch path); CUDA with fla: its two kernels; any other device: None, fla or not."""
    import sys
    import types

    from minipic_lite.models.qwen3_5 import _fla_kernels

    monkeypatch.setitem(sys.modules, "fla.ops.gated_delta_rule", None)  # an import of it fails
    assert _fla_kernels(torch.device("cuda")) is None
    fla = types.ModuleType("fla.ops.gated_delta_rule")
    fla.chunk_gated_delta_rule, fla.fused_recurrent_gated_delta_rule = object(), object()
    monkeypatch.setitem(sys.modules, "fla.ops.gated_delta_rule", fla)
    assert _fla_kernels(torch.device("cuda")) == (fla.chunk_gated_delta_rule, fla.fused_recurrent_gated_delta_rule)
    assert _fla_kernels(torch.device("cpu")) is None


def test_each_slot_holds_one_window_and_one_state_per_linear_layer(hybrid_dir):
    """state_shapes, held to transformers' layers: per linear-attention layer (3 of the 4), the conv window (conv1d's
    channels, its kernel − 1 last inputs) and the recurrent state [value heads, key dim, value dim]."""
    from transformers import Qwen3_5ForCausalLM

    from minipic_lite.config import ModelConfig
    from minipic_lite.models.qwen3_5 import Qwen3_5ForCausalLM as Ours

    linear = [layer.linear_attn for layer in Qwen3_5ForCausalLM.from_pretrained(hybrid_dir).model.layers
              if hasattr(layer, "linear_attn")]  # fmt: skip
    channels, _, kernel = linear[0].conv1d.weight.shape
    heads, k_dim, v_dim = linear[0].num_v_heads, linear[0].head_k_dim, linear[0].head_v_dim
    conv, ssm = Ours(ModelConfig.from_dir(hybrid_dir)).state_shapes()
    assert conv == (len(linear), channels, kernel - 1) and ssm == (len(linear), heads, k_dim, v_dim)
