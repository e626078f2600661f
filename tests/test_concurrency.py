"""Many callers on one LLM: outputs routed by request id, nothing lost, nothing hangs, aborts free blocks.

Every wait is bounded (tests/waits.py): a scenario runs in a worker thread joined with a timeout, so a hang fails the
test instead of blocking CI.
"""

import asyncio
import queue
import threading

import pytest
import torch

import minipic_lite as mp
from minipic_lite.request import ParentRequest
from tests.waits import WAIT_S, run_with_timeout, stream_and_abort

GREEDY = mp.SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
# NOTE: ignore_eos: sampled freely, the model may end "Tell me a long story." at its first token
LONG = mp.SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time",
    "The three primary colors are",
    "1, 2, 3, 4,",
    "My favourite food is",
    "The sun rises in the",
    "Water boils at",
]


def assert_idle(llm):
    engine = llm.engine
    assert not engine.has_unfinished() and not engine.requests
    engine.pool.check_integrity()
    assert engine.pool.num_free_blocks == engine.pool.num_blocks


@pytest.fixture(scope="module")
def solo(llm):
    """Each prompt run alone (greedy): what every concurrent run must reproduce."""
    return {p: run_with_timeout(llm.generate, p, GREEDY, use_tqdm=False)[0].token_ids for p in PROMPTS}


def test_generate_while_a_stream_is_open_gets_its_own_output_and_the_stream_finishes(llm, solo):
    """Before the engine loop, generate() took the stream's finished output as its own (KeyError) and the
    stream then waited forever on steps that returned nothing."""

    def scenario():
        stream = llm.stream(PROMPTS[0], GREEDY)
        first = next(stream)
        (out,) = llm.generate([PROMPTS[1]], GREEDY, use_tqdm=False)
        rest = list(stream)
        return first, out, rest

    first, out, rest = run_with_timeout(scenario)
    assert out.token_ids == solo[PROMPTS[1]] and out.prompt == PROMPTS[1]
    assert rest[-1].finished and rest[-1].token_ids == solo[PROMPTS[0]]
    assert {o.request_id for o in [first, *rest]} == {first.request_id} != {out.request_id}
    assert_idle(llm)


def test_two_open_streams_both_finish(llm, solo):
    """Before: one stream hung when its last token arrived during the other's step."""

    def scenario():
        a, b = llm.stream(PROMPTS[2], GREEDY), llm.stream(PROMPTS[3], GREEDY)
        outs_a, outs_b = [next(a)], [next(b)]
        outs_b += list(b)  # b runs to its end while a is open
        outs_a += list(a)
        return outs_a, outs_b

    outs_a, outs_b = run_with_timeout(scenario)
    assert outs_a[-1].finished and outs_a[-1].token_ids == solo[PROMPTS[2]]
    assert outs_b[-1].finished and outs_b[-1].token_ids == solo[PROMPTS[3]]
    assert len({o.request_id for o in outs_a}) == 1 and len({o.request_id for o in outs_b}) == 1
    assert_idle(llm)


