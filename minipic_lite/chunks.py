"""A step's chunks: what the scheduler hands the runner, and where a request's next chunk starts and ends.

A request's chunk is a half-open range of positions [num_computed_tokens, end); positions inside blocks
taken from the cache are skipped, so the queries of one chunk can have holes:

    blocks:   | hit | miss | hit | miss  |
    queries:        [ 16 , 32 )    [48, 57)      -> query_ranges = [(16, 32), (48, 57)], kv_len = 57
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import filterfalse

from minipic_lite.checkpoints.store import chunk_end
from minipic_lite.config import cdiv
from minipic_lite.host_tier import BlockCopy
from minipic_lite.request import Request
from minipic_lite.state_cache import StateOps


@dataclass(slots=True)
class ScheduledSeq:
    seq: Request
    query_ranges: list[tuple[int, int]]  # positions computed this step, half-open, increasing
    kv_len: int  # keys [0, kv_len) are in the cache once this step has written its own
    do_sample: bool  # the chunk ends at the sequence's last token: sample the next one

    @property
    def num_query_tokens(self) -> int:
        return sum(end - start for start, end in self.query_ranges)


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    num_steps: int = 1  # > 1: a burst of decode steps (every scheduled request decodes)
    copies: list[BlockCopy] = field(default_factory=list)  # host tier <-> device, run before the forward
    state_ops: StateOps | None = None  # hybrid models: state slots to zero / load / save (state_cache.py)

    @property
    def num_batched_tokens(self) -> int:
        return self.num_steps * sum(s.num_query_tokens for s in self.scheduled)

    @property
    def is_decode_only(self) -> bool:
        """Every scheduled request computes one token and samples the next (bursts, CUDA graphs, CPU fast path)."""
        return bool(self.scheduled) and all(s.num_query_tokens == 1 and s.do_sample for s in self.scheduled)


def plan_chunk(seq: Request, budget: int) -> tuple[list[tuple[int, int]], int]:
    """The query ranges and the end of the next chunk of `seq`, computing at most `budget` tokens."""
    # NOTE: a chunk ends at the next planned checkpoint (hybrids), so that step's state is the one to save.
    B, total = seq.block_size, chunk_end(seq.num_computed_tokens, seq.checkpoint_positions, len(seq))
    ranges: list[tuple[int, int]] = []
    pos, num_tokens = seq.num_computed_tokens, 0
    cached = seq.cached_block_ids
    for block in stop_blocks(seq, pos // B, cdiv(total, B)):
        if pos >= total or num_tokens >= budget:
            break
        pos = max(pos, block * B)  # the cached blocks before it are skipped
        if block in cached:
            break  # another request computes this block: wait for it (dedup)
        end = min(total, (block + 1) * B, pos + budget - num_tokens)
        if ranges and ranges[-1][1] == pos:
            ranges[-1] = (ranges[-1][0], end)
        else:
            ranges.append((pos, end))
        num_tokens += end - pos
        pos = end
    else:
        if pos < total and num_tokens < budget:
            pos = max(pos, cdiv(total, B) * B)  # the cached blocks after the last one computed are skipped
    return ranges, pos


def stop_blocks(seq: Request, first: int, end: int) -> list[int] | range:
    """The blocks in [first, end) where a chunk stops skipping: those it computes and those it waits for, in
    order. A cached prompt of a thousand blocks has few, so its chunk is planned without visiting the rest."""
    if not seq.cached_block_ids:
        return range(first, end)
    skipped = seq.cached_block_ids - seq.waiting_blocks if seq.waiting_blocks else seq.cached_block_ids
    return list(filterfalse(skipped.__contains__, range(first, end)))
