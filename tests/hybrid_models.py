"""Tiny random Qwen3.5 hybrids that transformers builds and saves: the oracle of the hybrid tests."""

from __future__ import annotations

import json

import torch

# 3 linear-attention layers : 1 full-attention layer, GQA in both kinds, partial rotary (head_dim 32 × 0.25 = 8)
TINY_HYBRID = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=32, linear_conv_kernel_dim=4,
                   linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
                   linear_num_value_heads=4, max_position_embeddings=512, tie_word_embeddings=False,
                   initializer_range=0.08)  # fmt: skip


def make_hybrid(path, seed: int = 0, decays: tuple[float, float] | None = (0.01, 1.0), **overrides):
    """Save a random `Qwen3_5ForCausalLM` (model_type qwen3_5_text) to `path`; returns the transformers model.

    Norm weights are drawn around their identity, so that a norm applied the wrong way shows in the logits. The
    recurrent layers' decays are drawn small (`decays`: over [0.01, 1]), so that their state lasts: over 64 random
    tokens the longest-lived head keeps a median 0.86 of its state a token (0.96 at most). None keeps transformers'
    own draw, over [0.01, 16]: there 0.41 (0.65 at most), and a prefill that applied each state update twice still
    gave transformers' tokens.
    """
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    torch.manual_seed(seed)
    hf = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**{**TINY_HYBRID, **overrides})).eval()
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if name.endswith("linear_attn.norm.weight"):
                param.normal_(1.0, 0.1)  # gated norm: scales by weight
            elif name.endswith("norm.weight"):
                param.normal_(0.0, 0.1)  # Qwen3.5's other norms scale by (1 + weight)
            elif name.endswith("A_log") and decays is not None:  # decays A over `decays`: transformers' over [0.01, 16]
                param.copy_(torch.empty_like(param).uniform_(*decays).log())
    hf.save_pretrained(path)
    return hf


def make_hybrid_with_tokenizer(path, tokenizer_dir, seed: int = 0):
    """A tiny random hybrid that speaks `tokenizer_dir`'s vocabulary (SmolLM2's: its span markers too) and has a
    4k context: a model the web app can serve (`python -m ui --model path`). Its answers are noise."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    hf = make_hybrid(path, seed, vocab_size=len(tokenizer), max_position_embeddings=4096)
    tokenizer.save_pretrained(path)
    return hf


def to_released_layout(src, dst) -> None:
    """Rewrite a saved hybrid as the released checkpoints lay it out: model_type `qwen3_5` with the text part in
    `text_config`, weights under `model.language_model.`, plus vision and MTP tensors the engine must skip."""
    from safetensors.torch import load_file, save_file

    dst.mkdir(parents=True, exist_ok=True)
    text = json.loads((src / "config.json").read_text())
    config = {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"], "text_config": text,
              "vision_config": {"depth": 1}, "tie_word_embeddings": False}  # fmt: skip
    (dst / "config.json").write_text(json.dumps(config))
    weights = load_file(src / "model.safetensors")
    renamed = {(k if k.startswith("lm_head") else k.replace("model.", "model.language_model.", 1)): v
               for k, v in weights.items()}  # fmt: skip
    renamed["model.visual.patch_embed.proj.weight"] = torch.zeros(4, 3)
    renamed["mtp.fc.weight"] = torch.zeros(4, 4)
    save_file(renamed, dst / "model.safetensors", metadata={"format": "pt"})


if __name__ == "__main__":  # `python -m tests.hybrid_models DIR`: a tiny hybrid for the web app, in DIR
    import sys

    from minipic_lite.models.loader import resolve_model_dir

    make_hybrid_with_tokenizer(sys.argv[1], resolve_model_dir(None))
    print(f"saved a tiny random Qwen3.5 hybrid with SmolLM2's tokenizer in {sys.argv[1]}")
