"""Prompt logprobs (vLLM's `prompt_logprobs`): which hidden rows score which prompt tokens (pure), and the engine's
entries on SmolLM2 (fp32, CPU) against transformers' log-softmax at every prompt position, over several chunks,
with the prompt cached elsewhere, for n completions; the tiny hybrid against transformers too."""

import pytest
import torch

import minipic_lite as mp
from minipic_lite import prompt_logprobs
from minipic_lite.chunks import ScheduledSeq, SchedulerOutput
from minipic_lite.hashing import root_hash
from minipic_lite.prompt_logprobs import plan_scoring
from minipic_lite.request import Request

PROMPTS = [
    "The quick brown fox jumps over the lazy dog. " * 6,  # 61 tokens: two chunks of 32
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "Paris is the capital of",
]


def _request(request_id, num_prompt, prompt_logprobs=None, num_outputs=0):
    params = mp.SamplingParams(prompt_logprobs=prompt_logprobs)
    tokens = list(range(100, 100 + num_prompt + num_outputs))
    req = Request(request_id, tokens[:num_prompt], params, 16, root_hash("test"))
    req.token_ids += tokens[num_prompt:]
    return req


def test_each_asking_chunk_scores_its_next_prompt_tokens_from_its_own_hidden_rows():
    a, b = _request("a", 40, prompt_logprobs=2), _request("b", 30)
    c = _request("c", 20, prompt_logprobs=5, num_outputs=6)  # re-admitted after a preemption: prompt and outputs
    out = SchedulerOutput(
        [
            ScheduledSeq(a, [(0, 16), (32, 40)], 40, True),  # a hole where another request computes block 1
            ScheduledSeq(b, [(0, 30)], 30, True),
            ScheduledSeq(c, [(10, 26)], 26, True),
        ]
    )
    scoring = plan_scoring(out)
    assert [(req.request_id, positions) for req, positions in scoring.requests] == [
        ("a", [*range(1, 17), *range(33, 40)]),  # position 39 is a's last: it scores no prompt token
        ("c", list(range(11, 20))),  # rows past c's prompt score none
    ]
    assert scoring.hidden_rows == [*range(0, 16), *range(16, 23), *range(54, 63)]
    assert scoring.targets == [a.token_ids[p] for p in [*range(1, 17), *range(33, 40)]] + list(range(111, 120))
    assert scoring.k == 5
    assert plan_scoring(SchedulerOutput([ScheduledSeq(b, [(0, 30)], 30, True)])) is None


def test_the_step_scores_the_largest_k_asked_whichever_request_asks_it():
    a, b = _request("a", 10, prompt_logprobs=7), _request("b", 10, prompt_logprobs=0)
    scoring = plan_scoring(
        SchedulerOutput([ScheduledSeq(a, [(0, 10)], 10, True), ScheduledSeq(b, [(0, 10)], 10, True)])
    )
    assert scoring.k == 7 and scoring.hidden_rows == [*range(0, 9), *range(10, 19)]


def test_prompt_logprobs_are_out_of_range_or_not_integers_an_error_naming_them():
    with pytest.raises(ValueError, match="prompt_logprobs must be None or in \\[0, 20\\]"):
        mp.SamplingParams(prompt_logprobs=21)
    with pytest.raises(TypeError, match="prompt_logprobs must be an int or None"):
        mp.SamplingParams(prompt_logprobs=True)


@pytest.fixture(scope="module")
def chunked(model_dir):
    """An engine whose chunks hold 32 tokens: a prompt of 61 is scored over two steps."""
    llm = mp.LLM(str(model_dir), device="cpu", dtype="float32", max_model_len=512, max_num_batched_tokens=32)
    yield llm
    llm.close()


