"""Logprobs (vLLM's raw logprobs: the model's own distribution): the sampler's rows against log_softmax and topk, and
the engine's on SmolLM2 (fp32, CPU) against transformers' logits at each generated token, through bursts and stops."""

import pytest
import torch

import minipic_lite as mp
from minipic_lite import sampler
from minipic_lite.sampler import token_logprobs

PROMPTS = [
    "<|im_start|>user\nName three colors.<|im_end|>\n<|im_start|>assistant\n",
    "The capital of France is",
    "def fibonacci(n):",
]
NEW_TOKENS = 12


def test_token_logprobs_are_log_softmax_topk_and_rank():
    logits = torch.randn(3, 100, generator=torch.Generator().manual_seed(0)) * 2
    logits[2, [10, 20]] = 9.0  # a tie at the top: both are rank 2 (vLLM counts the tokens at least as likely)
    tokens = torch.tensor([int(logits[0].argmax()), int(logits[1].argsort()[-4]), 20])
    rows = token_logprobs(logits.bfloat16(), tokens, 3)  # NOTE: the model's dtype in, float32 out
    expected = logits.bfloat16().float().log_softmax(dim=-1)
    top_logprobs, top_ids = expected.topk(3, dim=-1)
    assert rows.dtype == torch.float32 and rows.shape == (3, 2 + 2 * 3)
    assert torch.equal(rows[:, 0], expected.gather(1, tokens[:, None])[:, 0])
    assert rows[:, 1].tolist() == [1.0, 4.0, 2.0]
    assert torch.equal(rows[:, 2:5].long(), top_ids) and torch.equal(rows[:, 5:], top_logprobs)


def test_no_top_tokens_is_the_sampled_tokens_alone():
    rows = token_logprobs(torch.zeros(2, 8), torch.tensor([1, 7]), 0)
    assert rows.shape == (2, 2) and rows[:, 1].tolist() == [8.0, 8.0]  # eight equal tokens: each ranks 8th


def test_cpu_tiles_give_the_rows_of_one_pass(monkeypatch):
    """On the CPU the rows go a few at a time; the tiles (the last one short) give what one pass gives."""
    logits = torch.randn(7, 64, generator=torch.Generator().manual_seed(1)) * 3
    tokens = torch.tensor([0, 5, 9, 63, 2, 2, 40])
    monkeypatch.setattr(sampler, "CPU_TILE_BYTES", 1 << 30)
    whole = token_logprobs(logits, tokens, 4)
    monkeypatch.setattr(sampler, "CPU_TILE_BYTES", 3 * 4 * 64)  # tiles of 3 rows: 3 + 3 + 1
    calls = []
    monkeypatch.setattr(sampler, "_token_logprobs", lambda x, t, k: calls.append(len(x)) or whole_pass(x, t, k))
    assert torch.equal(token_logprobs(logits, tokens, 4), whole) and calls == [3, 3, 1]


whole_pass = sampler._token_logprobs


def test_a_row_larger_than_a_cpu_tile_is_a_tile_of_its_own(monkeypatch):
    """A row of more logprobs than CPU_TILE_BYTES holds still goes: one row a tile, giving what one pass gives."""
    logits = torch.randn(3, 64, generator=torch.Generator().manual_seed(2)) * 3
    tokens = torch.tensor([1, 63, 7])
    whole = token_logprobs(logits, tokens, 2)
    monkeypatch.setattr(sampler, "CPU_TILE_BYTES", 4 * 64 - 1)  # a byte short of one row
    calls = []
    monkeypatch.setattr(sampler, "_token_logprobs", lambda x, t, k: calls.append(len(x)) or whole_pass(x, t, k))
    assert torch.equal(token_logprobs(logits, tokens, 2), whole) and calls == [1, 1, 1]


@pytest.fixture(scope="module")
def hf_steps(llm, hf_model):
    """transformers' greedy tokens and the float32 log-softmax of its logits at each of them, a prompt at a time."""
    eos = hf_model.generation_config.eos_token_id
    hf_model.generation_config.eos_token_id = None
    steps = []
    try:
        for prompt in PROMPTS:
            ids = torch.tensor([llm.encode(prompt)[0]])
            with torch.no_grad():
                out = hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                                        do_sample=False, output_logits=True, return_dict_in_generate=True)  # fmt: skip
            logprobs = torch.cat(out.logits).float().log_softmax(dim=-1)  # (NEW_TOKENS, V)
            steps.append((out.sequences[0, ids.shape[1] :].tolist(), logprobs))
    finally:
        hf_model.generation_config.eos_token_id = eos
    return steps


