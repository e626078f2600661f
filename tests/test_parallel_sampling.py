"""`SamplingParams.n`: n completions of one prompt (vLLM's parallel sampling) on SmolLM2 (fp32, CPU).

Completion i is what a request of its own with seed + i gives; greedy completions are transformers' greedy tokens;
the prompt's blocks are computed once for all n; a stream shows all n; an abort of the request ends all n."""

import asyncio
import queue

import numpy
import pytest
import torch

import minipic_lite as mp
import minipic_lite.llm as llm_api
from minipic_lite.engine import RequestIdInUse
from minipic_lite.outputs import CompletionOutput
from minipic_lite.request import ParentRequest
from tests.waits import run_with_timeout, stream_and_abort

CHAT = [{"role": "user", "content": "Name a fruit."}]
SAMPLED = mp.SamplingParams(max_tokens=10, temperature=0.9, seed=7, n=3)
LONG = mp.SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True, n=3)


def assert_idle(llm):
    engine = llm.engine
    assert not engine.has_unfinished() and not engine.requests and not engine.parents
    engine.pool.check_integrity()
    assert engine.pool.num_free_blocks == engine.pool.num_blocks


# -- the params ------------------------------------------------------------------------------------------------


def test_n_is_an_integer_of_at_least_one():
    assert mp.SamplingParams().n == 1
    assert mp.SamplingParams(n=numpy.int64(3)).n == 3  # numpy's integers as their values
    for bad, error in [(0, ValueError), (-2, ValueError), (True, TypeError), (2.0, TypeError), ("2", TypeError)]:
        with pytest.raises(error, match="n must be an integer >= 1"):
            mp.SamplingParams(n=bad)


def test_completion_i_draws_with_seed_plus_i_and_the_seeds_must_stay_64_bit():
    params = mp.SamplingParams(n=3, seed=10, temperature=0.5, logprobs=2)
    assert [params.child(i).seed for i in range(3)] == [10, 11, 12]
    assert all(params.child(i).n == 1 and params.child(i).logprobs == 2 for i in range(3))
    assert mp.SamplingParams(n=3).child(2).seed is None
    mp.SamplingParams(n=2, seed=2**64 - 2)  # the last seed fits
    with pytest.raises(ValueError, match="seed \\+ n - 1 must be at most 2\\*\\*64 - 1"):
        mp.SamplingParams(n=3, seed=2**64 - 2)


def test_a_seed_of_zero_is_a_seed_and_completion_i_draws_with_seed_i():
    """Seed 0 is a seed like any other (not "no seed"): completion i of n draws with seed 0 + i."""
    params = mp.SamplingParams(n=3, seed=0, temperature=0.5)
    assert [params.child(i).seed for i in range(3)] == [0, 1, 2]


def test_an_output_built_with_one_completion_lists_it_in_outputs():
    metrics = mp.RequestMetrics(arrival_time=0.0)
    out = mp.RequestOutput("r", None, [1], "hi", [5, 6], 0, True, "stop", metrics, stop_reason=6)
    assert out.outputs == [CompletionOutput(0, "hi", [5, 6], None, None, "stop", 6)]
    assert out.outputs[0].finished() and not CompletionOutput(0, "", [], None, None).finished()
    assert all(CompletionOutput(0, "", [], None, None, reason).finished() for reason in ("length", "abort"))


# -- the engine ------------------------------------------------------------------------------------------------


def test_completion_i_is_the_request_alone_with_seed_plus_i(llm):
    (out,) = run_with_timeout(llm.generate, CHAT, SAMPLED, use_tqdm=False)
    assert out.finished and [c.index for c in out.outputs] == [0, 1, 2]
    for i, completion in enumerate(out.outputs):
        alone = mp.SamplingParams(max_tokens=10, temperature=0.9, seed=7 + i)
        (want,) = run_with_timeout(llm.generate, CHAT, alone, use_tqdm=False)
        assert (completion.token_ids, completion.text, completion.finish_reason) == (
            want.token_ids, want.text, want.finish_reason,
        )  # fmt: skip
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1, "three seeds drew the same ten tokens"
    first = out.outputs[0]
    assert (out.text, out.token_ids, out.finish_reason) == (first.text, first.token_ids, first.finish_reason)
    assert out.request_id.isdigit(), "the caller sees its request, not the completions' own ids"
    assert_idle(llm)


