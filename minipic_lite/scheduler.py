"""Continuous batching under one token budget: no prefill or decode phases, only chunks.

Each step, running requests go first (a decode token or their next prefill chunk), then waiting requests
are admitted while the budget, `max_num_seqs` and free blocks allow. When blocks run out, the most recently
admitted running request is preempted (its blocks freed, recomputed later: nothing is lost).

A request's chunk is a half-open range of positions [num_computed_tokens, end); positions inside blocks
taken from the cache are skipped, so the queries of one chunk can have holes:

    blocks:   | hit | miss | hit | miss  |
    queries:        [ 16 , 32 )    [48, 57)      -> query_ranges = [(16, 32), (48, 57)], kv_len = 57

When every scheduled request decodes and none waits, a step may be a *burst* of `num_steps` decode steps
that the device runs back to back, each feeding back the token it sampled (multi-step scheduling). Blocks
for the whole burst are taken up front; tokens sampled after a request stopped are dropped:

    before:  tokens [0, L), KV of [0, L-1)        burst step i computes position L-1+i, samples token L+i
    after k steps: KV of [0, L+k-1), tokens [0, L+k)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from minipic_lite.block_pool import BlockPool
from minipic_lite.config import SchedulerConfig
from minipic_lite.sequence import Sequence, SequenceStatus


@dataclass(slots=True)
class ScheduledSeq:
    seq: Sequence
    query_ranges: list[tuple[int, int]]  # positions computed this step, half-open, increasing
    kv_len: int  # keys [0, kv_len) are in the cache once this step has written its own
    do_sample: bool  # the chunk ends at the sequence's last token: sample the next one

    @property
    def num_query_tokens(self) -> int:
        return sum(end - start for start, end in self.query_ranges)


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    num_steps: int = 1  # > 1: a burst of decode steps (every scheduled request decodes)

    @property
    def num_batched_tokens(self) -> int:
        return self.num_steps * sum(s.num_query_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled

    @property
    def is_decode_only(self) -> bool:
        """Every scheduled request computes one token and samples the next (bursts, CUDA graphs, CPU fast path)."""
        return bool(self.scheduled) and all(s.num_query_tokens == 1 and s.do_sample for s in self.scheduled)


def plan_chunk(seq: Sequence, budget: int) -> tuple[list[tuple[int, int]], int]:
    """The query ranges and the end of the next chunk of `seq`, computing at most `budget` tokens."""
    block_size, total = seq.block_size, len(seq.token_ids)
    ranges: list[tuple[int, int]] = []
    pos, num_tokens = seq.num_computed_tokens, 0
    while pos < total and num_tokens < budget:
        block = pos // block_size
        if block in seq.cached_block_ids:
            pos = (block + 1) * block_size
            continue
        end = min(total, (block + 1) * block_size, pos + budget - num_tokens)
        if ranges and ranges[-1][1] == pos:
            ranges[-1] = (ranges[-1][0], end)
        else:
            ranges.append((pos, end))
        num_tokens += end - pos
        pos = end
    return ranges, pos


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_pool: BlockPool, enable_prefix_caching: bool = True):
        self.config = config
        self.pool = block_pool
        self.enable_prefix_caching = enable_prefix_caching
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # -- one step ----------------------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        budget = self._schedule_running(out, budget)
        if not out.preempted:
            self._schedule_waiting(out, budget)
        out.num_steps = self._plan_burst(out)
        return out

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        index = 0
        while index < len(self.running) and budget > 0:
            seq = self.running[index]
            ranges, end = plan_chunk(seq, budget)
            if not self._grow_block_table(seq, end, out):
                break  # seq itself was preempted: everything after it already was
            budget -= self._commit_chunk(seq, ranges, end, out)
            index += 1
        return budget

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            if not self._admit(seq):
                break
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            ranges, end = plan_chunk(seq, budget)
            budget -= self._commit_chunk(seq, ranges, end, out)

    def _commit_chunk(self, seq: Sequence, ranges, end: int, out: SchedulerOutput) -> int:
        self._publish_full_blocks(seq, end)
        scheduled = ScheduledSeq(seq, ranges, end, do_sample=end == len(seq.token_ids))
        out.scheduled.append(scheduled)
        return scheduled.num_query_tokens

    def _plan_burst(self, out: SchedulerOutput) -> int:
        """How many decode steps to run back to back (1: an ordinary step); takes the blocks they need."""
        steps = self.config.num_scheduler_steps
        if steps == 1 or self.waiting or out.preempted or not out.is_decode_only:
            return 1
        for s in out.scheduled:  # never past max_tokens nor the context
            params = s.seq.sampling_params
            steps = min(steps, params.max_tokens - s.seq.num_output_tokens, self.config.max_model_len - len(s.seq))
        if steps <= 1:
            return 1
        # NOTE: burst step i writes the KV of position len - 1 + i; the last one is len + steps - 2.
        need = [s.seq.num_blocks_for(len(s.seq) + steps - 1) - len(s.seq.block_table) for s in out.scheduled]
        if not self.pool.can_allocate(sum(need)):
            return 1  # lookahead never preempts anyone
        for s, num_new in zip(out.scheduled, need, strict=True):
            s.seq.block_table += [self.pool.allocate() for _ in range(num_new)]
        return steps

    # -- blocks ------------------------------------------------------------------------------------------

    def _admit(self, seq: Sequence) -> bool:
        """Resolve every block of the prompt: cache hits are shared, misses get fresh blocks."""
        # NOTE: the last token is always computed (its logits are needed), so its block is never a hit.
        num_hittable = (len(seq.token_ids) - 1) // seq.block_size if self.enable_prefix_caching else 0
        hits = {i: self.pool.lookup(seq.block_hashes[i]) for i in range(num_hittable)}
        hits = {i: b for i, b in hits.items() if b is not None}
        num_blocks = seq.num_blocks_for(len(seq.token_ids))
        num_free_hits = sum(self.pool.blocks[b].ref_cnt == 0 for b in hits.values())
        if not self.pool.can_allocate(num_blocks - len(hits) + num_free_hits):
            return False
        for block_id in hits.values():
            self.pool.touch(block_id)
        seq.block_table = [hits[i] if i in hits else self.pool.allocate() for i in range(num_blocks)]
        seq.cached_block_ids = set(hits)
        seq.num_cached_tokens = len(hits) * seq.block_size
        return True

    def _grow_block_table(self, seq: Sequence, end: int, out: SchedulerOutput) -> bool:
        """Give `seq` blocks up to `end`, preempting from the back of `running`. False if seq was preempted."""
        while len(seq.block_table) < seq.num_blocks_for(end):
            while not self.pool.can_allocate(1):
                victim = self.running[-1]
                self.preempt(victim)
                out.preempted.append(victim)
                if victim is seq:
                    return False
            seq.block_table.append(self.pool.allocate())
        return True

    def _publish_full_blocks(self, seq: Sequence, end: int) -> None:
        # NOTE: a block is published when the step that completes it is scheduled. Anyone who hits it later
        # in this same step reads it after this step's forward wrote it (KV is written before attention).
        num_full = end // seq.block_size
        if self.enable_prefix_caching:
            for i in range(seq.num_published_blocks, num_full):
                self.pool.cache(seq.block_table[i], seq.block_hashes[i])
        seq.num_published_blocks = max(seq.num_published_blocks, num_full)

    def preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self._free_blocks(seq)
        seq.reset_for_recompute()
        self.waiting.appendleft(seq)

    def finish(self, seq: Sequence, reason: str) -> None:
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self._free_blocks(seq)
        seq.block_table = []
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason

    def _free_blocks(self, seq: Sequence) -> None:
        # NOTE: tail first, so the LRU queue evicts a request's last blocks before its (more shared) prefix.
        self.pool.free(reversed(seq.block_table))

    # -- after the forward -------------------------------------------------------------------------------

    def postprocess(
        self, out: SchedulerOutput, sampled: list[list[int]], stops: Callable[[Sequence], bool]
    ) -> list[Sequence]:
        """Advance each scheduled request by its sampled tokens (one per step; [] where it only prefilled).

        `stops(seq)` is asked after each appended token; once it says yes (and has finished the request),
        the rest of its burst is dropped. Returns the requests that got at least one token.
        """
        advanced = []
        for scheduled, tokens in zip(out.scheduled, sampled, strict=True):
            seq = scheduled.seq
            seq.num_computed_tokens = scheduled.kv_len
            for i, token_id in enumerate(tokens):
                seq.num_computed_tokens = scheduled.kv_len + i  # step i computed position kv_len - 1 + i
                seq.append_token(token_id)
                self._publish_full_blocks(seq, seq.num_computed_tokens)  # a burst's blocks, before a stop frees them
                if stops(seq):
                    break
            if tokens:
                advanced.append(seq)
        return advanced