def assert_logprobs_match(outs, hf_steps, k: int) -> None:
    for out, (tokens, logprobs) in zip(outs, hf_steps, strict=True):
        assert out.token_ids == tokens and len(out.logprobs) == len(tokens)
        for entry, token, row in zip(out.logprobs, tokens, logprobs, strict=True):
            assert next(iter(entry)) == token, "the sampled token comes first"
            assert entry[token].rank == 1  # greedy
            assert abs(entry[token].logprob - row[token].item()) < 1e-4
            top = row.topk(k)
            assert {t: e.rank for t, e in entry.items()} == {t: i + 1 for i, t in enumerate(top.indices.tolist())}
            for t, want in zip(top.indices.tolist(), top.values.tolist(), strict=True):
                assert abs(entry[t].logprob - want) < 1e-4
        chosen = [e[t].logprob for e, t in zip(out.logprobs, tokens, strict=True)]
        assert out.cumulative_logprob == pytest.approx(sum(chosen))


def test_greedy_logprobs_are_transformers_log_softmax_at_each_token(llm, hf_steps):
    params = mp.SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True, logprobs=5)
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    assert_logprobs_match(outs, hf_steps, 5)
    entry = outs[1].logprobs[0]
    tokenizer = llm.tokenizer
    assert all(e.decoded_token == tokenizer.decode([t]) for t, e in entry.items())
    plain = llm.generate(PROMPTS[:1], mp.SamplingParams(max_tokens=2, temperature=0.0), use_tqdm=False)[0]
    assert plain.logprobs is None and plain.cumulative_logprob is None


def test_bursts_keep_each_tokens_logprobs_and_drop_those_past_a_stop(model_dir, llm, hf_steps):
    """Four steps a burst, queued before the last one's tokens are read: the same logprobs as transformers'; a
    request that stops mid-burst keeps a logprob for each token it kept, and no more."""
    burst = mp.LLM(str(model_dir), device="cpu", dtype="float32", max_model_len=512, num_scheduler_steps=4,
                   async_scheduling=True)  # fmt: skip
    try:
        params = mp.SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True, logprobs=2)
        outs = burst.generate(PROMPTS, params, use_tqdm=False)
        assert burst.engine.stats.num_continuations > 0
        assert_logprobs_match(outs, hf_steps, 2)
        stop_token = hf_steps[2][0][5]  # the sixth token: a stop in the second burst
        stopping = mp.SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True, logprobs=1,
                                     stop_token_ids=[stop_token])  # fmt: skip
        (cut,) = burst.generate(PROMPTS[2:], stopping, use_tqdm=False)
    finally:
        burst.close()
    kept = hf_steps[2][0].index(stop_token) + 1
    assert len(cut.token_ids) == len(cut.logprobs) == kept
    assert [next(iter(e)) for e in cut.logprobs] == cut.token_ids


def test_sampled_rows_get_the_models_logprobs_before_penalties_and_temperature(llm, hf_model):
    """Rows of one batch asking for 0, 3 and no top tokens, sampled at temperature 1.5 with a repetition penalty: each
    token's logprob is the model's own (transformers, teacher-forced on the tokens drawn), and its rank too."""
    prompt_ids = llm.encode(PROMPTS[0])[0]
    params = [
        mp.SamplingParams(max_tokens=8, temperature=1.5, seed=1, repetition_penalty=1.4, logprobs=0, ignore_eos=True),
        mp.SamplingParams(max_tokens=8, temperature=1.5, seed=2, logprobs=3, ignore_eos=True),
        mp.SamplingParams(max_tokens=8, temperature=1.5, seed=3, ignore_eos=True),
    ]
    outs = llm.generate([PROMPTS[0]] * 3, params, use_tqdm=False)
    assert outs[2].logprobs is None
    for out, k in zip(outs[:2], (0, 3), strict=True):
        ids = torch.tensor([prompt_ids + out.token_ids])
        with torch.no_grad():
            logits = hf_model(ids).logits[0, len(prompt_ids) - 1 : -1].float().log_softmax(dim=-1)
        for entry, token, row in zip(out.logprobs, out.token_ids, logits, strict=True):
            assert len(entry) in (k + 1, k) and next(iter(entry)) == token
            assert abs(entry[token].logprob - row[token].item()) < 1e-4
            # NOTE: two fp32 implementations: a rank may move by the tokens within rounding of this one
            assert int((row > row[token] + 1e-4).sum()) < entry[token].rank <= int((row >= row[token] - 1e-4).sum())
    assert any(e[t].rank > 1 for e, t in zip(outs[0].logprobs, outs[0].token_ids, strict=True)), "nothing sampled"


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [(-1, ValueError, r"logprobs must be None or in \[0, 20\]"), (21, ValueError, "logprobs"),
     ("3", TypeError, "logprobs must be an int or None"), (True, TypeError, "logprobs")],
)  # fmt: skip
def test_bad_logprobs_are_errors_naming_the_field(value, error, match):
    with pytest.raises(error, match=match):
        mp.SamplingParams(logprobs=value)
