"""One background thread owns the engine; callers submit requests and read only their own outputs.

    caller threads / asyncio tasks                       the loop thread
    ------------------------------                       ---------------------------------------------
    validate + hash (caller's thread)  --submit-->   inbox  --> engine.add; engine.step(); route outputs
    read own queue  <------------------------------  sink(output)   by request id, to that request's sink
    abort(request_id)  --------------------------->  inbox  --> engine.abort: blocks freed, final output

No caller holds a lock across a model step: the loop alone calls the engine, and it takes the inbox between
steps. The loop thread also builds the engine, so every torch op of the engine runs on one thread: on the CPU each
thread that runs torch ops keeps an OpenMP pool, and two pools on one machine throttle each other (libgomp stops
spinning once it manages more threads than cores: SmolLM2 decoded at two thirds of the speed on 2 cores). The
pools of other threads are let go (`release_openmp_threads`): a caller's as it hands the loop work, the loop's own
whenever it waits for some, so the caller's torch work between calls runs at full speed too.
On CUDA the loop thread runs torch with one intra-op thread once the engine is built (`fewer_cpu_threads`).
A sink is a callable that takes a `RequestOutput` (or the exception of a failed step); it must not block.
A sink that raises (its consumer is gone) aborts its request.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future

import torch

from minipic_lite.cpu_threads import ThreadGovernor
from minipic_lite.engine import LLMEngine
from minipic_lite.models import native
from minipic_lite.outputs import RequestOutput
from minipic_lite.request import ParentRequest, Request

logger = logging.getLogger(__name__)
Sink = Callable[[RequestOutput | BaseException], object]


def fewer_cpu_threads(device: torch.device) -> None:
    """A CUDA engine's host work is Python and kernel launches: torch's CPU thread pool has nothing to do but
    spin beside it. One intra-op thread (vLLM takes the same step): the H200's cached 8 x 2048 TTFT 10.6 -> 9.3 ms,
    bench/results/ttft_spans-{05fac4e-cuda,a1a391f-cuda-omp1}.json (OMP_NUM_THREADS=1 for the whole process there).
    Set OMP_NUM_THREADS to keep a count of your own."""
    current = torch.get_num_threads()
    if device.type == "cuda" and "OMP_NUM_THREADS" not in os.environ and current > 1:
        logger.warning("torch intra-op threads %d -> 1 for the CUDA engine's host work (avoids CPU contention); set "
                       "OMP_NUM_THREADS to choose", current)  # fmt: skip
        torch.set_num_threads(1)


@functools.cache
def _pause_openmp() -> Callable[[int], int] | None:
    """libgomp's `omp_pause_resource_all` where torch runs on libgomp (there it frees the calling thread's pool
    alone), else None: LLVM's and Intel's runtimes pause as a whole."""
    path = native.libgomp_path()
    return getattr(ctypes.CDLL(path), "omp_pause_resource_all", None) if path else None  # NOTE: GCC 9+


def release_openmp_threads() -> bool:
    """Let this thread's idle OpenMP pool go (its next torch op starts a new one, a thread start or two): libgomp
    counts every thread pool of the process, and once they hold more threads than cores each spin-waits at most
    100 turns between parallel regions instead of 300,000, so an idle pool beside a busy one slows the busy one's
    many small regions (`docs/CPU.md`, "One OpenMP pool"). True if a pool could be let go (none inside a parallel
    region)."""
    pause = _pause_openmp()
    return pause is not None and pause(1) == 0  # NOTE: 1 = omp_pause_soft


class EngineLoop:
    def __init__(self, build: Callable[[], LLMEngine]):
        """Start the loop thread and build the engine on it with `build()`; its error is raised here."""
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()  # callables run on the loop thread, in order
        self._sinks: dict[str, Sink] = {}  # requests submitted through the loop and not finished
        self._closed = False
        built: Future = Future()
        self._thread = threading.Thread(target=self._run, args=(build, built), name="minipic-engine-loop", daemon=True)
        self._thread.start()
        release_openmp_threads()  # NOTE: the caller's own pool, if any, while the loop builds
        self.engine: LLMEngine = built.result()

    # -- from any thread ---------------------------------------------------------------------------------

    def submit(self, requests: list[Request | ParentRequest], sink: Sink) -> None:
        """Queue validated requests; every output of theirs goes to `sink` (one sink may serve a batch)."""
        self._put(lambda: self._add(requests, sink))

    def call(self, fn: Callable[[LLMEngine], object], wait: bool = True):
        """Run `fn(engine)` on the loop thread between two steps; its result, or its error raised here (None
        without `wait`, or called from the loop thread itself: then an error is logged, the loop serving on)."""
        future: Future = Future()
        waited = wait and threading.current_thread() is not self._thread

        def run() -> None:
            try:
                future.set_result(fn(self.engine))
            except Exception as e:
                future.set_exception(e)
                if not waited:
                    raise  # NOTE: nobody reads the future: `_take_inbox` logs it

        self._put(run)
        return future.result() if waited else None

    def abort(self, request_id: str, wait: bool = True, only: Request | ParentRequest | None = None) -> None:
        """Finish a request now: its blocks are freed and its sink gets a final output ("abort"). `only`: abort the
        request under that id only if it is this one (a caller cleaning up its own, whose id may have been refused)."""
        self.call(lambda engine: self._abort(request_id, only), wait)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self, timeout: float | None = None) -> None:
        """Stop the loop thread (requests in flight are aborted) once its current step ends; wait for it at most
        `timeout` seconds (None: as long as it takes), then leave it to finish on its own. Safe to call twice."""
        if not self._closed:
            self._closed = True
            self._inbox.put(None)
            if threading.current_thread() is not self._thread:
                self._thread.join(timeout)
                if self._thread.is_alive():
                    logger.warning(
                        "the engine loop's step still runs after %.0f s; it stops when that step ends", timeout
                    )

    def _put(self, item) -> None:
        if self._closed:
            raise RuntimeError("the engine loop is closed")
        if threading.current_thread() is not self._thread:
            release_openmp_threads()  # NOTE: the caller's pool, idle while the loop serves it
        self._inbox.put(item)

    # -- on the loop thread ------------------------------------------------------------------------------

    def _run(self, build: Callable[[], LLMEngine], built: Future) -> None:
        try:
            self.engine = build()
        except BaseException as e:
            self._closed = True
            built.set_exception(e)
            return
        fewer_cpu_threads(self.engine.runner.device)  # NOTE: after the build: loading weights keeps every thread
        self._governor = ThreadGovernor.for_device(self.engine.runner.device)
        built.set_result(self.engine)
        del build, built  # NOTE: the thread lives as long as the engine: hold nothing else
        try:
            while self._take_inbox(block=not self._sinks):
                if self._sinks:
                    self._step()
        except Exception as e:  # NOTE: the loop's own code failed (a step's or a call's error never gets here)
            self._stop_on_fault(e)
            return
        for request_id in list(self._sinks):
            self._abort(request_id)

    def _stop_on_fault(self, error: Exception) -> None:
        """Stop serving, and leave no caller waiting: the calls queued run (their callers get a result or an error),
        then every request in flight gets `error`. New work is refused: the loop is closed."""
        logger.exception("engine loop: an internal error; it stops serving")
        self._closed = True
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                with contextlib.suppress(Exception):
                    item()
        self._fail_sinks(error)

    def _take_inbox(self, block: bool) -> bool:
        """Run what callers queued (waiting for something when idle); False once closed."""
        if block and self._inbox.empty():
            release_openmp_threads()  # NOTE: idle: the loop's pool would slow the callers' own torch work
            if self._governor is not None:
                self._governor.idle()
        try:
            item = self._inbox.get(block=block)
        except queue.Empty:
            return True
        while item is not None:
            try:
                item()
            except Exception:  # a caller's callable failed: log it and keep serving everyone else
                logger.exception("engine loop: a queued call failed")
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return True
        return False

    def _add(self, requests: list[Request | ParentRequest], sink: Sink) -> None:
        for req in requests:
            try:
                self.engine.add(req)
            except ValueError as e:  # a request id already in flight
                with contextlib.suppress(Exception):  # NOTE: a consumer that is gone stops none of the batch's others
                    sink(e)
            else:
                self._sinks[req.request_id] = sink

    def _abort(self, request_id: str, only: Request | ParentRequest | None = None) -> None:
        output = self.engine.abort(request_id, only)
        if output is not None:
            self._deliver(output)

    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except Exception as e:
            self._fail_all(e)
            return
        for output in outputs:
            self._deliver(output)
        if self._governor is not None:
            self._governor.after_step()

    def _deliver(self, output: RequestOutput) -> None:
        sink = self._sinks.pop(output.request_id) if output.finished else self._sinks.get(output.request_id)
        if sink is None:
            return  # a request added to the engine directly, not through the loop
        try:
            sink(output)
        except Exception:  # the consumer is gone (e.g. its event loop closed): stop computing for it
            if not output.finished:
                self._abort(output.request_id)

    def _fail_all(self, error: Exception) -> None:
        """A step raised: every request in flight gets the error and is aborted; the loop keeps serving."""
        logger.exception("engine step failed; aborting %d requests", len(self._sinks))
        # NOTE: the failed step may have published blocks whose K/V it never wrote: forget every hash.
        self.engine.kv.reset_prefix_cache()
        self._fail_sinks(error)

    def _fail_sinks(self, error: Exception) -> None:
        """Every request in flight is aborted and its sink gets `error`."""
        for request_id, sink in list(self._sinks.items()):
            self._sinks.pop(request_id, None)
            # NOTE: a consumer that is gone (its sink raises) must not stop the others from getting the error
            with contextlib.suppress(Exception):
                self.engine.abort(request_id)
            with contextlib.suppress(Exception):
                sink(error)
