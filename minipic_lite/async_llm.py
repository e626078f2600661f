"""`AsyncLLM`: the engine for asyncio code (a web server, the Gradio app), in the spirit of vLLM's AsyncLLM.

    async for out in llm.generate(prompt, params, request_id="r1"):   # an output after every step
        ...
    await llm.abort("r1")                                             # or leave the loop: aborted too

It shares the background loop of an `LLM` (engine_loop.py); outputs reach the task's own asyncio queue
through `call_soon_threadsafe`, so the event loop never blocks on a model step.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from minipic_lite.llm import LLM, PromptType, _raise_if_error, check_one_prompt, is_last
from minipic_lite.outputs import RequestOutput
from minipic_lite.sampling_params import SamplingParams


class AsyncLLM:
    """`AsyncLLM(model=None, **LLM keywords)`, or `AsyncLLM.from_llm(llm)` to share an existing engine."""

    def __init__(self, model=None, **kwargs):
        self.llm = LLM(model, **kwargs)

    @classmethod
    def from_llm(cls, llm: LLM) -> AsyncLLM:
        self = cls.__new__(cls)
        self.llm = llm
        return self

    async def generate(
        self, prompt: PromptType, sampling_params: SamplingParams | None = None, request_id: str | None = None
    ) -> AsyncIterator[RequestOutput]:
        """Yield the request's output after every step (text so far); the last one has finished=True."""
        check_one_prompt(prompt, "AsyncLLM.generate()")
        (req,) = self.llm.make_requests([prompt], [sampling_params or SamplingParams()], True, request_id)
        loop = asyncio.get_running_loop()
        outputs: asyncio.Queue = asyncio.Queue()
        self.llm.submit([req], lambda out: loop.call_soon_threadsafe(outputs.put_nowait, out))
        finished = False
        try:
            while not finished:
                item = await outputs.get()
                finished = is_last(item)
                yield _raise_if_error(item)
        finally:
            # NOTE: cancelled, or the consumer left: free the request's blocks (no waiting here). A generator closed
            # after its LLM was (asyncio finalizes it later) has nothing left to free: close() aborted it
            if not finished and not self.llm._loop.closed:
                self.llm._loop.abort(req.request_id, wait=False, only=req)

    async def abort(self, request_id: str) -> None:
        """Cancel a request; its blocks are free when this returns, and its consumer gets a final output."""
        await asyncio.to_thread(self.llm.abort, request_id)

    def stats(self) -> dict:
        return self.llm.stats()

    def close(self) -> None:
        self.llm.close()
