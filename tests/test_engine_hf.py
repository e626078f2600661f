"""The engine against Hugging Face transformers on the real SmolLM2 weights (fp32, CPU)."""

import pytest
import torch

import minipic_lite as mp
from tests.conftest import FP32_LOGITS_ATOL, max_abs_err

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a land far away, there lived a dragon who loved to read books about",
    "Translate to French: I would like a cup of coffee, please.",
    "List three prime numbers greater than 100:",
    "<|im_start|>user\nWhat is the boiling point of water at sea level?<|im_end|>\n<|im_start|>assistant\n",
    "import numpy as np\n\ndef softmax(x):\n    ",
    "The mitochondria is the powerhouse of the cell. " * 6 + "In summary,",
    "Q: If a train travels 60 miles in 1.5 hours, what is its average speed?\nA:",
    "Write a haiku about autumn leaves:\n",
    "1, 1, 2, 3, 5, 8, 13,",
]
GREEDY = mp.SamplingParams(max_tokens=32, temperature=0.0)


@pytest.fixture(scope="module")
def hf_greedy(llm, hf_model):
    """transformers' own greedy generate(), one prompt at a time, never stopping early (EOS disabled)."""
    outs, eos = [], hf_model.generation_config.eos_token_id
    hf_model.generation_config.eos_token_id = None
    try:
        for prompt in PROMPTS:
            ids = torch.tensor([llm.encode(prompt)[0]])
            with torch.no_grad():
                gen = hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=32, do_sample=False)
            outs.append(gen[0, ids.shape[1] :].tolist())
    finally:
        hf_model.generation_config.eos_token_id = eos
    return outs


def test_batched_greedy_equals_transformers_token_for_token(llm, hf_greedy):
    llm.engine.pool.reset_prefix_cache()
    outs = llm.generate(PROMPTS, mp.SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True), use_tqdm=False)
    for prompt, out, expected in zip(PROMPTS, outs, hf_greedy, strict=True):
        assert len(out.token_ids) == 32
        assert out.token_ids == expected, prompt


def prefill_logits(llm, token_ids):
    """Logits of every computed prompt position, through the engine's own scheduler and runner."""
    engine = llm.engine
    request_id = engine.add_request(token_ids, mp.SamplingParams(max_tokens=1))
    out = engine.scheduler.schedule()
    (scheduled,) = [s for s in out.scheduled if s.seq.request_id == request_id]
    assert scheduled.do_sample, "prompt longer than one step's budget"
    logits = engine.runner.prompt_logits(out)
    engine.abort(request_id)
    positions = [p for start, end in scheduled.query_ranges for p in range(start, end)]
    return positions, logits


@pytest.mark.parametrize("prompt_index", [2, 3, 7])
def test_prefill_logits_match_transformers(llm, hf_model64, prompt_index):
    llm.engine.pool.reset_prefix_cache()
    token_ids = llm.encode(PROMPTS[prompt_index])[0]
    positions, logits = prefill_logits(llm, token_ids)
    assert positions == list(range(len(token_ids)))
    with torch.no_grad():
        expected = hf_model64(torch.tensor([token_ids])).logits[0]
    assert max_abs_err(logits, expected) <= FP32_LOGITS_ATOL


def test_logits_after_a_prefix_cache_hit_match_transformers(llm, hf_model64):
    llm.engine.pool.reset_prefix_cache()
    token_ids = llm.encode(PROMPTS[7])[0]
    llm.generate([token_ids[:40]], mp.SamplingParams(max_tokens=1), use_tqdm=False)  # caches blocks 0, 1
    positions, logits = prefill_logits(llm, token_ids)
    assert positions[0] == 32
    with torch.no_grad():
        expected = hf_model64(torch.tensor([token_ids])).logits[0, positions]
    assert max_abs_err(logits, expected) <= FP32_LOGITS_ATOL


def test_one_at_a_time_equals_batched_and_second_run_hits_the_cache(llm):
    llm.engine.pool.reset_prefix_cache()
    prompts = PROMPTS[:6]
    single = [llm.generate([p], GREEDY, use_tqdm=False)[0] for p in prompts]
    llm.engine.pool.reset_prefix_cache()
    batched = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.token_ids for o in batched] == [o.token_ids for o in single]
    before = llm.stats()
    again = llm.generate(prompts, GREEDY, use_tqdm=False)
    after = llm.stats()
    assert [o.token_ids for o in again] == [o.token_ids for o in single]
    # every full prompt block but the one holding the last token is a hit; counted for this run alone
    num_hittable = [(len(o.prompt_token_ids) - 1) // 16 for o in again]
    num_blocks = [-(-len(o.prompt_token_ids) // 16) for o in again]
    assert [o.num_cached_tokens for o in again] == [16 * n for n in num_hittable] and sum(num_hittable) > 0
    assert after["num_hit_blocks"] - before["num_hit_blocks"] == sum(num_hittable)
    assert after["num_computed_blocks"] - before["num_computed_blocks"] == sum(num_blocks) - sum(num_hittable)


def test_preemption_under_a_tiny_cache_gives_identical_tokens(llm, model_dir):
    prompts = PROMPTS[:5]
    params = mp.SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    expected = [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    tiny = mp.LLM(str(model_dir), device="cpu", num_blocks=12, max_model_len=128)
    outs = tiny.generate(prompts, params, use_tqdm=False)
    assert tiny.stats()["num_preemptions"] > 0
    assert [o.token_ids for o in outs] == expected
    tiny.engine.pool.check_integrity()
    assert tiny.engine.pool.num_free_blocks == 12


def test_rotated_key_mode_gives_the_same_tokens(llm, model_dir):
    params = mp.SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    prompts = PROMPTS[6:]
    expected = [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    vanilla = mp.LLM(str(model_dir), device="cpu", position_free=False, max_model_len=512)
    assert [o.token_ids for o in vanilla.generate(prompts, params, use_tqdm=False)] == expected
