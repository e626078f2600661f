"""Continuous batching under one token budget: no prefill or decode phases, only chunks.

Each step, running requests go first (a decode token or their next prefill chunk), then waiting requests
are admitted while the budget, `max_num_seqs` and free blocks allow. When blocks run out, the most recently
admitted running request is preempted (its blocks freed, recomputed later: nothing is lost).

A request's chunk may have holes where its blocks come from the cache (`chunks.py`: `plan_chunk`).

When every scheduled request decodes and none waits, a step may be a *burst* of `num_steps` decode steps
that the device runs back to back, each feeding back the token it sampled (multi-step scheduling). Blocks
for the whole burst are taken up front; tokens sampled after a request stopped are dropped:

    before:  tokens [0, L), KV of [0, L-1)        burst step i computes position L-1+i, samples token L+i
    after k steps: KV of [0, L+k-1), tokens [0, L+k)
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable
from itertools import islice

from minipic_lite.chunks import ScheduledSeq, SchedulerOutput, plan_chunk
from minipic_lite.config import SchedulerConfig
from minipic_lite.hit_guard import HitGuard
from minipic_lite.kv_cache_manager import HIT, MISS, PENDING, KVCacheManager
from minipic_lite.request import Request, RequestStatus
from minipic_lite.spans import Segment


class Scheduler:
    """Queues, the token budget, chunk plans and preemption; blocks are the KV-cache manager's business.

    `config.span_policy` says when the SSEP spans of a waiting prompt are computed:
      inline   inside the request's own prefill, once it is admitted (spans shared by requests in flight
               are still computed once: a later request waits for the blocks another one is computing);
      isps     ahead, as span prefills of their own (`Request.span_prefill`: one a prompt a step, holding its
               missing spans back to back), for the next waiting prompts
               that have no seat yet, in the budget that running requests and admissions leave (at most
               `span_ahead_tokens` of it in a step where other requests run, when set); a prompt that gets a
               seat is admitted whole (as inline: what a span prefill of it computed ahead is a hit, what another
               request is computing it waits for); a span prefill never evicts a block its prompt or one ahead
               of it would hit (hit_guard.py): it waits;
      barrier  (SPNL) in batches: every missing span of the next waiting requests (up to max_num_seqs) first,
               then their finals, and the next batch's spans only once those finals are done.

    Why isps does not cap its work ahead by default: a waiting prompt takes a seat only when a running request
    finishes, so spans computed early gain only by riding in the spare compute of the running requests' decode
    steps. A cap of 256 tokens lost on the H200 (rag-c0b23ad-cuda.md, reuse 0.5: 24.4 samples/s against the
    whole budget's 27.8): each decode step with a few hundred span tokens beside it had more sequences than any
    CUDA graph's bucket, and an eager step costs ~24 ms (fitted from those runs, not profiled) against a graph's
    5-8 ms. Shaping those steps to fit a bucket would gain ~4% at most there: the first wave's 32 decode steps could
    carry ~7,000 span tokens at about half the prefill's cost a token (`bench/sched_replay.py --cost-model`). A cap
    of 1,024, whose steps are as long on the GPU as an eager step's host time, modeled 1.08x the whole budget at
    reuse 0.5 and lost on the H200 too (rag-dbcc69c-cuda.md: 25.8 samples/s against 27.5; 37 eager steps of 68).
    """

    def __init__(self, config: SchedulerConfig, kv: KVCacheManager):
        self.config = config
        self.kv = kv
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.span_running: list[Request] = []  # span prefills computing ahead of their finals
        # waiting requests seen with no missing span, and kv.num_losses then (only a loss makes one go missing)
        self.complete_ahead: dict[Request, int] = {}

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # -- one step ----------------------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        self._keep_spans_computed_ahead()
        budget = self._schedule_running(out, budget)
        if not out.preempted:
            self._schedule_waiting(out, budget)
        out.num_steps = self._plan_burst(out)
        out.copies = self.kv.take_copies() if out.scheduled else []
        out.state_ops = self.kv.take_state_ops()
        return out

    def _keep_spans_computed_ahead(self) -> None:
        """Before a step that may admit finals takes fresh blocks, the spans computed ahead for the next waiting
        prompts become the youngest in the LRU queue. They were computed steps ago, and blocks of requests that
        finished since would otherwise outlive them: on a tight cache isps computed them again (38% more tokens
        than inline in the scheduler replay at reuse 0 on 8,000 blocks)."""
        if self.config.span_policy == "inline" or len(self.running) >= self.config.max_num_seqs:
            return  # NOTE: no seat for a final: nothing to keep them for yet (and no host time spent)
        for req in islice(self.waiting, self.config.max_num_seqs):
            if req.started_spans:
                self.kv.keep_for(req)

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        budget = self._schedule_queue(self.running, out, budget)
        room = self._span_room(out, budget)
        return budget - room + self._schedule_queue(self.span_running, out, room)

    def _schedule_queue(self, queue: list[Request], out: SchedulerOutput, budget: int) -> int:
        """The next chunk of each request of `queue`, in order, while budget is left; returns the budget left."""
        index = 0
        while index < len(queue) and budget > 0:
            req = queue[index]
            ranges, end = plan_chunk(req, budget)
            if not self._make_room(req, end, out):
                break  # req itself was preempted: everything after it already was
            self.kv.grow(req, end)
            budget -= self._commit_chunk(req, ranges, end, out)
            index += 1
        return budget

    def _span_room(self, out: SchedulerOutput, budget: int) -> int:
        """Tokens span prefills may take now: the budget, or under isps at most `span_ahead_tokens` (when set) in a
        step where other requests run."""
        if self.config.span_policy != "isps" or self.config.span_ahead_tokens is None or not self.running:
            return budget
        taken = sum(s.num_query_tokens for s in out.scheduled if s.seq.is_span_prefill)
        return max(0, min(budget, self.config.span_ahead_tokens - taken))

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> None:
        policy = self.config.span_policy
        lookahead = self._lookahead() if policy == "barrier" else None
        missing = functools.cache(self._missing_spans)  # per request: what it misses when first asked this step
        num_losses = self.kv.num_losses  # NOTE: while unchanged, what `missing` said is still true
        # NOTE: a list, not a generator: all of the lookahead is asked before any admission changes the cache
        barrier = policy == "barrier" and (any([missing(req) for req in lookahead]) or bool(self.span_running))
        num_running, guard = len(self.running), HitGuard(self.kv, self.waiting)
        for req in list(self.waiting):
            if budget <= 0 or len(self.running) >= self.config.max_num_seqs:
                break
            # NOTE: isps admits a prompt that has a seat whole, its missing spans computed in its own prefill:
            # split into span prefills with its final joining them in the same step, it computed the same
            # tokens at more host time a step (640 span prefills instead of 64 prompts at reuse 0: README)
            if policy == "barrier" and (barrier or missing(req)) and not self._must_go_inline(req, missing(req)):
                continue  # its spans are computed ahead first
            if not self.kv.allocate_prompt(req):
                break
            self.waiting.remove(req)
            self.complete_ahead.pop(req, None)
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            ranges, end = plan_chunk(req, budget)
            budget -= self._commit_chunk(req, ranges, end, out)
        # NOTE: barrier (SPNL) starts the spans of the next batch only once the finals of the last one are done
        # NOTE: with no budget left, or nothing missing ahead, no span prefill starts: the lookahead (a match per
        # request) is not asked
        room = self._span_room(out, budget)  # NOTE: span prefills take from both; room <= budget
        ahead = room > 0 and (policy == "isps" or (policy == "barrier" and not self.running))
        ahead = ahead and not self._nothing_ahead()
        if ahead and (lookahead is None or len(self.running) > num_running):
            lookahead = self._lookahead()  # NOTE: only an admission changes what it depends on since the first
        for req in lookahead if ahead else ():
            if not missing(req) and self.kv.num_losses == num_losses:
                self.complete_ahead[req] = num_losses
            room = self._start_span_prefills(req, missing(req), out, room, guard)
            if room <= 0:
                return

    def _nothing_ahead(self) -> bool:
        """Every request the lookahead could take was seen with no missing span, and no block was lost since: the
        lookahead would start nothing."""
        num_losses, seen = self.kv.num_losses, self.complete_ahead
        return all(seen.get(req) == num_losses for req in islice(self.waiting, self.config.max_num_seqs))

    def _lookahead(self) -> list[Request]:
        """The waiting requests whose spans are computed ahead: the next ones (at most max_num_seqs) whose whole
        prompts fit in the free blocks together. Not the whole queue: spans computed too early, or more than the
        cache holds at once, would be evicted before their final uses them, and be computed again."""
        room, chosen = self.kv.num_free_blocks, []
        candidates = list(islice(self.waiting, self.config.max_num_seqs))
        if sum(req.num_blocks_for(len(req.token_ids)) for req in candidates) <= room:
            return candidates  # NOTE: they fit whole (a GPU's roomy cache): no match of each needed to say so
        for req in candidates:
            room -= self.kv.num_blocks_to_admit(req)
            if room < 0:
                break
            chosen.append(req)
        return chosen

    def _must_go_inline(self, req: Request, missing: list[Segment]) -> bool:
        """The head of the queue is admitted as it is (its missing spans computed in its own prefill) once a span
        computed ahead for it is missing again (evicted): spans computed ahead that do not fit in the cache
        together evict each other, and waiting until all of them are cached at once could wait forever."""
        is_head = bool(self.waiting) and req is self.waiting[0]
        return is_head and any(s.index in req.started_spans for s in missing)

    def _missing_spans(self, req: Request) -> list[Segment]:
        """Spans of `req` with a block that is neither cached (device or host) nor being computed."""
        kinds, B = self.kv.match(req), req.block_size
        return [s for s in req.span_segments() if MISS in kinds[s.start // B : s.end // B]]

    def _start_span_prefills(
        self, req: Request, segments: list[Segment], out: SchedulerOutput, budget: int, guard: HitGuard
    ) -> int:
        """Start one span prefill of those of `segments` that are still missing, in order, while budget is left and
        `guard` lets it take their blocks; returns the budget left.

        NOTE: one unit for a prompt's spans, not one a span: the same tokens in 39 units instead of 320 (isps,
        bench/sched_replay.py at reuse 0), whose host work (admission, chunk plan, publish, a sequence of the step) is
        paid per unit: with a unit a span, isps's schedule() and postprocess took 2-3x inline's (README)."""
        if not segments or budget <= 0 or guard.has_refused:
            return budget
        kinds, B = self.kv.match(req), req.block_size
        chosen, num_fresh, num_tokens = [], 0, 0
        for segment in segments:
            if num_tokens >= budget or guard.has_refused:
                break  # NOTE: with no budget it would only hold blocks; after a refusal, spans wait in queue order
            span = kinds[segment.start // B : segment.end // B]
            if MISS not in span:  # an earlier span prefill of this step computes it (another prompt's, or a copy)
                req.started_spans.add(segment.index)
                continue
            if PENDING in span:
                continue  # NOTE: part of it is being computed: a unit with it would wait there, the spans after it too
            fresh = len(span) - span.count(HIT)
            if not guard.lets(req, num_fresh + fresh):
                break  # it would evict a hit of req or of a prompt ahead of it: it waits for room
            chosen.append(segment)
            req.started_spans.add(segment.index)
            num_fresh, num_tokens = num_fresh + fresh, num_tokens + B * span.count(MISS)
        return self._start_span_prefill(req.span_prefill(chosen), out, budget) if chosen else budget

    def _start_span_prefill(self, unit: Request, out: SchedulerOutput, budget: int) -> int:
        if not self.kv.allocate_prompt(unit):
            return 0
        unit.status = RequestStatus.RUNNING
        self.span_running.append(unit)
        ranges, end = plan_chunk(unit, budget)
        return budget - self._commit_chunk(unit, ranges, end, out)

    def _commit_chunk(self, req: Request, ranges, end: int, out: SchedulerOutput) -> int:
        if not ranges:
            return 0  # it waits for a block another request computes
        self.kv.publish(req, end)
        do_sample = end == len(req.token_ids) and not req.is_span_prefill
        scheduled = ScheduledSeq(req, ranges, end, do_sample)
        out.scheduled.append(scheduled)
        return scheduled.num_query_tokens

    def _plan_burst(self, out: SchedulerOutput) -> int:
        """How many decode steps to run back to back (1: an ordinary step); takes the blocks they need."""
        if self.config.num_scheduler_steps == 1 or self.waiting or out.preempted or not out.is_decode_only:
            return 1
        return self._take_burst(out.scheduled, [len(s.seq) for s in out.scheduled], min_steps=2) or 1

    def _take_burst(self, scheduled: list[ScheduledSeq], lengths: list[int], min_steps: int) -> int:
        """The decode steps (up to num_scheduler_steps) that `scheduled` can run from `lengths` (each request's
        tokens when the burst starts) without passing max_tokens or the context, with their blocks taken; 0 when
        fewer than `min_steps` fit or blocks are short (a burst never preempts anyone)."""
        steps = self.config.num_scheduler_steps
        for s, length in zip(scheduled, lengths, strict=True):
            num_output = length - s.seq.num_prompt_tokens
            steps = min(steps, s.seq.sampling_params.max_tokens - num_output, self.config.max_model_len - length)
        if steps < min_steps:
            return 0
        # NOTE: burst step i writes the KV of position length - 1 + i; the last one is length + steps - 2.
        ends = [length + steps - 1 for length in lengths]
        need = sum(self.kv.num_missing_blocks(s.seq, end) for s, end in zip(scheduled, ends, strict=True))
        if not self.kv.can_allocate(need):
            return 0
        for s, end in zip(scheduled, ends, strict=True):
            self.kv.grow(s.seq, end)
        return steps

    def plan_continuation(self, last: SchedulerOutput) -> SchedulerOutput | None:
        """A burst that continues `last` before its tokens are known (async scheduling: the host plans it while
        `last` runs), or None where it cannot: `last` did not decode every running request, a span prefill is still
        to run or `last` preempted a request (the next step is planned with the tokens in), a request waits or would
        end by length during `last`, or blocks are short. A request that stops on a token or a string during
        `last` is not known yet: its tokens of the continuation are dropped (postprocess skips it).

            last:  kv_len L (per request), k steps: computes positions L-1 .. L+k-2, samples tokens L .. L+k-1
            next:  kv_len L+k, n steps:           computes positions L+k-1 .. L+k+n-2
        """
        if self.waiting or self.span_running or last.preempted or not last.is_decode_only:
            return None
        if len(last.scheduled) != len(self.running) or any(
            s.seq is not req for s, req in zip(last.scheduled, self.running, strict=False)
        ):
            return None  # one finished or was aborted since (its row would be wasted work), or one joined
        lengths = [s.kv_len + last.num_steps for s in last.scheduled]  # their tokens once `last`'s are in
        steps = self._take_burst(last.scheduled, lengths, min_steps=1)
        if not steps:
            return None
        scheduled = [ScheduledSeq(s.seq, [(n - 1, n)], n, True) for s, n in zip(last.scheduled, lengths, strict=True)]
        # NOTE: fresh blocks may evict cached ones to the host tier: those copies run before this burst writes them
        return SchedulerOutput(scheduled, num_steps=steps, copies=self.kv.take_copies())

    # -- preemption and finishing ------------------------------------------------------------------------

    def _make_room(self, req: Request, end: int, out: SchedulerOutput) -> bool:
        """Free blocks for `req` up to `end`, preempting from the back: span prefills first (a span prefill
        never preempts a request), then `running`. False if req itself was preempted."""
        while not self.kv.can_allocate(self.kv.num_missing_blocks(req, end)):
            victim = self.span_running[-1] if self.span_running else self.running[-1]
            self.preempt(victim)
            out.preempted.append(victim)
            if victim is req:
                return False
        return True

    def preempt(self, req: Request) -> None:
        if req.is_span_prefill:  # dropped: its final computes what is still missing
            self.finish(req, "preempted")
            return
        self.running.remove(req)
        self.kv.free(req)
        req.reset_for_recompute()
        self.waiting.appendleft(req)  # NOTE: at the head: it keeps its turn

    def finish(self, req: Request, reason: str) -> None:
        self.complete_ahead.pop(req, None)
        for queue in (self.running, self.waiting, self.span_running):
            if req in queue:
                queue.remove(req)
                break
        self.kv.free(req)
        req.status = RequestStatus.FINISHED
        req.finish_reason = reason
        if not req.is_span_prefill and not self.running and not self.waiting:
            while self.span_running:  # nobody is left to use them
                self.finish(self.span_running[-1], "abort")

    # -- after the forward -------------------------------------------------------------------------------

    def postprocess(
        self, out: SchedulerOutput, sampled: list[list[int]], stops: Callable[[Request], bool]
    ) -> list[Request]:
        """Advance each scheduled request by its sampled tokens (one per step; [] where it only prefilled).

        `stops(req)` is asked after each appended token; once it says yes (and has finished the request),
        the rest of its burst is dropped. Returns the requests that got at least one token.
        """
        advanced = []
        for scheduled, tokens in zip(out.scheduled, sampled, strict=True):
            req = scheduled.seq
            if req.is_finished:
                continue  # a span prefill dropped when the last request finished earlier in this loop
            req.num_computed_tokens = scheduled.kv_len
            if req.is_span_prefill and req.num_computed_tokens == len(req.token_ids):
                self.finish(req, "stop")  # its blocks are published and stay cached
            for i, token_id in enumerate(tokens):
                req.num_computed_tokens = scheduled.kv_len + i  # step i computed position kv_len - 1 + i
                req.append_token(token_id)
                self.kv.publish(req, req.num_computed_tokens)  # a burst's blocks, before a stop frees them
                if stops(req):
                    break
            if tokens:
                advanced.append(req)
        return advanced
