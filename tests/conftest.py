"""Shared fixtures: the real SmolLM2 weights (fp32, CPU) in our engine and in transformers (the oracle)."""

import os

# NOTE: before anything imports triton: the op's kernel runs on the CPU through Triton's interpreter.
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402


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


def max_abs_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Max absolute error, printed with the relative error so a failure says how far off it is."""
    diff = (actual.double() - expected.double()).abs().max().item()
    rel = diff / max(expected.double().abs().max().item(), 1e-30)
    print(f"max abs err {diff:.3e}, rel {rel:.3e}")
    return diff