def test_eight_threads_streaming_and_generating_at_once(llm, solo):
    results: dict[int, list] = {}

    def streamer(i):
        outs = list(llm.stream(PROMPTS[i], GREEDY))
        assert all(b.text.startswith(a.text) for a, b in zip(outs, outs[1:], strict=False))
        results[i] = outs[-1].token_ids
        if i % 2 == 0:  # generate() calls in between, on the same threads
            (out,) = llm.generate([PROMPTS[(i + 1) % 8]], GREEDY, use_tqdm=False)
            results[100 + i] = out.token_ids

    def scenario():
        threads = [threading.Thread(target=streamer, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return results

    run_with_timeout(scenario)
    assert len(results) == 12, "a request was lost"
    for i in range(8):
        assert results[i] == solo[PROMPTS[i]], PROMPTS[i]
    for i in range(0, 8, 2):
        assert results[100 + i] == solo[PROMPTS[(i + 1) % 8]]
    assert_idle(llm)


def test_async_llm_streams_concurrent_tasks_and_break_aborts(llm, solo):
    async_llm = mp.AsyncLLM.from_llm(llm)

    async def collect(prompt, request_id):
        return [out async for out in async_llm.generate(prompt, GREEDY, request_id=request_id)]

    async def leave_early():
        async for out in async_llm.generate("Tell me a long story.", LONG):
            if len(out.token_ids) == 2:
                break

    async def main():
        results = await asyncio.gather(collect(PROMPTS[4], "a"), collect(PROMPTS[5], "b"), leave_early())
        await asyncio.sleep(0)
        return results

    a, b, _ = run_with_timeout(asyncio.run, main())
    assert [o.request_id for o in a] == ["a"] * len(a) and a[-1].token_ids == solo[PROMPTS[4]]
    assert b[-1].finished and b[-1].token_ids == solo[PROMPTS[5]]
    assert async_llm.stats()["num_running"] == 0  # the abandoned request was aborted
    assert_idle(llm)


HELD = mp.SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)  # still running while the test acts


@pytest.mark.parametrize("second_caller", ["stream", "async"])
def test_a_request_id_in_flight_cannot_be_reused_and_its_request_runs_on(llm, solo, second_caller):
    """The refused caller gets the error; the request holding the id is not aborted for it (it was, until stop 63:
    the refused stream's cleanup aborted the id, which was the other caller's)."""
    stream = llm.stream(PROMPTS[0], HELD, request_id="same")
    run_with_timeout(next, stream)

    async def refused_async():
        return [out async for out in mp.AsyncLLM.from_llm(llm).generate(PROMPTS[1], GREEDY, request_id="same")]

    def refused():
        if second_caller == "stream":
            return list(llm.stream(PROMPTS[1], GREEDY, request_id="same"))
        return asyncio.run(refused_async())

    with pytest.raises(ValueError, match="'same' is already in use"):
        run_with_timeout(refused)
    last = run_with_timeout(list, stream)[-1]
    assert (last.finish_reason, len(last.token_ids)) == ("length", 40)
    assert last.token_ids[:12] == solo[PROMPTS[0]]
    assert_idle(llm)


def test_a_callers_cleanup_by_id_spares_another_callers_request_under_that_id(llm, solo):
    """generate(), stream() and AsyncLLM clean up what they still run by id when interrupted; where their request
    was refused (its id in flight as another caller's) and the refusal not read yet, the request under that id is
    the other caller's: the cleanup aborts its own request object only."""
    stream = llm.stream(PROMPTS[0], HELD, request_id="taken")
    run_with_timeout(next, stream)
    (refused,) = llm.make_requests([PROMPTS[1]], [GREEDY], request_id="taken")
    run_with_timeout(llm._loop.abort, "taken", True, refused)
    last = run_with_timeout(list, stream)[-1]
    assert (last.finish_reason, last.token_ids[:12]) == ("length", solo[PROMPTS[0]])
    assert_idle(llm)


def test_generate_picks_ids_past_those_callers_chose_and_their_requests_run_on(llm, solo):
    """generate()'s ids are '0', '1', ...; a stream that took the next of them must not refuse generate() (nor be
    aborted by it)."""
    taken = str(int(run_with_timeout(llm.generate, PROMPTS[2], GREEDY, use_tqdm=False)[0].request_id) + 1)
    stream = llm.stream(PROMPTS[0], HELD, request_id=taken)
    run_with_timeout(next, stream)
    outs = run_with_timeout(llm.generate, PROMPTS[1:3], GREEDY, use_tqdm=False)
    assert [o.token_ids for o in outs] == [solo[PROMPTS[1]], solo[PROMPTS[2]]]
    assert taken not in {o.request_id for o in outs}
    last = run_with_timeout(list, stream)[-1]
    assert (last.request_id, last.finish_reason, last.token_ids[:12]) == (taken, "length", solo[PROMPTS[0]])
    assert_idle(llm)


def test_generate_with_n_spares_a_callers_request_under_one_of_its_completions_ids(llm, solo):
    """n > 1: the id generate() picks must leave its completions' ids ('1_<id>', ...) free too: a stream holding
    '1_<next id>' is neither refused to nor aborted by it."""
    following = str(int(run_with_timeout(llm.generate, PROMPTS[2], GREEDY, use_tqdm=False)[0].request_id) + 1)
    taken = ParentRequest.child_id(following, 1)
    stream = llm.stream(PROMPTS[0], HELD, request_id=taken)
    run_with_timeout(next, stream)
    twice = mp.SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, n=2)
    (out,) = run_with_timeout(llm.generate, PROMPTS[1], twice, use_tqdm=False)
    assert out.request_id != following and [c.token_ids for c in out.outputs] == [solo[PROMPTS[1]]] * 2
    last = run_with_timeout(list, stream)[-1]
    assert (last.request_id, last.finish_reason, last.token_ids[:12]) == (taken, "length", solo[PROMPTS[0]])
    assert_idle(llm)


