"""Edges of the engine loop (engine_loop.py) that test_concurrency leaves open, on a stand-in engine (no model): a
call made on the loop thread does not wait for itself, a finished request leaves no sink behind, an idle loop runs
no step, and close() from the loop thread returns."""

import gc
import threading
import time
from types import SimpleNamespace

import pytest
import torch

from minipic_lite.config import LOOP_EXIT_WAIT_S
from minipic_lite.engine_loop import EngineLoop, fewer_cpu_threads
from minipic_lite.outputs import RequestMetrics, RequestOutput
from tests.conftest import save_tiny_llama
from tests.waits import WAIT_S, run_with_timeout


def output(request_id: str, num_tokens: int, finish_reason: str | None) -> RequestOutput:
    return RequestOutput(request_id, None, [1], "", [7] * num_tokens, 0, finish_reason is not None, finish_reason,
                         RequestMetrics(0.0))  # fmt: skip


class CountingEngine:
    """Stands in for LLMEngine on the loop: a step gives every request one token (streamed), a request finishes at
    its `max_tokens`; it counts its steps and its prefix-cache resets."""

    def __init__(self):
        self.runner = SimpleNamespace(device=torch.device("cpu"))
        self.kv = SimpleNamespace(reset_prefix_cache=self._reset)
        self.requests: dict[str, list[int]] = {}  # id -> [tokens so far, max_tokens]
        self.num_steps = self.num_resets = 0

    def _reset(self) -> None:
        self.num_resets += 1

    def add(self, req) -> None:
        if req.request_id in self.requests:
            raise ValueError(f"request id {req.request_id!r} is already in use")
        self.requests[req.request_id] = [0, req.max_tokens]

    def step(self) -> list[RequestOutput]:
        self.num_steps += 1
        outputs = []
        for request_id, progress in list(self.requests.items()):
            progress[0] += 1
            done = progress[0] == progress[1]
            if done:
                del self.requests[request_id]
            outputs.append(output(request_id, progress[0], "length" if done else None))
        return outputs

    def abort(self, request_id: str, only=None) -> RequestOutput | None:  # NOTE: one request per id here
        progress = self.requests.pop(request_id, None)
        return None if progress is None else output(request_id, progress[0], "abort")


def request(request_id: str, max_tokens: int) -> SimpleNamespace:
    return SimpleNamespace(request_id=request_id, max_tokens=max_tokens)


def run(loop: EngineLoop, max_tokens: int = 3) -> list[RequestOutput]:
    """One request through the loop to its final output."""
    outs, done = [], threading.Event()

    def sink(out):
        outs.append(out)
        if out.finished:
            done.set()

    loop.submit([request("r", max_tokens)], sink)
    assert done.wait(WAIT_S), "the request never finished"
    return outs


def test_a_cuda_engine_already_on_one_torch_thread_is_left_alone(monkeypatch, caplog):
    """Nothing to lower: no set_num_threads call and no warning."""
    calls = []
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    with caplog.at_level("WARNING", logger="minipic_lite.engine_loop"):
        fewer_cpu_threads(torch.device("cuda"))
    assert calls == [] and caplog.records == []


def test_a_cuda_engine_on_two_torch_threads_drops_to_one(monkeypatch):
    """Any count above one is lowered, two included (a two-core machine's default)."""
    calls = []
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    fewer_cpu_threads(torch.device("cuda"))
    assert calls == [1]


def test_the_loop_thread_of_a_cuda_engine_drops_to_one_torch_thread_once_the_engine_is_built(monkeypatch):
    """The loop calls fewer_cpu_threads on its own thread after the build (loading weights keeps every thread)."""
    events = []
    monkeypatch.setattr(torch, "get_num_threads", lambda: 16)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: events.append((n, threading.current_thread())))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)

    def build():
        events.append("built")
        engine = CountingEngine()
        engine.runner.device = torch.device("cuda")
        return engine

    loop = run_with_timeout(EngineLoop, build)
    assert events == ["built", (1, loop._thread)]
    run_with_timeout(loop.close)


def test_a_call_made_on_the_loop_thread_runs_after_it_instead_of_waiting_for_itself():
    """A function run by the loop that calls the loop (a sink aborting, say) gets None back at once; what it queued
    runs next. Waiting there would wait on the loop's own thread forever."""
    loop = run_with_timeout(EngineLoop, CountingEngine)
    order, inner_ran = [], threading.Event()

    def inner(engine):
        order.append("inner")
        inner_ran.set()
        return "inner result"

    def outer(engine):
        order.append(("outer got", loop.call(inner)))

    loop.call(outer, wait=False)
    assert inner_ran.wait(WAIT_S), "the loop waited on itself"
    assert order == [("outer got", None), "inner"]
    run_with_timeout(loop.close)


