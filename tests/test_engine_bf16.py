"""The engine in bfloat16 on the CPU, on the real SmolLM2 weights: transformers in float64 is the truth, and
transformers' own bfloat16 run is the measure of how far bf16's rounding alone moves logits and greedy choices.

In bf16 two correct engines part at near ties (on these prompts ours and transformers' greedy tokens matched on 5
of 11), so these tests bound the error instead of asking for equal tokens; a wrong position, mask or cached block
moves logits by whole units, past either bound."""

import pytest
import torch

import minipic_lite as mp
from tests.test_engine_hf import PROMPTS, prefill_logits

BF16_PROMPTS = PROMPTS[:6]
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def llm_bf16(model_dir):
    llm = mp.LLM(str(model_dir), device="cpu", dtype="bfloat16", max_model_len=2048)
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def hf_bf16(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()


def test_bf16_prefill_logits_stay_within_bf16_rounding_of_the_float64_truth(llm_bf16, hf_bf16, hf_model64):
    ours_err = hf_err = 0.0
    for prompt in BF16_PROMPTS:
        ids = llm_bf16.encode(prompt)[0]
        positions, logits = prefill_logits(llm_bf16, ids)  # computed in bf16, returned as float32
        assert llm_bf16.engine.runner.model.lm_head.weight.dtype == torch.bfloat16
        with torch.no_grad():
            truth = hf_model64(torch.tensor([ids])).logits[0, positions]
            theirs = hf_bf16(torch.tensor([ids])).logits[0, positions]
        ours_err += (logits.double() - truth).abs().mean().item()
        hf_err += (theirs.double() - truth).abs().mean().item()
    print(f"mean abs error against float64: ours {ours_err:.3f}, transformers bf16 {hf_err:.3f} (summed)")
    assert ours_err <= 1.5 * hf_err  # measured: 0.55 against 0.56 over the first four prompts


def greedy_regret(hf_model64, prompt_ids: list[int], generated: list[int]) -> float:
    """The worst gap, over the generated tokens, between float64's best logit and its logit of the chosen token."""
    with torch.no_grad():
        logits = hf_model64(torch.tensor([prompt_ids + generated])).logits[0, len(prompt_ids) - 1 : -1]
    chosen = logits.gather(1, torch.tensor(generated)[:, None])[:, 0]
    return (logits.max(dim=-1).values - chosen).max().item()


def test_bf16_greedy_decode_picks_tokens_float64_rates_as_near_best(llm_bf16, hf_bf16, hf_model64):
    """Decode steps (the packed bf16 weights where the CPU has bf16 kernels) over a batch of six: each chosen token
    sits within bf16's rounding of float64's best, as close as transformers' own bf16 greedy run sits."""
    params = mp.SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    outs = llm_bf16.generate(BF16_PROMPTS, params, use_tqdm=False)
    eos, hf_bf16.generation_config.eos_token_id = hf_bf16.generation_config.eos_token_id, None
    ours_worst = hf_worst = 0.0
    try:
        for prompt, out in zip(BF16_PROMPTS, outs, strict=True):
            ids = llm_bf16.encode(prompt)[0]
            assert len(out.token_ids) == NEW_TOKENS
            with torch.no_grad():
                t = torch.tensor([ids])
                theirs = hf_bf16.generate(
                    t, attention_mask=torch.ones_like(t), max_new_tokens=NEW_TOKENS, do_sample=False
                )
            ours_worst = max(ours_worst, greedy_regret(hf_model64, ids, out.token_ids))
            hf_worst = max(hf_worst, greedy_regret(hf_model64, ids, theirs[0, len(ids) :].tolist()))
    finally:
        hf_bf16.generation_config.eos_token_id = eos
    print(f"worst greedy regret under float64: ours {ours_worst:.3f}, transformers bf16 {hf_worst:.3f}")
    assert ours_worst <= max(2 * hf_worst, 0.5)  # measured over 11 prompts x 32 tokens: 0.231 against 0.226
