"""Shared fixtures: the real SmolLM2 weights (fp32, CPU) in our engine and in transformers (the oracle)."""

import os

# NOTE: before anything imports triton: the op's kernel runs on the CPU through Triton's interpreter.
os.environ.setdefault("TRITON_INTERPRET", "1")
# NOTE: engines keep the thread count they start with, whatever else loads the machine (cpu_threads.py): a test's
# tokens must not depend on what runs beside the suite. tests/test_cpu_threads.py turns it back on where it tests it.
os.environ.setdefault("MINIPIC_ADAPT_THREADS", "0")

import pytest  # noqa: E402
import torch  # noqa: E402

# fp32 logits of the engine against transformers in float64, the bound for every logits-vs-oracle check.
#
# Measured on SmolLM2 (prompts of up to ~300 tokens, |logits| up to 38.6; worst over the 8 recipe prompts of
# test_recipes_hf, which are the worst cases of the suite):
#
#     torch threads          1          2 (CI's cores)     4          16
#     engine fp32          1.26e-4     9.84e-5            1.09e-4    1.09e-4
#     transformers fp32    1.21e-4     1.21e-4            1.21e-4    1.21e-4
#
# The engine's rounding moves with the thread count because MKL's sgemm (F.linear, every prefill matmul)
# splits its inner sums by thread for some shapes: SmolLM2's down_proj (K = 1536) on a 144-row chunk differs
# by 3.8e-6 between one and two threads, and 30 layers carry that to the logits. transformers' own fp32 forward
# lands 1.21e-4 from float64 on the same prompts at every thread count, so the old 1e-4 bound (DESIGN §2) sat
# below the reference's own fp32 error. 2e-4 is ~5e-6 of the largest logit (about 50 float32 ulps there):
# rounding stays well under it on any thread count, while a wrong mask, position or cached block moves logits
# by 1e-2 or more (test_transformers_applies_the_explicit_4d_mask; a mirror that ignores a span moved them by 4.8).
FP32_LOGITS_ATOL = 2e-4


@pytest.fixture(scope="session")
def model_dir():
    from minipic_lite.models.loader import resolve_model_dir

    return resolve_model_dir(None)


@pytest.fixture(scope="session")
def llm(model_dir):
    import minipic_lite as mp

    return mp.LLM(str(model_dir), device="cpu", dtype="float32", max_model_len=2048)


@pytest.fixture(scope="session")
def hf_model(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def hf_model64(model_dir):
    """transformers in float64: the logits oracle. Two fp32 implementations each land ~5e-5 from it on
    SmolLM2, so fp32-vs-fp32 sits at the 1e-4 bound by rounding alone; fp32-vs-truth does not."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64).eval()


def write_gguf(path, architecture: str):
    """A minimal GGUF file of `architecture` (one tensor): enough for the loader to read and refuse it."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_tensor("x", np.ones(4, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


TINY_LLAMA = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, eos_token_id=2, tie_word_embeddings=False)  # fmt: skip


def save_tiny_llama(path, **overrides):
    """A tiny random Llama (TINY_LLAMA with `overrides`) saved to `path`, its lm_head drawn wide so that logits lie
    far apart and rounding between batch shapes never flips a greedy choice; returns `path`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**{**TINY_LLAMA, **overrides}))
    with torch.no_grad():
        model.lm_head.weight.normal_(0.0, 4.0)
    model.save_pretrained(path)
    return path


# A word per token; `<s>` (1) and `</s>` (2) as in Llama 2 (TINY_LLAMA's eos_token_id is 2).
BOS_VOCAB = ("[UNK]", "<s>", "</s>", "<ssep>", "<pdep>", "<pad>", "<|im_start|>", "<|im_end|>", "user", "assistant",
             "hello", "world", "foo", "bar")  # fmt: skip
# NOTE: begins with the BOS text, as Llama 3's does: encoding the rendered chat with special tokens adds a second BOS.
BOS_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m.role }} {{ m.content }}<|im_end|>{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant{% endif %}"
)


def bos_tokenizer():
    """A real Hugging Face tokenizer, built offline, that adds a BOS as Llama 2's does (SmolLM2's adds none):
    `encode("hello world")` is [<s>, hello, world]; words of BOS_VOCAB split at white space, the rest [UNK]."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(BOS_VOCAB)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="[UNK]",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"], chat_template=BOS_CHAT_TEMPLATE,
    )  # fmt: skip


def max_abs_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Max absolute error, printed with the relative error so a failure says how far off it is."""
    diff = (actual.double() - expected.double()).abs().max().item()
    rel = diff / max(expected.double().abs().max().item(), 1e-30)
    print(f"max abs err {diff:.3e}, rel {rel:.3e}")
    return diff


def pytest_collection_modifyitems(config, items):
    """`gpu` tests run where CUDA is; on a CPU-only machine (CI) they are skipped, saying why."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device: run `pytest -m gpu` on the GPU machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