def test_aborting_a_request_that_is_not_in_flight_is_a_no_op():
    """An abort that comes after its request finished (a UI's cancel racing the last token): nothing to deliver."""
    loop = run_with_timeout(EngineLoop, CountingEngine)
    run(loop)
    assert run_with_timeout(loop.abort, "r") is None and run_with_timeout(loop.abort, "never-submitted") is None
    run_with_timeout(loop.close)


def test_a_finished_request_leaves_no_sink_and_the_idle_loop_runs_no_step():
    engine = CountingEngine()
    loop = run_with_timeout(EngineLoop, lambda: engine)
    outs = run(loop, max_tokens=3)
    assert [(len(o.token_ids), o.finished) for o in outs] == [(1, False), (2, False), (3, True)]
    assert run_with_timeout(loop.call, lambda e: dict(loop._sinks)) == {}
    num_steps = engine.num_steps
    assert num_steps == 3
    threading.Event().wait(0.05)  # idle: the loop blocks on its inbox
    assert run_with_timeout(loop.call, lambda e: e.num_steps) == num_steps
    run_with_timeout(loop.close)


def test_outputs_of_a_request_added_to_the_engine_directly_are_skipped_and_it_runs_on():
    """The loop routes only its own requests' outputs: one that a caller added to the engine itself (say, a benchmark)
    streams nowhere and is not taken for a request whose consumer left."""
    engine = CountingEngine()
    loop = run_with_timeout(EngineLoop, lambda: engine)
    run_with_timeout(loop.call, lambda e: e.add(request("direct", 10)))
    run(loop, max_tokens=3)
    assert run_with_timeout(loop.call, lambda e: dict(e.requests)) == {"direct": [3, 10]}
    run_with_timeout(loop.close)


def test_an_idle_loop_waits_on_its_inbox_without_spinning():
    """With nothing in flight the loop blocks on its inbox: a loop that polled it would burn a core (its thread's
    CPU time over 0.3 s of idling would be about 0.3 s; other threads of the test process are not counted)."""
    loop = run_with_timeout(EngineLoop, CountingEngine)
    run(loop)
    clock = time.pthread_getcpuclockid(loop._thread.ident)
    cpu_before = time.clock_gettime(clock)
    time.sleep(0.3)
    assert time.clock_gettime(clock) - cpu_before < 0.1
    run_with_timeout(loop.close)


def test_a_failed_step_leaves_no_sink_and_the_idle_loop_runs_no_step():
    engine = CountingEngine()

    def failing_step():
        engine.num_steps += 1
        raise RuntimeError("injected")

    engine.step = failing_step
    loop = run_with_timeout(EngineLoop, lambda: engine)
    got, done = [], threading.Event()
    loop.submit([request("a", 5), request("b", 5)], lambda out: got.append(out) or done.set())
    assert done.wait(WAIT_S)
    state = run_with_timeout(loop.call, lambda e: (dict(loop._sinks), dict(e.requests), e.num_steps, e.num_resets))
    assert state == ({}, {}, 1, 1)
    assert [str(e) for e in got] == ["injected", "injected"]
    run_with_timeout(loop.close)


def test_a_failed_step_whose_consumer_is_gone_reaches_the_others_and_the_loop_serves_on():
    """A step raises while a consumer is gone (its sink raises, e.g. an AsyncLLM whose event loop closed): the others
    still get the error and the loop keeps serving. Before, that sink's error ended the loop thread: the requests after
    it were never aborted and every later call waited forever."""
    engine = CountingEngine()

    def failing_step():
        raise RuntimeError("injected")

    engine.step = failing_step
    loop = run_with_timeout(EngineLoop, lambda: engine)
    got, done = [], threading.Event()

    def gone(out):
        raise RuntimeError("consumer gone")

    loop.submit([request("gone", 5)], gone)
    loop.submit([request("here", 5)], lambda out: got.append(out) or done.set())
    assert done.wait(WAIT_S) and [str(e) for e in got] == ["injected"]
    assert run_with_timeout(loop.call, lambda e: dict(e.requests)) == {}, "the loop stopped serving"
    run_with_timeout(loop.close)