def test_greedy_completions_are_each_transformers_greedy_tokens(llm, hf_model):
    prompt = "The three primary colors are"
    ids = torch.tensor([llm.encode(prompt)[0]])
    with torch.no_grad():
        want = hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False)
    params = mp.SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, n=4)
    (out,) = run_with_timeout(llm.generate, prompt, params, use_tqdm=False)
    assert [c.token_ids for c in out.outputs] == [want[0, ids.shape[1] :].tolist()] * 4
    assert all(c.finish_reason == "length" for c in out.outputs)


def test_the_prompt_is_computed_once_for_all_completions(llm):
    """Completions 1..n-1 take the prompt's full blocks from completion 0 (pending on it in the same step): each
    computes only the prompt's last partial block and its own tokens."""
    B, n, num_prompt = llm.config.cache.block_size, 4, 200
    prompt = [1000 + i for i in range(num_prompt)]  # seen by no other test: nothing of it is cached
    before, prompt_tokens = llm.stats()["num_computed_tokens"], llm.engine.stats.num_prompt_tokens
    params = mp.SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True, n=n)
    (out,) = run_with_timeout(llm.generate, [prompt], params, use_tqdm=False)
    computed = llm.stats()["num_computed_tokens"] - before
    last_block = num_prompt - B * ((num_prompt - 1) // B)
    assert computed == num_prompt + (n - 1) * last_block + n * (params.max_tokens - 1)
    assert out.num_cached_tokens == 0, "the prompt's facts are the first completion's, which computed it"
    assert llm.engine.stats.num_prompt_tokens - prompt_tokens == n * num_prompt  # a prompt per completion, as cached
    assert len({tuple(c.token_ids) for c in out.outputs}) == 1
    assert_idle(llm)


def test_logprobs_and_stop_strings_are_each_completions_own(llm):
    params = mp.SamplingParams(max_tokens=16, temperature=1.0, seed=3, n=3, logprobs=2, stop=["."])
    (out,) = run_with_timeout(llm.generate, CHAT, params, use_tqdm=False)
    for i, completion in enumerate(out.outputs):
        (alone,) = run_with_timeout(llm.generate, CHAT, params.child(i), use_tqdm=False)
        assert completion.token_ids == alone.token_ids and completion.text == alone.text
        assert "." not in completion.text and completion.stop_reason == alone.stop_reason
        assert len(completion.logprobs) == len(completion.token_ids)
        assert completion.cumulative_logprob == pytest.approx(alone.cumulative_logprob)
        assert [next(iter(e)) for e in completion.logprobs] == completion.token_ids
    assert out.cumulative_logprob == out.outputs[0].cumulative_logprob


def test_a_stream_shows_every_completion_and_its_texts_only_grow(llm):
    (want,) = run_with_timeout(llm.generate, CHAT, SAMPLED, use_tqdm=False)
    outs = run_with_timeout(list, llm.stream(CHAT, SAMPLED, request_id="streamed"))
    assert {o.request_id for o in outs} == {"streamed"} and [o.finished for o in outs] == [False] * (len(outs) - 1) + [
        True
    ]
    assert all(len(o.outputs) == 3 for o in outs)
    assert len(outs) >= max(len(c.token_ids) for c in outs[-1].outputs), "an output after every step"
    for i in range(3):
        texts = [o.outputs[i].text for o in outs]
        assert all(b.startswith(a) for a, b in zip(texts, texts[1:], strict=False))
        assert outs[-1].outputs[i].token_ids == want.outputs[i].token_ids
    assert_idle(llm)


def test_an_abort_of_the_request_ends_every_completion_and_frees_their_blocks(llm):
    outs = stream_and_abort(llm, "Tell me a long story.", LONG, "many")
    last = outs[-1]
    assert last.finished and [c.finish_reason for c in last.outputs] == ["abort"] * 3
    assert all(2 <= len(c.token_ids) < LONG.max_tokens for c in last.outputs)
    assert_idle(llm)


def test_a_completions_id_aborts_its_whole_request(llm):
    def scenario():
        stream = llm.stream("Tell me a long story.", LONG, request_id="whole")
        next(stream)
        llm.abort(ParentRequest.child_id("whole", 1))
        return list(stream)

    last = run_with_timeout(scenario)[-1]
    assert last.request_id == "whole" and [c.finish_reason for c in last.outputs] == ["abort"] * 3
    assert_idle(llm)


def test_an_id_that_a_running_requests_completions_hold_is_refused_and_it_runs_on(llm):
    stream = llm.stream("Tell me a long story.", LONG, request_id="held")
    run_with_timeout(next, stream)
    greedy = mp.SamplingParams(max_tokens=4, temperature=0.0)
    with pytest.raises(ValueError, match="'0_held' is already in use"):
        run_with_timeout(list, llm.stream("Hi", greedy, request_id="0_held"))
    with pytest.raises(ValueError, match="'held' is already in use"):
        run_with_timeout(list, llm.stream("Hi", mp.SamplingParams(max_tokens=4, n=2), request_id="held"))
    last = run_with_timeout(list, stream)[-1]
    assert [c.finish_reason for c in last.outputs] == ["length"] * 3
    assert_idle(llm)


def test_a_request_whose_completions_ids_clash_is_refused_naming_the_clash(llm):
    engine = llm.engine
    taken = engine.make_request([20, 21, 22], mp.SamplingParams(max_tokens=1), request_id="1_x")
    clashing = engine.make_request([20, 21, 22], mp.SamplingParams(max_tokens=1, n=2), request_id="x")

    def on_the_loop(engine):  # NOTE: the loop thread owns the engine
        engine.add(taken)
        try:
            engine.add(clashing)
        except RequestIdInUse as e:
            refused = e
        in_flight = sorted(engine.requests), sorted(engine.parents)
        engine.abort("1_x")
        return refused, in_flight

    refused, in_flight = run_with_timeout(llm._loop.call, on_the_loop)
    assert str(refused) == "request id 'x': '1_x', the id of one of its n completions, is in use"
    assert refused.request_id == "x" and in_flight == (["1_x"], [])  # nothing of the refused one was added
    assert_idle(llm)


def test_async_llm_streams_a_request_of_n_completions(llm):
    async def scenario():
        async_llm = mp.AsyncLLM.from_llm(llm)
        return [out async for out in async_llm.generate(CHAT, SAMPLED, request_id="async-n")]

    outs = run_with_timeout(asyncio.run, scenario())
    (want,) = run_with_timeout(llm.generate, CHAT, SAMPLED, use_tqdm=False)
    assert outs[-1].finished and [c.token_ids for c in outs[-1].outputs] == [c.token_ids for c in want.outputs]
    assert_idle(llm)


def test_an_automatic_id_passes_a_request_of_n_completions_in_flight(llm):
    """An id the engine chooses is free of a caller's request of n completions (whose id no child request holds)."""

    def on_the_loop(engine):  # NOTE: the loop thread owns the engine
        last = int(engine.make_request([20, 21, 22], mp.SamplingParams(max_tokens=1)).request_id)  # not added
        taken = engine.make_request([20, 21, 22], mp.SamplingParams(max_tokens=1, n=2), request_id=str(last + 1))
        engine.add(taken)
        auto = engine.make_request([20, 21, 22], mp.SamplingParams(max_tokens=1))
        engine.add(auto)
        for req in (taken, auto):
            engine.abort(req.request_id)
        return auto.request_id, last

    auto, last = run_with_timeout(llm._loop.call, on_the_loop)
    assert auto == str(last + 2), "the id of a request of n completions in flight was chosen"
    assert_idle(llm)


def test_an_automatic_id_of_n_completions_passes_ids_its_completions_would_clash_with(llm):
    """A caller's request whose id is the completion id an automatic one would give ('1_<next>'): the automatic id
    passes it instead of being refused (found by a helper's mutation round)."""

    def on_the_loop(engine):  # NOTE: the loop thread owns the engine
        nxt = int(engine.make_request([20, 21, 22], mp.SamplingParams(max_tokens=1)).request_id) + 1  # not added
        held = engine.make_request([20, 21, 22], mp.SamplingParams(max_tokens=1), request_id=f"1_{nxt}")
        engine.add(held)
        auto = engine.make_request([20, 21, 22], mp.SamplingParams(max_tokens=1, n=2))
        engine.add(auto)  # before the fix: RequestIdInUse
        for req in (held, auto):
            engine.abort(req.request_id)
        return auto.request_id, nxt

    auto, nxt = run_with_timeout(llm._loop.call, on_the_loop)
    assert auto == str(nxt + 1)
    assert_idle(llm)


def test_generates_progress_bar_counts_the_tokens_of_every_completion(llm, monkeypatch):
    counted = []
    rates = llm_api.token_rates
    monkeypatch.setattr(llm_api, "token_rates", lambda p, n, s: counted.append((p, n)) or rates(p, n, s))
    (out,) = run_with_timeout(llm.generate, CHAT, SAMPLED, use_tqdm=True)
    assert counted == [(len(out.prompt_token_ids), sum(len(c.token_ids) for c in out.outputs))]


@pytest.fixture(scope="module")
def one_at_a_time(model_dir):
    """An engine that runs one request at a time: completion i starts once completion i - 1 has finished."""
    llm = mp.LLM(str(model_dir), device="cpu", dtype="float32", max_model_len=256, max_num_seqs=1)
    yield llm
    llm.close()


def test_the_timings_span_every_completion_and_preemptions_add_up(one_at_a_time):
    """The first token is the earliest completion's, the finish the last one's; preemptions are summed."""
    llm, params = one_at_a_time, mp.SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True, n=3)
    (req,) = llm.make_requests(["Name a color."], [params])
    outputs = queue.SimpleQueue()
    llm.submit([req], outputs.put)
    out = run_with_timeout(outputs.get)
    first, second, last = req.children
    assert first.finish_time < second.first_token_time and second.finish_time < last.first_token_time
    m = out.metrics
    assert out.finished and (m.arrival_time, m.first_token_time, m.finish_time, m.num_preemptions) == (
        first.arrival_time, first.first_token_time, last.finish_time, 0,
    )  # fmt: skip
    second.num_preemptions, last.num_preemptions = 2, 1
    first.first_token_time = last.finish_time + 1  # as if completion 0 were preempted before its first token
    m = run_with_timeout(llm._loop.call, lambda engine: engine._output(req)).metrics
    assert (m.first_token_time, m.finish_time, m.num_preemptions) == (second.first_token_time, last.finish_time, 3)
    assert_idle(llm)


