"""Edges of AsyncLLM (async_llm.py) that test_concurrency leaves open, over an engine loop of a stand-in engine (no
model): what generate() asks of its LLM, and a generator closed after its LLM was closed."""

import asyncio

from minipic_lite.async_llm import AsyncLLM
from minipic_lite.engine_loop import EngineLoop
from minipic_lite.sampling_params import SamplingParams
from tests.test_engine_loop_edges import CountingEngine, request


class StubLLM:
    """The part of an LLM that AsyncLLM uses, over a loop of CountingEngine: a request of prompt "n tokens" finishes
    after n steps; it records what make_requests was asked."""

    def __init__(self):
        self._loop = EngineLoop(CountingEngine)
        self.asked = []

    def make_requests(self, prompts, params, stream=False, request_id=None):
        self.asked.append((prompts, params, stream, request_id))
        return [request(request_id or "auto", int(prompts[0].split()[0]))]

    def submit(self, requests, sink) -> None:
        self._loop.submit(requests, sink)

    def abort(self, request_id: str) -> None:
        self._loop.abort(request_id)

    def stats(self) -> dict:
        return self._loop.call(lambda engine: {"requests": dict(engine.requests)})

    def close(self) -> None:
        self._loop.close()


def test_generate_streams_its_request_with_default_params_under_its_id():
    stub = StubLLM()

    async def collect():
        return [out async for out in AsyncLLM.from_llm(stub).generate("3 tokens", request_id="mine")]

    outs = asyncio.run(collect())
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

    assert asyncio.run(main()) == {"requests": {}}
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

    assert not asyncio.run(main()).finished
    assert stub._loop.closed