def test_close_from_the_loop_thread_returns_and_the_loop_ends():
    """close() in a function the loop runs (an LLM collected on the loop thread closes its loop there): it returns
    instead of joining its own thread, and the loop ends once that function returns."""
    loop = run_with_timeout(EngineLoop, CountingEngine)
    assert run_with_timeout(loop.call, lambda engine: loop.close()) is None
    loop._thread.join(WAIT_S)
    assert loop.closed and not loop._thread.is_alive()


def test_a_closed_loop_refuses_new_work_instead_of_queueing_it_to_nobody():
    """After close() submit, call and abort raise at once: nothing serves the inbox any more, so a queued call would
    wait forever."""
    loop = run_with_timeout(EngineLoop, CountingEngine)
    run_with_timeout(loop.close)
    run_with_timeout(loop.close)  # safe twice
    for attempt in (lambda: loop.submit([request("late", 3)], print), lambda: loop.call(lambda e: 1),
                    lambda: loop.abort("late")):  # fmt: skip
        with pytest.raises(RuntimeError, match="^the engine loop is closed$"):
            run_with_timeout(attempt)


def test_close_aborts_the_requests_in_flight_before_it_returns():
    """close() with a request still running waits for the loop (busy here until a gate opens): by the time close()
    returns, its sink has the final "abort" output, the engine holds no request and the loop thread has ended."""
    engine = CountingEngine()
    loop = run_with_timeout(EngineLoop, lambda: engine)
    outs, first, gate, seen = [], threading.Event(), threading.Event(), []
    loop.submit([request("r", 10**9)], lambda out: outs.append(out) or first.set())
    assert first.wait(WAIT_S)
    loop.call(lambda e: gate.wait(WAIT_S), wait=False)

    def close():
        loop.close()
        seen.append((loop._thread.is_alive(), dict(engine.requests), outs[-1].finish_reason))

    closer = threading.Thread(target=close, daemon=True)
    closer.start()
    closer.join(0.2)
    gate.set()
    closer.join(WAIT_S)
    assert not closer.is_alive(), "close() never returned"
    assert seen == [(False, {}, "abort")]


def test_close_with_a_timeout_returns_while_a_step_still_runs_and_the_loop_ends_after_it(caplog):
    """close(timeout) (an LLM dropped, or left at exit) waits that long for a step that does not end, warns, and
    returns; the loop still stops once the step ends, with the request aborted."""
    engine = CountingEngine()
    loop = run_with_timeout(EngineLoop, lambda: engine)
    outs, first, gate = [], threading.Event(), threading.Event()
    loop.submit([request("r", 10**9)], lambda out: outs.append(out) or first.set())
    assert first.wait(WAIT_S)
    loop.call(lambda e: gate.wait(WAIT_S), wait=False)  # the loop is stuck until the gate opens
    with caplog.at_level("WARNING", logger="minipic_lite.engine_loop"):
        start = time.perf_counter()
        run_with_timeout(loop.close, 0.2)
        waited = time.perf_counter() - start
    assert 0.2 <= waited < WAIT_S / 2 and loop._thread.is_alive() and loop.closed
    assert "the engine loop's step still runs after 0 s; it stops when that step ends" in caplog.text
    gate.set()
    loop._thread.join(WAIT_S)
    assert not loop._thread.is_alive() and outs[-1].finish_reason == "abort" and engine.requests == {}


def test_a_dropped_llm_closes_its_loop_with_a_bounded_wait(tmp_path, monkeypatch):
    """An LLM's finalizer (it runs when the LLM is collected, or at the interpreter's exit) closes the loop with
    LOOP_EXIT_WAIT_S: a stuck step cannot hang the exit. An explicit close() waits as long as the step takes."""
    import minipic_lite as mp

    timeouts, close = [], EngineLoop.close
    monkeypatch.setattr(
        EngineLoop, "close", lambda self, timeout=None: timeouts.append(timeout) or close(self, timeout)
    )
    kept = mp.LLM(str(save_tiny_llama(tmp_path / "tiny")), device="cpu", max_model_len=64)
    kept.close()
    dropped = mp.LLM(str(tmp_path / "tiny"), device="cpu", max_model_len=64)
    loop = dropped._loop
    del dropped
    gc.collect()
    assert timeouts == [None, LOOP_EXIT_WAIT_S] and loop.closed and not loop._thread.is_alive()