def test_an_abort_after_some_completions_finished_ends_the_others(one_at_a_time):
    """The request stays in flight (its id taken) until its last completion finishes; an abort then ends the
    unfinished ones and leaves the finished ones as they were; it counts as one abort."""
    llm, params = one_at_a_time, mp.SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True, n=3)
    aborted = llm.engine.stats.num_aborted

    def scenario():
        stream = llm.stream("Tell me a long story.", params, request_id="part")
        out = next(stream)
        while not out.outputs[0].finished():
            out = next(stream)
        assert not out.finished and not out.outputs[1].finished()
        with pytest.raises(ValueError, match="'part' is already in use"):
            list(llm.stream("Hi", mp.SamplingParams(max_tokens=2), request_id="part"))
        llm.abort("part")
        return list(stream)

    last = run_with_timeout(scenario)[-1]
    assert last.finished and [c.finish_reason for c in last.outputs] == ["length", "abort", "abort"]
    assert len(last.outputs[0].token_ids) == params.max_tokens > len(last.outputs[1].token_ids)
    assert llm.engine.stats.num_aborted == aborted + 1
    assert_idle(llm)


def test_completions_and_prompt_logprobs_survive_preemption_in_a_tiny_cache(model_dir, hf_model):
    """Ten blocks of 16 tokens for four 40-token greedy completions of one prompt (and prompt logprobs): completions
    are preempted and recomputed, each ends with the tokens it has alone in a big cache, the preemptions add up, and
    the prompt's logprobs (computed again at each re-admission) are transformers'."""
    prompt = "The history of caching in computer systems."
    params = mp.SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, n=4, prompt_logprobs=1)
    kwargs = dict(device="cpu", dtype="float32", max_model_len=128, max_num_batched_tokens=16)
    tiny = run_with_timeout(mp.LLM, str(model_dir), num_blocks=10, **kwargs)
    try:
        (out,) = run_with_timeout(tiny.generate, prompt, params, use_tqdm=False)
        assert tiny.engine.stats.num_preemptions > 0, "nothing was preempted"
    finally:
        tiny.close()
    alone = mp.SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    (want,) = run_with_timeout(lambda: mp.LLM(str(model_dir), **kwargs).generate(prompt, alone, use_tqdm=False))
    assert [c.token_ids for c in out.outputs] == [want.token_ids] * 4
    assert out.metrics.num_preemptions > 0
    ids = out.prompt_token_ids
    with torch.no_grad():
        expected = hf_model(torch.tensor([ids])).logits[0].float().log_softmax(dim=-1)
    assert out.prompt_logprobs[0] is None
    for position, entry in enumerate(out.prompt_logprobs[1:], start=1):
        assert abs(entry[ids[position]].logprob - expected[position - 1, ids[position]].item()) < 1e-4
