"""What the app's sessions share, kept thread-safe: the requests in flight, the hit rate over time, the prompts
served (for the Checkpoints panel). Gradio runs each event in a worker thread; the engine's own state stays
on its loop thread and is read only through `LLM.stats()` and the outputs."""

from __future__ import annotations

import secrets
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import wait as wait_for
from dataclasses import dataclass, field
from itertools import count

import pandas as pd

HISTORY_LEN = 300  # stats samples kept (one per timer tick)
NUM_SERVED_KEPT = 200  # prompts kept for the Checkpoints panel
# `LLM.stats()` key -> the title of its line plot. NOTE: a plot each: the two rates are often equal, and one line
# drawn over the other would hide it (gradio's LinePlot tells lines apart by color only: no dash, no markers)
HIT_RATES = {
    "prompt_block_hit_rate": "Prompt blocks hit, over time",
    "prompt_token_hit_rate": "Prompt tokens hit, over time",
}


@dataclass
class InFlight:
    session: str
    num_prompt_tokens: int
    output: object = None  # the latest RequestOutput
    start: float = field(default_factory=time.perf_counter)


@dataclass
class Monitor:
    requests: dict[str, InFlight] = field(default_factory=dict)
    history: deque = field(default_factory=lambda: deque(maxlen=HISTORY_LEN))
    served: deque = field(default_factory=lambda: deque(maxlen=NUM_SERVED_KEPT))
    start_time: float = field(default_factory=time.perf_counter)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _ids: count = field(default_factory=count)
    # NOTE: two apps over one LLM must not reuse an id in flight: each monitor tags its ids
    _tag: str = field(default_factory=lambda: secrets.token_hex(2))
    _stats: dict | None = None  # the last `LLM.stats()` a fetch returned
    _fetch: Future | None = None  # the fetch under way, or the last one

    def new_request_id(self) -> str:
        """A request id with no session in it: ids are shown to everyone."""
        with self._lock:
            return f"ui-{self._tag}-{next(self._ids)}"

    def start(self, request_id: str, session: str, token_ids) -> None:
        """Register a request as in flight for `session`, and its prompt as served."""
        with self._lock:
            self.requests[request_id] = InFlight(session, len(token_ids))
            self.served.append(list(token_ids))

    def update(self, request_id: str, output) -> None:
        with self._lock:
            if request_id in self.requests:
                self.requests[request_id].output = output

    def finish(self, request_id: str) -> None:
        with self._lock:
            self.requests.pop(request_id, None)

    def is_in_flight(self, request_id: str) -> bool:
        with self._lock:
            return request_id in self.requests

    def requests_of(self, session: str) -> list[str]:
        with self._lock:
            return [rid for rid, r in self.requests.items() if r.session == session]

    def in_flight(self) -> list[tuple[str, object]]:
        """(request id, latest output or None) of every request in flight, oldest first."""
        with self._lock:
            return [(rid, r.output) for rid, r in self.requests.items()]

    def awaiting_first_output(self) -> dict[str, tuple[int, float]]:
        """Request id -> (prompt tokens, seconds since it started) of the requests in flight with no output yet:
        queued, or prefilling (outputs begin with the first token)."""
        now = time.perf_counter()
        with self._lock:
            return {rid: (r.num_prompt_tokens, now - r.start) for rid, r in self.requests.items() if r.output is None}

    def latest_stats(self, fetch: Callable[[], dict], wait: float) -> dict | None:
        """`fetch()` (`LLM.stats`, which waits for the engine's step to end) without waiting longer than `wait`
        seconds: it runs on a thread of its own, one fetch at a time; what it returned last stands in until the
        next returns (None before the first). A long prefill step (seconds on a CPU) no longer freezes every view."""
        with self._lock:
            if self._fetch is not None and self._fetch.done():  # one a tick gave up on: its value is the last
                done, self._fetch = self._fetch, None
                if done.exception() is None:
                    self._stats = done.result()
            if self._fetch is None:
                self._fetch = Future()
                threading.Thread(target=_fill, args=(self._fetch, fetch), daemon=True).start()
            pending = self._fetch
        # NOTE: wait(), not result(timeout): before Python 3.11 the futures' TimeoutError is not the builtin one
        if not wait_for([pending], timeout=wait).done:
            with self._lock:
                return self._stats
        with self._lock:
            if self._fetch is pending:
                self._fetch = None  # NOTE: a failed fetch raises once, here; the next tick fetches again
            if pending.exception() is None:
                self._stats = pending.result()
        return pending.result()

    def served_prompts(self) -> list[list[int]]:
        with self._lock:
            return list(self.served)

    def record_stats(self, stats: dict) -> None:
        """A sample for the hit-rate plots; the same stats again (a long step: `latest_stats` held them) add none."""
        with self._lock:
            if not self.history or self.history[-1][1] is not stats:
                self.history.append((time.perf_counter() - self.start_time, stats))

    def hit_rate_frames(self) -> list[pd.DataFrame]:
        """One frame per rate of HIT_RATES, in its order: seconds since the app started, hit rate."""
        with self._lock:
            samples = list(self.history)
        return [
            pd.DataFrame([(round(t, 1), s[key]) for t, s in samples], columns=["seconds", "hit rate"]).astype(float)
            for key in HIT_RATES
        ]


def _fill(future: Future, fn: Callable[[], object]) -> None:
    try:
        future.set_result(fn())
    except Exception as e:  # noqa: BLE001 -- handed to whoever reads the future
        future.set_exception(e)
