"""Llama-family variants are config, not code: tiny random models of each, saved by transformers as
safetensors, must give transformers' logits through our loader and engine (fp32, CPU)."""

import pytest
import torch

import minipic_lite as mp

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=256, max_position_embeddings=256, rms_norm_eps=1e-6)  # fmt: skip


def variants():
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        MistralConfig,
        MistralForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    return {
        "llama-tied": (LlamaForCausalLM, LlamaConfig(**TINY, tie_word_embeddings=True)),
        # three layers: a layer's output is normed by the next layer's input norm, and the last one's by the final norm
        "llama-3-layers": (LlamaForCausalLM, LlamaConfig(**TINY | dict(num_hidden_layers=3))),
        "mistral": (MistralForCausalLM, MistralConfig(**TINY, sliding_window=None)),
        "qwen2-qkv-bias": (Qwen2ForCausalLM, Qwen2Config(**TINY, tie_word_embeddings=False)),
        "qwen3-qk-norm": (Qwen3ForCausalLM, Qwen3Config(**TINY, head_dim=32, tie_word_embeddings=False)),
    }


@pytest.mark.parametrize("name", ["llama-tied", "llama-3-layers", "mistral", "qwen2-qkv-bias", "qwen3-qk-norm"])
def test_variant_matches_transformers(tmp_path, name):
    model_cls, config = variants()[name]
    torch.manual_seed(0)
    hf = model_cls(config).eval()
    with torch.no_grad():  # random biases and norm weights, so that a dropped one shows
        for param_name, param in hf.named_parameters():
            if param_name.endswith(("bias", "norm.weight")):
                param.normal_(0.0 if param_name.endswith("bias") else 1.0, 0.1)
    hf.save_pretrained(tmp_path)  # safetensors
    llm = mp.LLM(str(tmp_path), device="cpu", dtype="float32", num_blocks=32, max_model_len=256)
    token_ids = torch.randint(0, config.vocab_size, (45,), generator=torch.Generator().manual_seed(1)).tolist()
    out = llm.generate([token_ids], mp.SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True),
                       use_tqdm=False)[0]  # fmt: skip
    with torch.no_grad():
        expected = hf.generate(torch.tensor([token_ids]), attention_mask=torch.ones(1, 45, dtype=torch.long),
                               max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0)  # fmt: skip
    assert out.token_ids == expected[0, 45:].tolist()
    engine = llm.engine
    engine.pool.reset_prefix_cache()
    request_id = engine.add_request(token_ids, mp.SamplingParams(max_tokens=1))
    logits = engine.runner.prompt_logits(engine.scheduler.schedule())
    engine.abort(request_id)
    with torch.no_grad():
        ref = hf(torch.tensor([token_ids])).logits[0]
    assert (logits - ref).abs().max().item() <= 1e-4


def test_a_checkpoint_missing_a_weight_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    model_cls, config = variants()["llama-tied"]
    model_cls(config).save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    del weights["model.norm.weight"]
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match="lacks weights for: norm.weight"):
        mp.LLM(str(tmp_path), device="cpu", num_blocks=32, max_model_len=256)