class Interrupt(Exception):
    pass


class InterruptedQueue(queue.SimpleQueue):
    def get(self, *args, **kwargs):
        raise Interrupt  # as a Ctrl-C while generate() waits: before it read anything


def test_an_interrupted_generate_spares_another_callers_request_under_one_of_its_ids(llm, solo, monkeypatch):
    """generate() cleans up its requests by id; one of them refused (a stream took its id meanwhile), the refusal not
    read yet: the cleanup aborts its own request object only, not the stream's."""
    make = llm.make_requests
    streams = []

    def make_then_take_the_second_id(prompts, *args, **kwargs):
        requests = make(prompts, *args, **kwargs)
        if len(requests) == 2:
            streams.append(llm.stream(PROMPTS[0], HELD, request_id=requests[1].request_id))
            run_with_timeout(next, streams[0])
            monkeypatch.setattr("minipic_lite.llm.queue.SimpleQueue", InterruptedQueue)
        return requests

    monkeypatch.setattr(llm, "make_requests", make_then_take_the_second_id)
    with pytest.raises(Interrupt):
        llm.generate(PROMPTS[1:3], GREEDY, use_tqdm=False)
    monkeypatch.undo()
    last = run_with_timeout(list, streams[0])[-1]
    assert (last.finish_reason, last.token_ids[:12]) == ("length", solo[PROMPTS[0]])
    assert_idle(llm)


def test_an_interrupted_stream_spares_another_callers_request_under_its_id(llm, solo, monkeypatch):
    """The stream's cleanup, its request refused and the refusal not read yet, aborts its own request object only."""
    stream = llm.stream(PROMPTS[0], HELD, request_id="held")
    run_with_timeout(next, stream)
    refused = llm.stream(PROMPTS[1], GREEDY, request_id="held")
    monkeypatch.setattr("minipic_lite.llm.queue.SimpleQueue", InterruptedQueue)
    with pytest.raises(Interrupt):
        next(refused)
    monkeypatch.undo()
    last = run_with_timeout(list, stream)[-1]
    assert (last.finish_reason, last.token_ids[:12]) == ("length", solo[PROMPTS[0]])
    assert_idle(llm)


class InterruptedAsyncQueue(asyncio.Queue):
    async def get(self):
        raise Interrupt


def test_an_interrupted_async_generate_spares_another_callers_request_under_its_id(llm, solo, monkeypatch):
    """AsyncLLM's cleanup, its request refused and the refusal not read yet, aborts its own request object only."""
    stream = llm.stream(PROMPTS[0], HELD, request_id="held")
    run_with_timeout(next, stream)

    async def interrupted():
        refused = mp.AsyncLLM.from_llm(llm).generate(PROMPTS[1], GREEDY, request_id="held")
        with pytest.raises(Interrupt):
            await anext(refused)

    monkeypatch.setattr("minipic_lite.async_llm.asyncio.Queue", InterruptedAsyncQueue)
    asyncio.run(interrupted())
    monkeypatch.undo()
    last = run_with_timeout(list, stream)[-1]
    assert (last.finish_reason, last.token_ids[:12]) == ("length", solo[PROMPTS[0]])
    assert_idle(llm)


