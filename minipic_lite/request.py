"""One record per request: what the scheduler, the KV-cache manager, the runner and the engine read and write.

Nothing about a request lives in side tables keyed by its id: its prompt, span layout, block table, progress,
stop reason, text and timings are all here, and the engine's output for it is built from this record alone.

    token_ids:  [ prompt ........................ | outputs ...... ]
                 0                num_prompt_tokens              len
    KV cached:  [0, num_computed_tokens)     block_table[i] holds tokens [i*B, (i+1)*B)
"""

from __future__ import annotations

import enum
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from minipic_lite.config import cdiv
from minipic_lite.hashing import TOKEN_BYTES, BlockHash
from minipic_lite.sampling_params import SamplingParams
from minipic_lite.spans import (
    HashState,
    Segment,
    SegmentKind,
    SpanHashMemo,
    SpanLayout,
    VisibleStarts,
    block_hashes,
)

if TYPE_CHECKING:
    from minipic_lite.detokenizer import Detokenizer
    from minipic_lite.outputs import Logprob


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    """A request. `layout` (spans.py) gives span markers their meaning; None means one leading segment."""

    request_id: str
    token_ids: list[int]
    sampling_params: SamplingParams
    block_size: int
    root: BlockHash  # the hash namespace (model, dtype, block size, cache mode)
    layout: SpanLayout | None = None
    prompt: str | None = None  # the prompt's text, where there is one
    span_labels: tuple[str | None, ...] = ()  # names of the layout's segments in the cache report
    stream: bool = False  # True: an output after every step, with the text so far
    is_span_prefill: bool = False  # SSEP spans of another request's prompt, computed ahead (ISPS); no output
    parent: ParentRequest | None = field(default=None, repr=False)  # SamplingParams.n > 1: the request it samples for
    started_spans: set[int] = field(default_factory=set)  # segments whose span prefill was started (scheduler.py)
    hash_memo: SpanHashMemo | None = field(default=None, repr=False)  # the engine's memo of span hashes
    # the prompt in hashing.token_bytes form where validation packed it already: hashed from, then dropped
    prompt_bytes: bytes | None = field(default=None, repr=False)
    # -- progress (Scheduler) --
    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0
    num_preemptions: int = 0
    # -- cache (KVCacheManager) --
    block_table: list[int] = field(default_factory=list)
    cached_block_ids: set[int] = field(default_factory=set)  # logical blocks taken from the cache
    waiting_blocks: set[int] = field(default_factory=set)  # ... of which another request still computes these
    block_hashes: list[BlockHash] = field(default_factory=list)
    num_published_blocks: int = 0
    num_cached_tokens: int = 0  # found cached at its latest admission (a re-admission finds its own tokens too)
    num_cached_prompt_tokens: int | None = None  # num_cached_tokens as its first token came out: what outputs report
    # -- recurrent state (hybrid models; state_cache.py) --
    state_slot: int | None = None  # live slot of the conv window and recurrent state while running
    checkpoint_positions: list[int] | None = None  # planned for the prompt at its first admission
    saved_checkpoints: list[int] = field(default_factory=list)  # positions whose state this request saved
    num_resumed_tokens: int = 0  # prompt tokens skipped by loading a checkpoint (last admission)
    # -- outcome (engine) --
    finish_reason: str | None = None  # "stop", "length", "abort"
    stop_reason: str | int | None = None  # the stop string or token that ended it
    stop_text: str | None = None  # the text cut before a stop string
    stop_search_start: int = 0  # no stop string ends before this character: the first min_tokens tokens' text
    detokenizer: Detokenizer | None = field(default=None, repr=False)  # its text so far, for stops and streams
    cache_report: Sequence = field(default_factory=list)  # a BlockReport per prompt block (cache_report.py)
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)  # per output token, where its params ask
    cumulative_logprob: float = 0.0
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None  # per prompt token, where its params ask
    # a DELTA stream's (RequestOutputKind): the output tokens and characters of text its outputs carried so far
    num_sent_tokens: int = 0
    num_sent_chars: int = 0
    sent_prompt_logprobs: bool = False
    arrival_time: float = field(default_factory=time.perf_counter)
    first_token_time: float | None = None
    finish_time: float | None = None
    # -- derived --
    num_prompt_tokens: int = field(init=False)
    _prompt_token_ids: list[int] | None = field(default=None, init=False, repr=False)  # prompt_token_ids, once made
    visible_start: VisibleStarts | None = field(init=False, repr=False)  # per token, from the segments; None: all 0
    _hash_state: HashState | None = field(default=None, init=False, repr=False)
    _span_segments: tuple[Segment, ...] | None = field(default=None, init=False, repr=False)

    def __post_init__(self):
        self.num_prompt_tokens = len(self.token_ids)
        has_spans = self.layout is not None and self.layout.has_spans
        self.visible_start = VisibleStarts(self.layout.segments, self.token_ids) if has_spans else None
        if self.prompt_bytes is not None and len(self.prompt_bytes) != TOKEN_BYTES * len(self.token_ids):
            raise ValueError(f"prompt_bytes holds {len(self.prompt_bytes)} bytes, not {len(self.token_ids)} tokens")
        self._extend_hashes(self.prompt_bytes)
        self.prompt_bytes = None

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def prompt_token_ids(self) -> list[int]:
        # NOTE: copied once, so that an output per step does not copy the whole prompt again; the prompt's tokens
        # never change
        if self._prompt_token_ids is None:
            self.copy_prompt()
        return self._prompt_token_ids

    def copy_prompt(self) -> None:
        """Make `prompt_token_ids` now (the engine does while the device computes the first token), if not made."""
        if self._prompt_token_ids is None:
            self._prompt_token_ids = self.token_ids[: self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status == RequestStatus.FINISHED

    @property
    def reads_no_cache(self) -> bool:
        """It computes its whole prompt (prompt logprobs need the logits at every position)."""
        return self.sampling_params.prompt_logprobs is not None

    def num_blocks_for(self, num_tokens: int) -> int:
        return cdiv(num_tokens, self.block_size)

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)  # NOTE: it continues the last segment (visible_start reads the length)
        self._extend_hashes()

    def _extend_hashes(self, prompt_bytes: bytes | None = None) -> None:
        """Hash the blocks completed since the last call (span-aware; spans.block_hashes); the first call may pass
        the prompt's bytes."""
        first = len(self.block_hashes)
        if len(self.token_ids) < (first + 1) * self.block_size:
            return
        markers = self.layout.marker_blocks if self.layout is not None else {}
        tokens = self.token_ids[first * self.block_size :] if first else self.token_ids  # NOTE: a prompt not copied
        B, state, memo = self.block_size, self._hash_state, self.hash_memo
        hashes, self._hash_state = block_hashes(tokens, B, self.root, markers, state, first, memo, prompt_bytes)
        self.block_hashes += hashes

    def reset_for_recompute(self) -> None:
        """After preemption: forget the cache state; tokens (prompt + outputs so far) are kept."""
        self.block_table.clear()
        self.cached_block_ids.clear()
        self.waiting_blocks.clear()
        self.num_computed_tokens = 0
        self.num_published_blocks = 0
        self.status = RequestStatus.WAITING
        self.num_preemptions += 1

    def span_segments(self) -> tuple[Segment, ...]:
        """The SSEP spans of the prompt that can be computed ahead: whole blocks, before the last prompt token."""
        if self._span_segments is None:  # NOTE: the scheduler asks every step for each waiting prompt; it never changes
            segments = self.layout.segments if self.layout is not None else ()
            B, end = self.block_size, self.num_prompt_tokens
            self._span_segments = tuple(
                s for s in segments if s.kind is SegmentKind.SSEP and s.end % B == 0 and s.end < end
            )
        return self._span_segments

    def span_prefill(self, segments: Sequence[Segment]) -> Request:
        """SSEP spans of this prompt, back to back, as one request of its own. Each span sees only itself wherever it
        sits (its visible_start), and its blocks hash as they do inside this prompt (an SSEP block restarts the
        chain: spans.py), so it takes this prompt's hashes of them instead of hashing again; it samples nothing and
        ends when its blocks are cached.

            prompt:  [ system | SSEP doc1 | SSEP doc2 | SSEP doc3 | PDEP question ]    span_prefill([doc1, doc3])
            unit:             [ SSEP doc1 | SSEP doc3 ]                             (whole blocks: span_segments)
        """
        B, tokens, hashes, unit_segments = self.block_size, [], [], []
        for segment in segments:
            start = len(tokens)
            tokens += self.token_ids[segment.start : segment.end]
            hashes += self.block_hashes[segment.start // B : segment.end // B]  # NOTE: whole blocks (span_segments)
            unit_segments.append(Segment(SegmentKind.SSEP, start, len(tokens), len(unit_segments)))
        markers = {s.start // B: SegmentKind.SSEP for s in unit_segments}
        layout = SpanLayout(tuple(unit_segments), markers)
        request_id = f"{self.request_id}/span" + ",".join(str(s.index) for s in segments)
        return Request(
            request_id, tokens, SamplingParams(max_tokens=1), B, self.root, layout, is_span_prefill=True,
            hash_memo=self.hash_memo, block_hashes=hashes,
        )  # fmt: skip


@dataclass(eq=False)
class ParentRequest:
    """One prompt sampled n times (`SamplingParams.n` > 1; vLLM's parallel sampling): n child requests, run by the
    scheduler as any others (the later ones find the prompt's blocks cached, or wait for them while the first
    computes them), and one request to its caller, whose output holds their n completions.

        parent "r1" (n = 3):   child "0_r1" (seed s)   child "1_r1" (seed s + 1)   child "2_r1" (seed s + 2)
    """

    request_id: str
    children: list[Request]
    stream: bool = False

    @staticmethod
    def child_id(request_id: str, index: int) -> str:
        return f"{index}_{request_id}"  # vLLM's

    @property
    def is_finished(self) -> bool:
        return all(child.is_finished for child in self.children)
