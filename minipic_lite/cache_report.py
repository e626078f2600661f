"""Per-request cache report: what happened to each prompt block when the request was admitted.

`RequestOutput.cache_report` is a list of `BlockReport`, one per prompt block (the partial last block too):

    block  tokens      hash          status    ref  kind     span  label
    0      [0, 16)     3fa2c1d09b7e  computed  1    leading  0     system
    1      [16, 32)    9c04e1aa52d3  hit       2*   ssep     1     doc 0      (* shared with another request)
    ...
    7      [112, 118)  -             computed  1    pdep     3     question   (partial: never cached)

`status` is "hit" (taken from the cache, not computed for this request) or "computed". `ref_cnt` is the
block's reference count when the request's first chunk was scheduled: > 1 means another request holds the
same physical block (`is_shared`). After a preemption the report describes the re-admission.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass

from minipic_lite.block_pool import BlockPool
from minipic_lite.config import cdiv
from minipic_lite.request import Request
from minipic_lite.spans import Segment, SegmentKind

HASH_HEX_CHARS = 12  # the short hex shown for a block hash (48 bits: plenty to tell blocks apart on screen)


@dataclass(frozen=True, slots=True)
class BlockReport:
    index: int  # logical block in the request
    start: int  # first token, half-open [start, end)
    end: int
    block_id: int  # physical block
    hash: str | None  # the block hash in hex (`short_hash` for display); None for a partial block (never cached)
    status: str  # "hit" or "computed"
    ref_cnt: int
    kind: SegmentKind  # kind of the segment the block belongs to
    span_id: int  # index of that segment in the prompt
    label: str | None = None  # the segment's label, where the prompt was composed (prompts.py)

    @property
    def short_hash(self) -> str | None:
        return None if self.hash is None else self.hash[:HASH_HEX_CHARS]

    @property
    def is_hit(self) -> bool:
        return self.status == "hit"

    @property
    def is_shared(self) -> bool:
        return self.ref_cnt > 1


@dataclass(frozen=True, slots=True)
class StateReport:
    """Hybrid models: the recurrent-state side of a request's cache use (state_cache.py)."""

    resume_position: int  # prompt tokens skipped by loading a saved state (0: computed from the start)
    num_recomputed_tokens: int  # prompt tokens computed: num_prompt_tokens − resume_position
    planned_checkpoints: tuple[int, ...]  # positions the planner placed for this prompt
    saved_checkpoints: tuple[int, ...]  # positions whose state this request saved
    state_memory_bytes: int  # the checkpoint store's use when the output was built


def build_cache_report(
    seq: Request, pool: BlockPool, segments: Seq[Segment], labels: Seq[str | None] = ()
) -> list[BlockReport]:
    """The report of `seq`'s prompt blocks, read right after the step that admitted it was scheduled."""
    B, num_tokens, hashes = seq.block_size, seq.num_prompt_tokens, seq.block_hashes
    report = []
    for i, seg in enumerate(block_segments(segments, B)):
        start, end = i * B, min((i + 1) * B, num_tokens)
        full = end - start == B and i < len(hashes)
        block_id = seq.block_table[i]
        status = "hit" if i in seq.cached_block_ids else "computed"
        label = labels[seg.index] if seg.index < len(labels) else None
        block_hash = hashes[i].hex() if full else None
        report.append(
            BlockReport(
                i, start, end, block_id, block_hash, status, pool.blocks[block_id].ref_cnt, seg.kind, seg.index, label
            )
        )
    return report


def block_segments(segments: Seq[Segment], block_size: int) -> list[Segment]:
    """The segment of each block: the one that holds its first token (the segments partition the prompt)."""
    return [seg for seg in segments for _ in range(cdiv(seg.start, block_size), cdiv(seg.end, block_size))]


def report_totals(report: Seq[BlockReport]) -> dict:
    """Hit / computed / shared block counts and the block hit rate of one report."""
    num_hits = sum(b.is_hit for b in report)
    return {
        "num_blocks": len(report),
        "num_hit_blocks": num_hits,
        "num_computed_blocks": len(report) - num_hits,
        "num_shared_blocks": sum(b.is_shared for b in report),
        "hit_rate": num_hits / len(report) if report else 0.0,
    }


def format_report(report: Seq[BlockReport]) -> str:
    """The report as a fixed-width text table (one line per block; `*` marks a shared block)."""
    lines = [f"{'block':>5}  {'tokens':<12}{'hash':<14}{'status':<10}{'ref':<5}{'kind':<9}{'span':<6}label"]
    for b in report:
        ref = f"{b.ref_cnt}{'*' if b.is_shared else ''}"
        tokens = f"[{b.start}, {b.end})"
        lines.append(
            f"{b.index:>5}  {tokens:<12}{b.short_hash or '-':<14}{b.status:<10}{ref:<5}{b.kind.value:<9}"
            f"{b.span_id:<6}{b.label or ''}"
        )
    return "\n".join(lines)