# -- abort ---------------------------------------------------------------------------------------------------


def test_abort_in_prefill_in_decode_and_while_preempted(model_dir):
    """A tiny cache (chunked prefill, preemption): aborted requests free their blocks at once, their callers get
    a final "abort" output, and the others' tokens are those of a run without the aborted ones."""
    kwargs = dict(device="cpu", dtype="float32", max_model_len=128, num_blocks=10, max_num_batched_tokens=16)
    params = mp.SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    keep = [PROMPTS[0], PROMPTS[1], PROMPTS[6], PROMPTS[7]]
    long_prompt = " ".join(["The history of caching in computer systems."] * 6)  # ~50 tokens: 4 chunks
    reference = run_with_timeout(lambda: mp.LLM(str(model_dir), **kwargs).generate(keep, params, use_tqdm=False))

    llm = run_with_timeout(mp.LLM, str(model_dir), **kwargs)
    engine = llm.engine
    ids = [engine.add_request(llm.encode(p)[0], params, prompt=p) for p in keep]
    in_prefill = engine.add_request(llm.encode(long_prompt)[0], params)
    in_decode = engine.add_request(llm.encode(PROMPTS[2])[0], params)
    finals = {}
    for _ in range(400):
        req = engine.requests.get(in_prefill)
        if req is not None and 0 < req.num_computed_tokens < req.num_prompt_tokens:
            finals["prefill"] = engine.abort(in_prefill)  # mid-prefill: some chunks computed, not all
        req = engine.requests.get(in_decode)
        if req is not None and req.num_output_tokens == 3:
            finals["decode"] = engine.abort(in_decode)
        preempted = [r for r in engine.scheduler.waiting if r.num_preemptions and r.request_id in ids]
        if preempted and "preempted" not in finals:
            victim = preempted[0]
            ids.remove(victim.request_id)
            finals["preempted"] = engine.abort(victim.request_id)
        for out in engine.step():
            finals.setdefault(out.request_id, out)
        engine.pool.check_integrity()
        if not engine.has_unfinished():
            break
    assert set(finals) >= {"prefill", "decode", "preempted"}
    for name in ("prefill", "decode", "preempted"):
        assert finals[name].finished and finals[name].finish_reason == "abort"
    assert len(finals["decode"].token_ids) == 3
    assert engine.stats.num_preemptions > 0, "the cache was meant to force preemption"
    assert engine.pool.num_free_blocks == engine.pool.num_blocks and not engine.requests
    survivors = {o.prompt: o.token_ids for o in finals.values() if o.finish_reason != "abort"}
    assert len(survivors) == len(keep) - 1  # one was aborted while preempted
    for ref in reference:  # the survivors' tokens are those of a run without the aborted requests
        if ref.prompt in survivors:
            assert survivors[ref.prompt] == ref.token_ids


def test_llm_abort_gives_the_caller_a_final_output_and_frees_blocks(llm):
    outs = stream_and_abort(llm, "Tell me a long story.", LONG, "cancel-me")
    assert outs[-1].finished and outs[-1].finish_reason == "abort" and len(outs[-1].token_ids) >= 2
    assert_idle(llm)


def test_an_abort_that_does_not_wait_ends_the_request_all_the_same(llm):
    """`abort(id, wait=False)` returns at once (a server's event loop must not wait for a step); the abort runs when
    the step ends: the stream still gets its final "abort" output and the blocks come back."""

    def scenario():
        stream = llm.stream("Tell me a long story.", LONG, request_id="cancel-later")
        outs = [next(stream)]
        llm.abort("cancel-later", wait=False)
        return outs + list(stream)

    outs = run_with_timeout(scenario)
    assert outs[-1].finished and outs[-1].finish_reason == "abort" and len(outs[-1].token_ids) < LONG.max_tokens
    assert_idle(llm)


