"""Edges of the Qwen3.5 hybrid's host-side code (models/qwen3_5.py) that test_hybrid_model leaves open, on a tiny
random hybrid that transformers saves: a forward with no state slots (the warm-up that sizes a CUDA cache) runs on
zero states, and dummy weights start every linear layer's dt_bias at 1, as transformers initializes it."""

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
