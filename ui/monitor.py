"""What the app's sessions share, kept thread-safe: the requests in flight, the hit rate over time, the prompts
served (for the Checkpoints panel). Gradio runs each event in a worker thread; the engine's own state stays
on its loop thread and is read only through `LLM.stats()` and the outputs."""

from __future__ import annotations

import secrets
import threading
import time
from collections import deque
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
    output: object = None  # the latest RequestOutput


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

    def new_request_id(self) -> str:
        """A request id with no session in it: ids are shown to everyone."""
        with self._lock:
            return f"ui-{self._tag}-{next(self._ids)}"

    def start(self, request_id: str, session: str, token_ids) -> None:
        """Register a request as in flight for `session`, and its prompt as served."""
        with self._lock:
            self.requests[request_id] = InFlight(session)
            self.served.append(list(token_ids))

    def update(self, request_id: str, output) -> None:
        with self._lock:
            if request_id in self.requests:
                self.requests[request_id].output = output

    def finish(self, request_id: str) -> None:
        with self._lock:
            self.requests.pop(request_id, None)

    def requests_of(self, session: str) -> list[str]:
        with self._lock:
            return [rid for rid, r in self.requests.items() if r.session == session]

    def in_flight(self) -> list[tuple[str, object]]:
        """(request id, latest output or None) of every request in flight, oldest first."""
        with self._lock:
            return [(rid, r.output) for rid, r in self.requests.items()]

    def served_prompts(self) -> list[list[int]]:
        with self._lock:
            return list(self.served)

    def record_stats(self, stats: dict) -> None:
        with self._lock:
            self.history.append((time.perf_counter() - self.start_time, stats))

    def hit_rate_frames(self) -> list[pd.DataFrame]:
        """One frame per rate of HIT_RATES, in its order: seconds since the app started, hit rate."""
        with self._lock:
            samples = list(self.history)
        return [
            pd.DataFrame([(round(t, 1), s[key]) for t, s in samples], columns=["seconds", "hit rate"])
            for key in HIT_RATES
        ]