def test_the_loop_thread_builds_the_engine_and_a_build_error_reaches_the_caller(model_dir, monkeypatch):
    """Every torch op of the engine runs on its loop thread, from the weights on (engine_loop.py: two OpenMP pools
    on one CPU throttle each other)."""
    import minipic_lite.llm as llm_module

    built_on = []

    class RecordingEngine(llm_module.LLMEngine):
        def __init__(self, *args, **kwargs):
            built_on.append(threading.current_thread())
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(llm_module, "LLMEngine", RecordingEngine)
    llm = run_with_timeout(mp.LLM, model_dir, device="cpu", num_blocks=64, max_model_len=256)
    try:
        assert built_on == [llm._loop._thread] and built_on[0] is not threading.current_thread()
        out = run_with_timeout(llm.generate, "Hi", mp.SamplingParams(max_tokens=2), use_tqdm=False)[0]
        assert len(out.token_ids) == 2
    finally:
        run_with_timeout(llm.close)
    with pytest.raises(ValueError, match="too few for one request"):
        run_with_timeout(mp.LLM, model_dir, device="cpu", num_blocks=2, max_model_len=256)


@pytest.mark.parametrize(
    ("device", "omp_env", "expected"),
    [("cuda", None, [1]), ("cuda", "4", []), ("cpu", None, [])],
    ids=["cuda", "cuda-with-OMP_NUM_THREADS", "cpu"],
)
def test_a_cuda_engine_thread_drops_to_one_torch_thread_unless_omp_num_threads_says(
    device, omp_env, expected, monkeypatch
):
    from minipic_lite.engine_loop import fewer_cpu_threads

    calls = []
    monkeypatch.setattr(torch, "get_num_threads", lambda: 16)
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    if omp_env is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", omp_env)
    fewer_cpu_threads(torch.device(device))
    assert calls == expected


def test_a_cpu_engine_keeps_its_torch_threads(model_dir):
    llm = run_with_timeout(mp.LLM, model_dir, device="cpu", num_blocks=64, max_model_len=256)
    try:
        assert run_with_timeout(llm._loop.call, lambda engine: torch.get_num_threads()) == torch.get_num_threads() > 0
    finally:
        run_with_timeout(llm.close)


def test_an_llm_nobody_holds_is_collected_and_its_loop_thread_ends(model_dir):
    import gc
    import weakref

    llm = run_with_timeout(mp.LLM, model_dir, device="cpu", num_blocks=64, max_model_len=256)
    run_with_timeout(llm.generate, "Hi", mp.SamplingParams(max_tokens=2), use_tqdm=False)
    thread, ref = llm._loop._thread, weakref.ref(llm)
    del llm
    gc.collect()
    assert ref() is None
    thread.join(WAIT_S)
    assert not thread.is_alive()


# -- a step that fails, a consumer that fails, closing with requests in flight -----------------------------------


def test_a_failing_step_reaches_every_caller_in_flight_and_the_loop_keeps_serving(llm, solo, monkeypatch):
    """A forward that raises (say, out of memory) after the step admitted its requests: every request in flight
    (a stream and a generate() here) gets the error and is aborted, every block comes back, the prefix cache is
    forgotten (the failed step published hashes of blocks it never wrote), and the next request runs as before."""
    engine = llm.engine
    launch, failed = engine.runner.launch, threading.Event()

    def launch_failing_once(out):
        if not failed.is_set() and len(engine.requests) >= 2:
            failed.set()
            raise RuntimeError("injected forward failure")
        return launch(out)

    monkeypatch.setattr(engine.runner, "launch", launch_failing_once)

    def scenario():
        stream = llm.stream(PROMPTS[0], LONG)
        first = next(stream)
        with pytest.raises(RuntimeError, match="injected forward failure"):
            llm.generate([PROMPTS[1]], GREEDY, use_tqdm=False)
        with pytest.raises(RuntimeError, match="injected forward failure"):
            list(stream)
        return first

    first = run_with_timeout(scenario)
    assert failed.is_set() and not first.finished
    assert_idle(llm)
    assert engine.pool.num_cached_blocks == 0 and not engine.kv.pending
    (out,) = run_with_timeout(lambda: llm.generate([PROMPTS[1]], GREEDY, use_tqdm=False))
    assert out.token_ids == solo[PROMPTS[1]]
    assert_idle(llm)


