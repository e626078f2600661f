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

The engine reads what the report needs at admission (`Admission`: copies, since ref counts and the request's
blocks change later) and builds the thousand `BlockReport`s of a long prompt only when someone reads the report
(`CacheReport`): most callers never do, and the build would sit in the request's time to first token.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass

from minipic_lite.block_pool import BlockPool
from minipic_lite.config import cdiv
from minipic_lite.hashing import BlockHash
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


@dataclass(frozen=True, slots=True)
class Admission:
    """What a request's cache report says, read right after the step that admitted it was scheduled."""

    num_prompt_tokens: int
    block_size: int
    block_table: tuple[int, ...]  # the prompt blocks' physical blocks
    ref_cnts: tuple[int, ...]  # ... and their reference counts then
    hit_blocks: frozenset[int]  # prompt blocks taken from the cache
    block_hashes: tuple[BlockHash, ...]
    segments: tuple[Segment, ...]
    labels: tuple[str | None, ...]

    @classmethod
    def read(cls, seq: Request, pool: BlockPool, segments: Seq[Segment], labels: Seq[str | None]) -> Admission:
        table = tuple(seq.block_table[: seq.num_blocks_for(seq.num_prompt_tokens)])
        blocks = pool.blocks
        ref_cnts = tuple([blocks[block_id].ref_cnt for block_id in table])
        hits = frozenset(seq.cached_block_ids)
        if len(seq.token_ids) > seq.num_prompt_tokens:  # NOTE: a re-admission has outputs: only the prompt's blocks
            hits = hits.intersection(range(len(table)))
        hashes, B = tuple(seq.block_hashes), seq.block_size
        return cls(seq.num_prompt_tokens, B, table, ref_cnts, hits, hashes, tuple(segments), tuple(labels))


class CacheReport(Seq[BlockReport]):
    """A request's cache report: a read-only list of `BlockReport`, built from its `Admission` when first read."""

    def __init__(self, admission: Admission):
        self.admission = admission
        self._blocks: list[BlockReport] | None = None

    @property
    def blocks(self) -> list[BlockReport]:
        if self._blocks is None:
            self._blocks = block_reports(self.admission)
        return self._blocks

    @property
    def num_hit_blocks(self) -> int:
        return len(self.admission.hit_blocks)  # NOTE: without building the report

    def __len__(self) -> int:
        return len(self.admission.block_table)

    def __getitem__(self, index):
        return self.blocks[index]

    def __repr__(self) -> str:
        return repr(self.blocks)

    def __eq__(self, other) -> bool:  # NOTE: compares as the list of BlockReports it stands for
        return self.blocks == (other.blocks if isinstance(other, CacheReport) else other)


def build_cache_report(
    seq: Request, pool: BlockPool, segments: Seq[Segment], labels: Seq[str | None] = ()
) -> CacheReport:
    """The report of `seq`'s prompt blocks, read right after the step that admitted it was scheduled."""
    return CacheReport(Admission.read(seq, pool, segments, labels))


def block_reports(admission: Admission) -> list[BlockReport]:
    """One `BlockReport` per prompt block (the partial last block too)."""
    a, B, report = admission, admission.block_size, []
    # NOTE: strict: the segments partition the prompt, so they cover its blocks exactly
    for i, seg in zip(range(len(a.block_table)), block_segments(a.segments, B), strict=True):
        start, end = i * B, min((i + 1) * B, a.num_prompt_tokens)
        full = end - start == B and i < len(a.block_hashes)
        block_hash = a.block_hashes[i].hex() if full else None
        status = "hit" if i in a.hit_blocks else "computed"
        label = a.labels[seg.index] if seg.index < len(a.labels) else None
        block = BlockReport(
            i, start, end, a.block_table[i], block_hash, status, a.ref_cnts[i], seg.kind, seg.index, label
        )
        report.append(block)
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
