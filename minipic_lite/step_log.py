"""A bounded record of recent engine steps: how many tokens of each kind every step computed.

    step   span prefill   final prefill   decode   recompute
    41     48             0               3        0      <- a new request's SSEP documents, beside three decodes
    42     0              21              3        0      <- its question and answer header (PDEP), same batch
    43     0              0               4        0      <- everyone decodes
    57     0              40              4        25     <- a preempted request returns: its prompt past its
                                                             cached blocks, the 25 answer tokens it had computed

Prompt tokens inside SSEP segments (position-independent spans) count as *span prefill*, every other prompt
token (the leading segment, PDEP segments) as *final prefill*. Past the prompt, the token a step samples from
(its request's last) counts as *decode*, and answer tokens computed again after a preemption as *recompute*. A
burst of k decode steps is one record with k x its tokens.
Written by the engine loop thread, read by anyone (the web app's scheduler timeline): hence the lock.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass

from minipic_lite.spans import SegmentKind

STEP_LOG_LEN = 512  # steps kept (older ones are dropped)


@dataclass(frozen=True, slots=True)
class StepRecord:
    index: int  # 0, 1, 2, ... over the engine's life
    time: float  # time.perf_counter() at the end of the step
    num_steps: int  # > 1: a burst of decode steps
    num_seqs: int
    num_span_prefill_tokens: int
    num_final_prefill_tokens: int
    num_decode_tokens: int
    num_recompute_tokens: int  # answer tokens computed again after a preemption


def count_tokens(out) -> tuple[int, int, int, int]:
    """(span prefill, final prefill, decode, recompute) tokens of one `SchedulerOutput`."""
    span = final = decode = recompute = 0
    for scheduled in out.scheduled:
        req = scheduled.seq
        ssep = [s for s in (req.layout.segments if req.layout else ()) if s.kind is SegmentKind.SSEP]
        for start, end in scheduled.query_ranges:
            prompt_end = min(end, req.num_prompt_tokens)
            num_prompt = max(0, prompt_end - start)
            in_spans = sum(max(0, min(prompt_end, s.end) - max(start, s.start)) for s in ssep)
            span += in_spans
            final += num_prompt - in_spans
            past_prompt = end - start - num_prompt
            # NOTE: a chunk that samples ends at its request's last token, the one a decode computes; every answer
            # token before it had been computed once already (a recompute after a preemption)
            new = 1 if scheduled.do_sample and end == scheduled.query_ranges[-1][1] and past_prompt else 0
            decode += new * out.num_steps
            recompute += (past_prompt - new) * out.num_steps
    return span, final, decode, recompute


class StepLog:
    def __init__(self, maxlen: int = STEP_LOG_LEN):
        self._records: deque[StepRecord] = deque(maxlen=maxlen)
        self._lock = threading.Lock()
        self._num_records = 0

    def record(self, out, now: float) -> None:
        with self._lock:
            record = StepRecord(self._num_records, now, out.num_steps, len(out.scheduled), *count_tokens(out))
            self._records.append(record)
            self._num_records += 1

    def records(self, since: int = 0) -> list[StepRecord]:
        """The kept records with index >= `since`, oldest first (safe from any thread)."""
        with self._lock:
            return [r for r in self._records if r.index >= since]