def test_a_call_that_fails_reaches_its_caller_or_the_log_and_the_loop_keeps_serving(llm, solo, caplog):
    """`call` raises fn's error in the caller that waits; with nobody waiting (wait=False, as AsyncLLM aborts) the
    error is logged instead of dropped; either way the next request runs as before."""

    def broken(engine):
        raise KeyError("injected call failure")

    with pytest.raises(KeyError, match="injected call failure"):
        run_with_timeout(llm._loop.call, broken)
    with caplog.at_level("ERROR", logger="minipic_lite.engine_loop"):
        llm._loop.call(broken, wait=False)
        (out,) = run_with_timeout(lambda: llm.generate([PROMPTS[0]], GREEDY, use_tqdm=False))
    assert out.token_ids == solo[PROMPTS[0]]
    (record,) = [r for r in caplog.records if "a queued call failed" in r.getMessage()]
    assert "injected call failure" in str(record.exc_info[1])
    assert_idle(llm)


def test_a_sink_that_raises_aborts_its_request_and_the_others_finish(llm, solo):
    """A streaming consumer that is gone (its sink raises, e.g. its event loop closed) stops its request at its first
    token; a generate() beside it gets its own tokens."""
    calls = []

    def broken_sink(output):
        calls.append(output)
        raise RuntimeError("consumer gone")

    (req,) = llm.make_requests([PROMPTS[2]], [LONG], stream=True)
    llm.submit([req], broken_sink)
    (out,) = run_with_timeout(lambda: llm.generate([PROMPTS[3]], GREEDY, use_tqdm=False))
    assert out.token_ids == solo[PROMPTS[3]]
    assert run_with_timeout(llm._loop.call, lambda engine: req.request_id in engine.requests) is False
    assert [o.finished for o in calls] == [False, True]  # its first token, then the abort's final output
    assert calls[-1].finish_reason == "abort" and len(calls[-1].token_ids) == 1
    assert_idle(llm)


def test_closing_the_llm_aborts_the_requests_in_flight(model_dir):
    """close() with a stream still running: the stream ends with a final "abort" output instead of hanging, and a
    request after close() is a clear error."""
    llm = run_with_timeout(mp.LLM, str(model_dir), device="cpu", dtype="float32", num_blocks=64, max_model_len=512)

    def scenario():
        stream = llm.stream(PROMPTS[0], LONG)
        first = next(stream)
        llm.close()
        return [first, *stream]

    assert not llm.closed
    outs = run_with_timeout(scenario)
    assert outs[-1].finished and outs[-1].finish_reason == "abort" and not outs[0].finished
    assert llm.closed and not llm._loop._thread.is_alive()
    with pytest.raises(RuntimeError, match="the engine loop is closed"):
        run_with_timeout(llm.generate, PROMPTS[1], GREEDY, use_tqdm=False)


def test_an_interrupted_generate_aborts_what_it_still_runs(llm, monkeypatch):
    """Ctrl-C while generate() waits (here: as its first output arrives): the prompts not finished yet are aborted
    and their blocks freed before the interrupt reaches the caller."""
    import minipic_lite.llm as llm_module

    def interrupted(item):
        raise KeyboardInterrupt

    monkeypatch.setattr(llm_module, "_raise_if_error", interrupted)
    short = mp.SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    with pytest.raises(KeyboardInterrupt):
        run_with_timeout(lambda: llm.generate([PROMPTS[4], PROMPTS[5]], [short, LONG], use_tqdm=False))
    assert_idle(llm)
    assert llm.engine.stats.num_aborted >= 1


def test_token_rates_are_the_finished_requests_tokens_over_the_seconds():
    from minipic_lite.llm import token_rates

    assert token_rates(3500, 40, 2.0) == "prompt 1,750 tok/s, generated 20 tok/s"
    assert token_rates(0, 0, 0.0) == "prompt 0 tok/s, generated 0 tok/s"