def test_a_fault_of_the_loops_own_code_reaches_every_caller_and_closes_the_loop(caplog):
    """An error raised outside a step and outside a caller's call (here: delivering an output) ends the loop thread:
    the request in flight gets the error, a call queued behind the fault still runs, and new work is refused, where
    before the thread died silently and every caller waited forever."""
    engine = CountingEngine()
    loop = run_with_timeout(EngineLoop, lambda: engine)
    got = []
    queued = threading.Thread(target=lambda: got.append(loop.call(lambda e: "ran")), daemon=True)

    def fault(output):
        queued.start()  # a caller's call, queued while the loop is in the middle of its step
        deadline = time.monotonic() + WAIT_S
        while loop._inbox.empty() and time.monotonic() < deadline:
            time.sleep(0.001)
        raise RuntimeError("boom in the loop")

    loop._deliver = fault
    with caplog.at_level("ERROR", logger="minipic_lite.engine_loop"):
        loop.submit([request("r", 5)], got.append)
        loop._thread.join(WAIT_S)
        queued.join(WAIT_S)
    assert not loop._thread.is_alive() and not queued.is_alive() and loop.closed
    assert sorted(type(x).__name__ if isinstance(x, Exception) else x for x in got) == ["RuntimeError", "ran"]
    assert engine.requests == {} and "engine loop: an internal error; it stops serving" in caplog.text
    with pytest.raises(RuntimeError, match="^the engine loop is closed$"):
        loop.submit([request("late", 3)], print)


def test_a_failing_call_nobody_waits_for_is_logged_and_the_loop_serves_on(caplog):
    """call(fn, wait=False) whose fn raises: the error is logged (nobody reads it otherwise) and the next call runs;
    with wait=True the same error reaches the caller instead, and is not logged."""
    loop = run_with_timeout(EngineLoop, CountingEngine)

    def broken(engine):
        raise KeyError("injected")

    with caplog.at_level("ERROR", logger="minipic_lite.engine_loop"):
        with pytest.raises(KeyError, match="injected"):
            run_with_timeout(loop.call, broken)
        assert [r for r in caplog.records if "a queued call failed" in r.getMessage()] == []
        loop.call(broken, wait=False)
        assert run_with_timeout(loop.call, lambda e: "served") == "served", "the loop stopped serving"
    (record,) = [r for r in caplog.records if "a queued call failed" in r.getMessage()]
    assert isinstance(record.exc_info[1], KeyError)
    run_with_timeout(loop.close)


def test_work_queued_during_a_step_is_all_taken_before_the_next_step():
    """Two submits that arrive while the loop is busy join the same next step: both requests of 2 tokens finish
    after 2 steps, not 3."""
    engine = CountingEngine()
    loop = run_with_timeout(EngineLoop, lambda: engine)
    gate, done = threading.Event(), threading.Semaphore(0)
    loop.call(lambda e: gate.wait(WAIT_S), wait=False)  # the loop is busy until the gate opens
    finished = []

    def sink(out):
        if out.finished:
            finished.append(out.request_id)
            done.release()

    loop.submit([request("a", 2)], sink)
    loop.submit([request("b", 2)], sink)
    gate.set()
    assert done.acquire(timeout=WAIT_S) and done.acquire(timeout=WAIT_S)
    assert sorted(finished) == ["a", "b"] and run_with_timeout(loop.call, lambda e: e.num_steps) == 2
    run_with_timeout(loop.close)


def test_a_duplicate_request_id_gets_the_error_and_leaves_the_first_request_its_sink():
    """Submitting a batch whose first id is already in flight: that batch's sink gets the engine's ValueError for it,
    the rest of the batch still runs, and every output of the request in flight still goes to its own sink."""
    loop = run_with_timeout(EngineLoop, CountingEngine)
    gate = threading.Event()
    loop.call(lambda e: gate.wait(WAIT_S), wait=False)
    first, second, done = [], [], threading.Semaphore(0)
    loop.submit([request("r", 3)], lambda out: first.append(out) or (out.finished and done.release()))
    loop.submit([request("r", 3), request("s", 2)],
                lambda out: second.append(out) or (getattr(out, "finished", False) and done.release()))  # fmt: skip
    gate.set()
    assert done.acquire(timeout=WAIT_S) and done.acquire(timeout=WAIT_S), "a request never finished"
    assert run_with_timeout(loop.call, lambda e: dict(loop._sinks)) == {}
    assert isinstance(second[0], ValueError) and "already in use" in str(second[0])
    assert [(o.request_id, len(o.token_ids), o.finished) for o in second[1:]] == [("s", 1, False), ("s", 2, True)]
    assert [(len(o.token_ids), o.finished) for o in first] == [(1, False), (2, False), (3, True)]
    run_with_timeout(loop.close)


