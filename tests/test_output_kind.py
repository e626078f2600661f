"""`SamplingParams.output_kind` (vLLM's RequestOutputKind) on SmolLM2 (fp32, CPU): a DELTA stream's outputs add up to
what `generate()` returns (text, tokens, logprobs; each completion of n), with the prompt's logprobs in its first
output alone; a FINAL_ONLY stream yields its final output alone; `generate()` is final whatever the kind."""

import asyncio

import pytest

import minipic_lite as mp

DELTA, FINAL_ONLY = mp.RequestOutputKind.DELTA, mp.RequestOutputKind.FINAL_ONLY
CHAT = [{"role": "user", "content": "Write two sentences about the sea."}]


def params(**extra) -> mp.SamplingParams:
    return mp.SamplingParams(**{"max_tokens": 12, "temperature": 0.0, "logprobs": 2, **extra})


def added_up(outputs: list[mp.RequestOutput], index: int = 0) -> tuple[str, list[int], list]:
    completions = [o.outputs[index] for o in outputs]
    logprobs = [entry for c in completions for entry in c.logprobs or ()]
    return "".join(c.text for c in completions), [t for c in completions for t in c.token_ids], logprobs


def test_a_delta_streams_outputs_add_up_to_the_generated_one(llm):
    (whole,) = llm.generate(CHAT, params(prompt_logprobs=1), use_tqdm=False)
    deltas = list(llm.stream(CHAT, params(prompt_logprobs=1, output_kind=DELTA)))
    assert len(deltas) == len(whole.token_ids) > 1, "one output per step, one token each on the CPU"
    assert [len(d.token_ids) for d in deltas] == [1] * len(deltas)
    assert added_up(deltas) == (whole.text, whole.token_ids, whole.logprobs)
    assert deltas[-1].finished and not any(d.finished for d in deltas[:-1])
    assert deltas[0].prompt_logprobs == whole.prompt_logprobs
    assert all(d.prompt_logprobs is None for d in deltas[1:]), "the prompt's logprobs come once"
    cumulative = list(llm.stream(CHAT, params()))
    assert [len(c.token_ids) for c in cumulative] == list(range(1, len(deltas) + 1)), "the default is cumulative"


def test_a_cumulative_stream_carries_the_prompts_logprobs_in_every_output(llm):
    """Each cumulative output is whole, the prompt's logprobs with it (vLLM's), not only in the first."""
    (whole,) = llm.generate(CHAT, params(max_tokens=3, prompt_logprobs=1), use_tqdm=False)
    outputs = list(llm.stream(CHAT, params(max_tokens=3, prompt_logprobs=1)))
    assert len(outputs) == 3 and whole.prompt_logprobs is not None
    assert [o.prompt_logprobs for o in outputs] == [whole.prompt_logprobs] * 3


def test_a_delta_stream_that_stops_at_a_string_adds_up_to_the_cut_text(llm):
    whole = llm.generate(CHAT, params(max_tokens=24), use_tqdm=False)[0].text
    stop = whole.split()[3]  # a word a few tokens in
    (expected,) = llm.generate(CHAT, params(max_tokens=24, stop=[stop]), use_tqdm=False)
    deltas = list(llm.stream(CHAT, params(max_tokens=24, stop=[stop], output_kind=DELTA)))
    assert added_up(deltas)[0] == expected.text and deltas[-1].finish_reason == "stop"
    assert added_up(deltas)[1] == expected.token_ids


def test_n_completions_each_add_up_in_a_delta_stream(llm):
    sampled = mp.SamplingParams(max_tokens=8, temperature=0.8, seed=5, n=2)
    (whole,) = llm.generate(CHAT, sampled, use_tqdm=False)
    deltas = list(llm.stream(CHAT, mp.SamplingParams(max_tokens=8, temperature=0.8, seed=5, n=2, output_kind=DELTA)))
    for i in range(2):
        text, token_ids, _ = added_up(deltas, i)
        assert (text, token_ids) == (whole.outputs[i].text, whole.outputs[i].token_ids)


def test_a_final_only_stream_yields_its_final_output_alone(llm):
    (whole,) = llm.generate(CHAT, params(), use_tqdm=False)
    (final,) = list(llm.stream(CHAT, params(output_kind=FINAL_ONLY)))
    assert final.finished and (final.text, final.token_ids) == (whole.text, whole.token_ids)


def test_generate_returns_whole_outputs_whatever_the_kind(llm):
    (whole,) = llm.generate(CHAT, params(), use_tqdm=False)
    for kind in (DELTA, FINAL_ONLY):
        (out,) = llm.generate(CHAT, params(output_kind=kind), use_tqdm=False)
        assert (out.text, out.token_ids, out.logprobs) == (whole.text, whole.token_ids, whole.logprobs)


def test_an_async_delta_stream_adds_up_too(llm):
    async_llm = mp.AsyncLLM.from_llm(llm)

    async def collect():
        return [out async for out in async_llm.generate(CHAT, params(output_kind=DELTA), request_id="delta")]

    deltas = asyncio.run(collect())
    (whole,) = llm.generate(CHAT, params(), use_tqdm=False)
    assert added_up(deltas) == (whole.text, whole.token_ids, whole.logprobs)


@pytest.mark.parametrize("bad", [1, "DELTA", None])
def test_an_output_kind_not_of_the_enum_is_an_error_naming_it(bad):
    with pytest.raises(TypeError, match="output_kind must be a RequestOutputKind \\(CUMULATIVE, DELTA, FINAL_ONLY\\)"):
        mp.SamplingParams(output_kind=bad)
