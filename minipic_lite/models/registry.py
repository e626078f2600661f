"""Model families by Hugging Face `model_type`: a new family is one file in models/ plus one line here."""

from __future__ import annotations

from minipic_lite.models.llama import LlamaForCausalLM
from minipic_lite.models.qwen3_5 import Qwen3_5ForCausalLM

MODEL_REGISTRY: dict[str, type] = {
    "llama": LlamaForCausalLM,
    "mistral": LlamaForCausalLM,
    "qwen2": LlamaForCausalLM,
    "qwen3": LlamaForCausalLM,
    "qwen3_5": Qwen3_5ForCausalLM,  # the released layout: the text part of its nested config
    "qwen3_5_text": Qwen3_5ForCausalLM,
}


def model_class(architecture: str) -> type:
    if architecture not in MODEL_REGISTRY:
        known = ", ".join(sorted(MODEL_REGISTRY))
        raise ValueError(f"unsupported model_type {architecture!r}: this engine runs {known}")
    return MODEL_REGISTRY[architecture]