def test_a_sink_that_raises_on_a_refused_request_leaves_the_rest_of_its_batch_running():
    """The batch's first id is in flight; its sink raises on that error (its consumer is gone): the batch's next
    request is still added and runs to its end."""
    loop = run_with_timeout(EngineLoop, CountingEngine)
    gate = threading.Event()
    loop.call(lambda e: gate.wait(WAIT_S), wait=False)
    outs, done = [], threading.Event()

    def sink(out):
        if isinstance(out, ValueError):
            raise RuntimeError("consumer gone")
        outs.append(out)
        if out.finished and out.request_id == "s":
            done.set()

    loop.submit([request("r", 3)], lambda out: None)
    loop.submit([request("r", 3), request("s", 2)], sink)
    gate.set()
    assert done.wait(WAIT_S), "the batch's second request was never added"
    assert [(o.request_id, o.finished) for o in outs if o.request_id == "s"] == [("s", False), ("s", True)]
    run_with_timeout(loop.close)


def test_abort_returns_once_its_request_is_freed_and_its_sink_has_the_final_output():
    """abort() waits for the loop: while the loop is busy it does not return; once it returns the engine holds no
    request and the sink got the "abort" output (the request had run 1 step)."""
    engine = CountingEngine()
    loop = run_with_timeout(EngineLoop, lambda: engine)
    outs, first = [], threading.Event()
    loop.submit([request("r", 10**9)], lambda out: outs.append(out) or first.set())
    assert first.wait(WAIT_S)
    gate = threading.Event()
    loop.call(lambda e: gate.wait(WAIT_S), wait=False)
    returned = threading.Event()
    aborter = threading.Thread(target=lambda: loop.abort("r") or returned.set(), daemon=True)
    aborter.start()
    assert not returned.wait(0.2), "abort returned before the loop ran it"
    gate.set()
    assert returned.wait(WAIT_S)
    assert "r" not in engine.requests
    assert outs[-1].finished and outs[-1].finish_reason == "abort"
    run_with_timeout(loop.close)


def test_a_sink_that_raises_aborts_its_request_at_once():
    """A consumer that is gone (its sink raises on the first token): the request is aborted there instead of running
    to its max_tokens, and the loop goes idle."""
    engine = CountingEngine()
    loop = run_with_timeout(EngineLoop, lambda: engine)
    calls, aborted = [], threading.Event()

    def gone(out):
        calls.append(out)
        if out.finished:
            aborted.set()
        raise RuntimeError("consumer gone")

    loop.submit([request("gone", 1000)], gone)  # NOTE: bounded: run on, it would end "length" (and fail) at once
    assert aborted.wait(WAIT_S)
    assert run_with_timeout(loop.call, lambda e: (dict(e.requests), dict(loop._sinks), e.num_steps)) == ({}, {}, 1)
    assert [(o.finished, o.finish_reason) for o in calls] == [(False, None), (True, "abort")]
    run_with_timeout(loop.close)


def test_a_failed_step_keeps_the_loop_serving():
    """After a step raised (every request got the error) a later call still runs (under the bound: a dead loop fails
    the test instead of hanging it)."""
    engine = CountingEngine()
    engine.step = lambda: (_ for _ in ()).throw(RuntimeError("injected"))
    loop = run_with_timeout(EngineLoop, lambda: engine)
    got, done = [], threading.Event()
    loop.submit([request("a", 5)], lambda out: got.append(out) or done.set())
    assert done.wait(WAIT_S) and [str(e) for e in got] == ["injected"]
    assert run_with_timeout(loop.call, lambda e: dict(e.requests)) == {}, "the loop stopped serving"
    run_with_timeout(loop.close)


def test_a_loop_left_open_does_not_keep_the_interpreter_alive():
    """Its thread is a daemon: a program that exits without closing its LLM is not held by a loop waiting for work."""
    loop = run_with_timeout(EngineLoop, CountingEngine)
    assert loop._thread.daemon
    run_with_timeout(loop.close)
