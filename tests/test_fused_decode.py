"""The engine with `MINIPIC_FUSED_WRITE=1` (a decode step's RoPE, K/V write and attention in one launch,
`ops.triton_kernel.rope_write_attend`) against transformers' greedy tokens: a tiny random Llama on the CPU, the
fused path let through to the Triton kernel under the interpreter (on CUDA it is the engine's own condition)."""

from __future__ import annotations

import pytest
import torch

import minipic_lite as mp
from minipic_lite.models import llama
from ops import triton_kernel
from tests.conftest import save_tiny_llama


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import LlamaForCausalLM

    path = save_tiny_llama(tmp_path_factory.mktemp("tiny_fused"), hidden_size=64, intermediate_size=128,
                           vocab_size=300, max_position_embeddings=256)  # fmt: skip
    return path, LlamaForCausalLM.from_pretrained(path).eval()


def test_fused_decode_steps_give_transformers_greedy_tokens(tiny, monkeypatch):
    path, hf = tiny
    monkeypatch.setenv("MINIPIC_FUSED_WRITE", "1")
    # NOTE: the engine's condition without its CUDA check: the kernel runs on CPU tensors under the interpreter
    monkeypatch.setattr(
        llama,
        "fused_decode_applies",
        lambda q, meta: meta.decode_mirror is None and q.shape[0] == meta.block_tables.shape[0],
    )
    calls, fused = [], triton_kernel.rope_write_attend
    monkeypatch.setattr(triton_kernel, "rope_write_attend", lambda *a, **k: calls.append(len(a[0])) or fused(*a, **k))
    llm = mp.LLM(str(path), device="cpu", dtype="float32", max_model_len=128, max_num_seqs=4, num_blocks=64,
                 block_size=4, cpu_decode_mirror=False)  # fmt: skip
    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(6, 300, (n,), generator=gen).tolist() for n in (3, 9, 14)]
    params = mp.SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    outs = llm.generate(prompts, params, use_tqdm=False)
    for prompt, out in zip(prompts, outs, strict=True):
        ids = torch.tensor([prompt])
        with torch.no_grad():
            want = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False,
                               eos_token_id=None)[0, len(prompt):].tolist()  # fmt: skip
        assert out.token_ids == want
    assert calls and max(calls) == 3  # decode steps of the three requests took the fused launch, a layer each
    llm.engine.pool.check_integrity()