def hf_log_softmax(hf_model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(torch.tensor([ids])).logits[0].float().log_softmax(dim=-1)


def assert_prompt_logprobs_match(out, hf_model, k: int, tokenizer=None) -> None:
    ids = out.prompt_token_ids
    expected = hf_log_softmax(hf_model, ids)
    assert len(out.prompt_logprobs) == len(ids) and out.prompt_logprobs[0] is None
    for position, entry in enumerate(out.prompt_logprobs[1:], start=1):
        token, row = ids[position], expected[position - 1]
        assert next(iter(entry)) == token, "the prompt's own token comes first"
        assert abs(entry[token].logprob - row[token].item()) < 1e-4
        assert entry[token].rank == int((row >= row[token]).sum())
        top = row.topk(k)
        assert set(entry) == {token, *top.indices.tolist()}
        for i, (t, want) in enumerate(zip(top.indices.tolist(), top.values.tolist(), strict=True)):
            assert abs(entry[t].logprob - want) < 1e-4
            assert t == token or entry[t].rank == i + 1
        if tokenizer is not None:
            assert entry[token].decoded_token == tokenizer.decode([token])


def test_every_prompt_token_is_transformers_log_softmax_before_it_over_chunks(chunked, hf_model):
    params = mp.SamplingParams(max_tokens=2, temperature=0.0, prompt_logprobs=3)
    outs = chunked.generate(PROMPTS, params, use_tqdm=False)
    assert len(outs[0].prompt_token_ids) > 32, "the first prompt no longer spans several chunks"
    for out in outs:
        assert_prompt_logprobs_match(out, hf_model, 3, chunked.tokenizer)
    plain = chunked.generate(PROMPTS[:1], mp.SamplingParams(max_tokens=2, temperature=0.0), use_tqdm=False)[0]
    assert plain.prompt_logprobs is None
    assert plain.token_ids == outs[0].token_ids


def test_a_step_scored_in_several_passes_of_logits_is_scored_as_in_one(chunked, hf_model, monkeypatch):
    """The step's rows go `LOGITS_PASS_BYTES` of logits at a time (here 5 rows): each pass scores its own targets."""
    vocab = chunked.config.model.vocab_size
    monkeypatch.setattr(prompt_logprobs, "LOGITS_PASS_BYTES", 5 * 4 * vocab + 3)
    passes = []
    spy = prompt_logprobs.token_logprobs
    monkeypatch.setattr(prompt_logprobs, "token_logprobs", lambda x, t, k: passes.append(len(x)) or spy(x, t, k))
    (out,) = chunked.generate(PROMPTS[0], mp.SamplingParams(max_tokens=1, prompt_logprobs=2), use_tqdm=False)
    assert_prompt_logprobs_match(out, hf_model, 2)
    assert sum(passes) == len(out.prompt_token_ids) - 1 and max(passes) == 5 and len(passes) > 2


def test_a_cached_prompt_is_computed_again_for_its_logprobs_and_what_it_computes_is_cached(chunked, hf_model):
    prompt = "A cached prompt: " + "one two three four five six seven eight nine ten. " * 3
    greedy = mp.SamplingParams(max_tokens=2, temperature=0.0)
    chunked.generate(prompt, greedy, use_tqdm=False)
    before = chunked.stats()["num_computed_tokens"]
    scored = mp.SamplingParams(max_tokens=2, temperature=0.0, prompt_logprobs=0)
    (out,) = chunked.generate(prompt, scored, use_tqdm=False)
    num_prompt = len(out.prompt_token_ids)
    assert out.num_cached_tokens == 0 and chunked.stats()["num_computed_tokens"] - before == num_prompt + 1
    assert_prompt_logprobs_match(out, hf_model, 0)
    assert all(len(entry) == 1 for entry in out.prompt_logprobs[1:]), "k = 0: the prompt's own token alone"
    (again,) = chunked.generate(prompt, greedy, use_tqdm=False)
    assert again.num_cached_tokens == 16 * ((num_prompt - 1) // 16)


def test_n_completions_carry_the_prompts_logprobs_computed_once(chunked, hf_model):
    """The first completion scores the prompt; the others read its full blocks cached (block size 16)."""
    params = mp.SamplingParams(max_tokens=3, temperature=1.0, seed=2, n=3, prompt_logprobs=1)
    before = chunked.stats()["num_computed_tokens"]
    (out,) = chunked.generate(PROMPTS[0], params, use_tqdm=False)
    num_prompt = len(out.prompt_token_ids)
    partial = num_prompt - 16 * ((num_prompt - 1) // 16)  # a later completion's last block, computed
    assert chunked.stats()["num_computed_tokens"] - before == num_prompt + 2 * partial + 3 * 2
    assert len(out.outputs) == 3
    assert_prompt_logprobs_match(out, hf_model, 1)


def test_requests_asking_for_different_k_in_one_step_each_get_their_own(chunked, hf_model):
    """The step's rows are as wide as its largest k (asked first here): each request reads its own k from them."""
    params = [mp.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=k) for k in (4, 1)]
    outs = chunked.generate(PROMPTS[1:], params, use_tqdm=False)
    assert sum(len(out.prompt_token_ids) for out in outs) <= 32, "the prompts no longer share a step"
    for out, k in zip(outs, (4, 1), strict=True):
        assert_prompt_logprobs_match(out, hf_model, k)


def test_a_one_token_prompt_has_its_one_entry_none(llm):
    """No position is scored (its first token has no entry): the output still holds one per prompt token."""
    (out,) = llm.generate([[42]], mp.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=2), use_tqdm=False)
    assert out.prompt_logprobs == [None]


def test_a_prompt_with_span_markers_cannot_ask_for_prompt_logprobs(llm):
    ssep = llm.config.control.ssep_id
    prompt = [5] * 16 + [ssep] + [7] * 15 + [9]
    llm.generate([prompt], mp.SamplingParams(max_tokens=1), use_tqdm=False)  # without them, it runs
    with pytest.raises(ValueError, match="prompt 0: prompt_logprobs needs a prompt without span markers"):
        llm.generate([prompt], mp.SamplingParams(max_tokens=1, prompt_logprobs=1), use_tqdm=False)