def test_generate_shows_a_progress_bar_only_when_asked_and_before_its_requests_arrive(llm, monkeypatch, capsys):
    """use_tqdm=False builds no bar at all; with it the bar is built before the requests (their arrival times come
    after it: the caller only waits once they are queued), counts them and closes, also when a prompt is bad."""
    import time

    import minipic_lite.llm as llm_module

    made, real = [], llm_module.tqdm

    def recorded(**kwargs):
        built = time.perf_counter()
        bar = real(**kwargs)
        made.append((built, kwargs, bar))
        return bar

    monkeypatch.setattr(llm_module, "tqdm", recorded)
    rated, real_rates = [], llm_module.token_rates

    def rates(prompt_tokens, new_tokens, seconds):
        rated.append((prompt_tokens, new_tokens, seconds))
        return real_rates(prompt_tokens, new_tokens, seconds)

    monkeypatch.setattr(llm_module, "token_rates", rates)
    run_with_timeout(llm.generate, PROMPTS[:2], GREEDY, use_tqdm=False)
    assert made == []
    start = time.perf_counter()
    outputs = run_with_timeout(lambda: llm.generate(PROMPTS[:2], GREEDY))
    wall = time.perf_counter() - start
    ((built, kwargs, bar),) = made
    assert kwargs == {"total": 2, "desc": "generate", "unit": "req"} and bar.n == 2  # one count per request
    assert all(out.metrics.arrival_time > built for out in outputs)
    assert "2/2" in capsys.readouterr().err
    prompt_tokens, new_tokens, seconds = rated[-1]  # the sums over both finished requests
    assert prompt_tokens == sum(len(out.prompt_token_ids) for out in outputs) and 0 < seconds <= wall
    assert new_tokens == sum(len(out.token_ids) for out in outputs) == 2 * GREEDY.max_tokens
    assert rated[0][:2] in {(len(out.prompt_token_ids), len(out.token_ids)) for out in outputs}  # one, then both
    assert bar.postfix == llm_module.token_rates(*rated[-1])  # as vLLM's bar: the tokens per second so far
    with pytest.raises(TypeError, match="prompt 1"):
        llm.generate([PROMPTS[0], 3.5], GREEDY)
    assert "0/2" in capsys.readouterr().err
    assert_idle(llm)


def test_prompts_and_sampling_params_must_pair_up(llm):
    with pytest.raises(ValueError, match="got 2 prompts but 3 sampling params"):
        llm.generate(PROMPTS[:2], [GREEDY] * 3, use_tqdm=False)
    assert_idle(llm)


def test_async_llm_of_its_own_aborts_by_request_id_and_closes(model_dir):
    """`AsyncLLM(model, ...)` builds its own engine; `await abort(id)` returns once the blocks are free and the
    stream ends with the abort's final output; close() stops the loop."""
    async_llm = run_with_timeout(
        mp.AsyncLLM, str(model_dir), device="cpu", dtype="float32", num_blocks=64, max_model_len=512
    )
    engine = async_llm.llm.engine

    async def main():
        outs = []
        async for out in async_llm.generate(PROMPTS[0], LONG, request_id="stop-me"):
            outs.append(out)
            if len(outs) == 2:
                await async_llm.abort("stop-me")
                assert engine.pool.num_free_blocks == engine.pool.num_blocks  # freed when abort returns
        return outs

    outs = run_with_timeout(asyncio.run, main())
    # NOTE: a step may end between the second output and the abort: its token comes before the final output
    assert not any(o.finished for o in outs[:-1]) and outs[-1].finished and outs[-1].finish_reason == "abort"
    assert len(outs) >= 3 and len(outs[-1].token_ids) < LONG.max_tokens
    assert async_llm.stats()["num_running"] == 0
    run_with_timeout(async_llm.close)
    assert not async_llm.llm._loop._thread.is_alive()
