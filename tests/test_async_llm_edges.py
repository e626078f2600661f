"""Edges of AsyncLLM (async_llm.py) that test_concurrency leaves open, over an engine loop of a stand-in engine (no
model): what generate() asks of its LLM, a generator closed after its LLM was closed, and generate() given a batch."""

import asyncio
import threading
import time

import pytest

from minipic_lite.async_llm import AsyncLLM
from minipic_lite.engine_loop import EngineLoop
from minipic_lite.sampling_params import SamplingParams
from tests.test_engine_loop_edges import CountingEngine, request
from tests.waits import WAIT_S, run_with_timeout


class StubLLM:
    """The part of an LLM that AsyncLLM uses, over a loop of CountingEngine: a request of prompt "n tokens" finishes
    after n steps; it records what make_requests was asked. Its waits on the loop are bounded (tests/waits.py): one
    that hung in a thread of asyncio's executor would hang asyncio.run's shutdown too."""

    def __init__(self):
        self._loop = run_with_timeout(EngineLoop, CountingEngine)
        self.asked = []

    def make_requests(self, prompts, params, stream=False, request_id=None):
        self.asked.append((prompts, params, stream, request_id))
        return [request(request_id or "auto", int(prompts[0].split()[0]))]

    def submit(self, requests, sink) -> None:
        self._loop.submit(requests, sink)

    def abort(self, request_id: str) -> None:
        run_with_timeout(self._loop.abort, request_id)

    def stats(self) -> dict:
        return run_with_timeout(self._loop.call, lambda engine: {"requests": dict(engine.requests)})

    def close(self) -> None:
        run_with_timeout(self._loop.close)


def test_generate_streams_its_request_with_default_params_under_its_id():
    stub = StubLLM()

    async def collect():
        return [out async for out in AsyncLLM.from_llm(stub).generate("3 tokens", request_id="mine")]

    outs = asyncio.run(asyncio.wait_for(collect(), WAIT_S))
    assert stub.asked == [(["3 tokens"], [SamplingParams()], True, "mine")]
    assert [(o.request_id, len(o.token_ids), o.finished) for o in outs] == [
        ("mine", 1, False), ("mine", 2, False), ("mine", 3, True)
    ]  # fmt: skip
    stub.close()


def test_a_consumer_that_leaves_early_aborts_its_request_while_the_event_loop_runs_on():
    """Closing the generator (here at once, as `async with aclosing(...)` does) queues the abort: a server's event loop
    lives on, so the request must not run to its max_tokens (the engine loop's own fallback, a sink that raises,
    comes only once the event loop is closed)."""
    stub = StubLLM()
    async_llm = AsyncLLM.from_llm(stub)

    async def main():
        gen = async_llm.generate(f"{10**9} tokens")
        await anext(gen)
        await gen.aclose()
        return await asyncio.to_thread(async_llm.stats)  # queued after the abort

    assert asyncio.run(asyncio.wait_for(main(), WAIT_S)) == {"requests": {}}
    stub.close()


def test_a_generator_closed_after_its_llm_was_closed_ends_quietly():
    """A consumer that left its `async for` early is closed later (asyncio finalizes the generator); when the LLM was
    closed in between, its request was aborted with the loop: nothing is left to abort, and closing must not raise
    (LLM.stream holds the same rule)."""
    stub = StubLLM()
    async_llm = AsyncLLM.from_llm(stub)

    async def main():
        gen = async_llm.generate("100 tokens")
        first = await anext(gen)
        async_llm.close()
        await gen.aclose()
        return first

    assert not asyncio.run(asyncio.wait_for(main(), WAIT_S)).finished
    assert stub._loop.closed


