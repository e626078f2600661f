"""One request's state as the scheduler and the runner see it."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from minipic_lite.hashing import BlockHash
from minipic_lite.sampling_params import SamplingParams
from minipic_lite.spans import HashState, SegmentKind, block_hashes


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """A request. Tokens [0, num_computed_tokens) have their KV in the cache (computed or hit).

    block_table[i] is the physical block of logical block i (tokens [i*B, (i+1)*B)); cached_block_ids
    holds the logical indices that came from the cache and are never computed for this request.
    """

    seq_id: int
    token_ids: list[int]
    sampling_params: SamplingParams
    block_size: int
    root: BlockHash
    num_prompt_tokens: int = 0
    # Span semantics (spans.py): visible_start per token, generated tokens continuing the last segment's
    # (None: all 0), and the logical blocks that start with a marker (empty: plain chained hashes).
    visible_start: list[int] | None = None
    marker_blocks: dict[int, SegmentKind] = field(default_factory=dict)
    status: SequenceStatus = SequenceStatus.WAITING
    block_table: list[int] = field(default_factory=list)
    cached_block_ids: set[int] = field(default_factory=set)
    block_hashes: list[BlockHash] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_published_blocks: int = 0
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    finish_reason: str | None = None
    arrival_time: float = field(default_factory=time.perf_counter)
    first_token_time: float | None = None
    finish_time: float | None = None
    _hash_state: HashState | None = field(default=None, repr=False)
    prompt_token_ids: list[int] = field(init=False, repr=False)

    def __post_init__(self):
        self.num_prompt_tokens = self.num_prompt_tokens or len(self.token_ids)
        # NOTE: kept once, so that an output per step does not copy the whole prompt again.
        self.prompt_token_ids = self.token_ids[: self.num_prompt_tokens]
        self._extend_hashes()

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)
        if self.visible_start is not None:
            self.visible_start.append(self.visible_start[-1])
        self._extend_hashes()

    def _extend_hashes(self) -> None:
        """Hash the blocks completed since the last call (span-aware; spans.block_hashes)."""
        first = len(self.block_hashes)
        if len(self.token_ids) < (first + 1) * self.block_size:
            return
        hashes, self._hash_state = block_hashes(
            self.token_ids[first * self.block_size :],
            self.block_size,
            self.root,
            self.marker_blocks,
            self._hash_state,
            first,
        )
        self.block_hashes += hashes

    def reset_for_recompute(self) -> None:
        """After preemption: forget the cache state; tokens (prompt + outputs so far) are kept."""
        self.block_table.clear()
        self.cached_block_ids.clear()
        self.num_computed_tokens = 0
        self.num_published_blocks = 0
        self.status = SequenceStatus.WAITING
        self.num_preemptions += 1
