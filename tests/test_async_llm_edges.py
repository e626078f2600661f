"""Edges of AsyncLLM (async_llm.py) that test_concurrency leaves open, over an engine loop of a stand-in engine (no
model): a generator closed after its LLM was closed."""

import asyncio

from minipic_lite.async_llm import AsyncLLM
from minipic_lite.engine_loop import EngineLoop
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

    def close(self) -> None:
        self._loop.close()


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