def test_generate_passes_the_callers_sampling_params_and_wakes_the_event_loop():
    """The given SamplingParams reach make_requests; outputs arrive from the loop thread through the event loop's
    thread-safe wakeup (a plain put_nowait from another thread would leave the task asleep until the event loop's
    next timer)."""
    stub = StubLLM()
    params = SamplingParams(max_tokens=7, temperature=0.0)

    async def collect():
        return [out async for out in AsyncLLM.from_llm(stub).generate("2 tokens", params, request_id="p")]

    start = time.monotonic()
    outs = asyncio.run(asyncio.wait_for(collect(), WAIT_S))
    assert time.monotonic() - start < WAIT_S / 2, "the event loop slept until its next timer"
    assert stub.asked == [(["2 tokens"], [params], True, "p")]
    assert [o.finished for o in outs] == [False, True]
    stub.close()


def test_a_failed_step_is_raised_in_the_consumer():
    """A step that raises reaches the task as that exception, not as an output."""
    stub = StubLLM()

    def failing_step():
        raise RuntimeError("injected")

    stub._loop.engine.step = failing_step

    async def main():
        async for _ in AsyncLLM.from_llm(stub).generate("3 tokens"):
            pass

    with pytest.raises(RuntimeError, match="^injected$"):
        asyncio.run(asyncio.wait_for(main(), WAIT_S))
    stub.close()


def test_a_consumer_that_leaves_does_not_wait_for_the_engine_loop():
    """Closing the generator queues its abort without waiting: while the engine loop is busy, aclose() returns at
    once (waiting there would block the event loop until the loop is free)."""
    stub = StubLLM()
    async_llm = AsyncLLM.from_llm(stub)
    gate, released = threading.Event(), []

    async def main():
        gen = async_llm.generate(f"{10**9} tokens")
        await anext(gen)
        stub._loop.call(lambda e: released.append(gate.wait(WAIT_S)), wait=False)
        await gen.aclose()
        gate.set()
        return await asyncio.to_thread(async_llm.stats)

    assert asyncio.run(asyncio.wait_for(main(), WAIT_S)) == {"requests": {}}
    assert released == [True], "aclose() waited for the busy engine loop"
    stub.close()


def test_abort_returns_only_once_the_loop_has_freed_the_request():
    """`await abort(id)` waits for the engine loop: while the loop is busy the abort is not done; when it is, the
    engine holds no request and the stream ends with the "abort" output."""
    stub = StubLLM()
    async_llm = AsyncLLM.from_llm(stub)
    engine = stub._loop.engine
    gate = threading.Event()

    async def main():
        gen = async_llm.generate(f"{10**9} tokens", request_id="stop-me")
        await anext(gen)
        stub._loop.call(lambda e: gate.wait(WAIT_S), wait=False)
        task = asyncio.create_task(async_llm.abort("stop-me"))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        done_while_busy = task.done()
        gate.set()
        await asyncio.wait_for(task, WAIT_S)
        freed = "stop-me" not in engine.requests
        rest = [out async for out in gen]
        return done_while_busy, freed, rest[-1]

    done_while_busy, freed, last = asyncio.run(asyncio.wait_for(main(), WAIT_S))
    assert not done_while_busy and freed and last.finished and last.finish_reason == "abort"
    stub.close()


def test_an_async_llm_of_its_own_builds_its_llm_from_the_given_model_and_keywords(monkeypatch):
    """`AsyncLLM(model, **kw)` is `LLM(model, **kw)` underneath (recorded here instead of building an engine)."""
    import minipic_lite.async_llm as async_llm_module

    built = []
    monkeypatch.setattr(async_llm_module, "LLM", lambda model, **kwargs: built.append((model, kwargs)) or "the llm")
    assert AsyncLLM("some/model", device="cpu", num_blocks=8).llm == "the llm"
    assert built == [("some/model", {"device": "cpu", "num_blocks": 8})]


def test_generate_given_a_batch_says_it_takes_one_prompt_before_asking_the_llm():
    stub = StubLLM()

    async def first():
        return await anext(AsyncLLM.from_llm(stub).generate(["3 tokens", "2 tokens"]))

    with pytest.raises(TypeError, match=r"AsyncLLM.generate\(\) takes one prompt, got a list of 2 prompts"):
        asyncio.run(asyncio.wait_for(first(), WAIT_S))
    assert stub.asked == []
    stub.close()
