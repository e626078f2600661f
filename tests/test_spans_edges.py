"""SpanHashMemo's block budget at its edges, and which prompts it remembers; segments at block size 1,
`check_markers`'s default mode, and layouts as immutable values."""

import dataclasses

import pytest

from minipic_lite.config import ControlTokens
from minipic_lite.hashing import chain_hashes_bytes, root_hash, token_bytes
from minipic_lite.spans import (
    Segment,
    SegmentKind,
    SpanHashMemo,
    block_hashes,
    check_markers,
    span_layout,
    split_segments,
)

B = 4
S, P, PAD = 1, 2, 3
CONTROL = ControlTokens(ssep_id=S, pdep_id=P, pad_id=PAD)
ROOT = root_hash("test-spans-edges")
WIDTH = B * 8


def run_of(start, num_blocks):
    return token_bytes(list(range(start, start + num_blocks * B)))


def test_a_chain_of_exactly_the_block_budget_is_remembered():
    memo, run = SpanHashMemo(max_blocks=2), run_of(100, 2)
    assert memo.chain(ROOT, run, WIDTH) == chain_hashes_bytes(ROOT, run, WIDTH)
    assert len(memo) == 1 and memo.num_blocks == 2


def test_chains_that_fill_the_block_budget_exactly_are_all_kept():
    memo = SpanHashMemo(max_blocks=4)
    memo.chain(ROOT, run_of(100, 2), WIDTH)
    memo.chain(ROOT, run_of(200, 2), WIDTH)
    assert len(memo) == 2 and memo.num_blocks == 4


def test_runs_that_share_their_key_blocks_never_share_a_chain():
    """The memo finds a run by its length and first and last blocks, and holds it to the whole run: a run with the
    same ends but another middle block gets its own chain (and takes the place of the first), and the first run
    met again is hashed again, correctly; the block count follows."""
    memo = SpanHashMemo(max_blocks=8)
    first = run_of(100, 3)
    other = first[:WIDTH] + run_of(500, 1) + first[-WIDTH:]
    assert memo.chain(ROOT, first, WIDTH) == chain_hashes_bytes(ROOT, first, WIDTH)
    assert (
        memo.chain(ROOT, other, WIDTH)
        == chain_hashes_bytes(ROOT, other, WIDTH)
        != chain_hashes_bytes(ROOT, first, WIDTH)
    )
    assert len(memo) == 1 and memo.num_blocks == 3
    assert memo.chain(ROOT, first, WIDTH) == chain_hashes_bytes(ROOT, first, WIDTH)
    assert memo.chain(ROOT, bytes(bytearray(first)), WIDTH) is memo.chain(ROOT, first, WIDTH)  # now kept
    assert len(memo) == 1 and memo.num_blocks == 3


def test_runs_that_differ_in_their_length_or_an_end_block_are_all_kept():
    """The memo keys a run by its length and its first and last blocks: runs that share all but one of them are
    kept side by side, each served from the memo, and the block count holds them all."""
    memo = SpanHashMemo(max_blocks=16)
    first = run_of(100, 3)
    runs = [
        first,
        first[:WIDTH] + first[-WIDTH:],  # the same ends, shorter
        run_of(500, 1) + first[WIDTH:],  # another first block
        first[:-WIDTH] + run_of(500, 1),  # another last block
    ]
    kept = [memo.chain(ROOT, run, WIDTH) for run in runs]
    assert kept == [chain_hashes_bytes(ROOT, run, WIDTH) for run in runs]
    assert len(memo) == 4 and memo.num_blocks == 11
    assert all(memo.chain(ROOT, bytes(bytearray(run)), WIDTH) is chain for run, chain in zip(runs, kept, strict=True))


def test_a_run_that_takes_the_place_of_another_of_its_key_is_the_newest():
    """A run of the same key but other tokens takes the place of the run kept under it and is the most recently used:
    when room is needed, the oldest other chain goes and it stays."""
    memo = SpanHashMemo(max_blocks=6)
    first, other_key = run_of(100, 3), run_of(300, 2)
    same_key = first[:WIDTH] + run_of(500, 1) + first[-WIDTH:]
    for run in (first, other_key):
        memo.chain(ROOT, run, WIDTH)
    replaced = memo.chain(ROOT, same_key, WIDTH)
    assert replaced == chain_hashes_bytes(ROOT, same_key, WIDTH) and len(memo) == 2 and memo.num_blocks == 5
    memo.chain(ROOT, run_of(900, 2), WIDTH)  # 7 blocks: the oldest chain (other_key's) goes
    assert len(memo) == 2 and memo.num_blocks == 5
    assert memo.chain(ROOT, bytes(bytearray(same_key)), WIDTH) is replaced


def test_a_prompt_without_markers_is_hashed_without_the_memo():
    memo, prompt = SpanHashMemo(), list(range(10, 30))
    layout = span_layout(prompt, CONTROL, B)
    hashes, _ = block_hashes(prompt, B, ROOT, layout.marker_blocks, memo=memo)
    assert len(hashes) == 5 and len(memo) == 0  # one run, seldom met again whole: not remembered
    span_prompt = [10, 11, 12, PAD, S, 20, 21, 22, 23, 24, 25, 26, P, 30]
    block_hashes(span_prompt, B, ROOT, span_layout(span_prompt, CONTROL, B).marker_blocks, memo=memo)
    assert len(memo) == 1  # the two-block span is


def test_with_block_size_one_a_marker_at_index_one_still_follows_a_leading_segment():
    """With B = 1 (a positive power of two, so a valid block size) every index is a block start, so a marker may
    sit at index 1: the token before it is the leading segment (DESIGN §2: tokens before any marker), and the
    segments still partition the prompt from index 0."""
    token_ids = [10, S, 11, P, 12]
    layout = span_layout(token_ids, CONTROL, 1)
    assert [(s.kind, s.start, s.end, s.index) for s in layout.segments] == [
        (SegmentKind.LEADING, 0, 1, 0),
        (SegmentKind.SSEP, 1, 3, 1),
        (SegmentKind.PDEP, 3, 5, 2),
    ]
    assert layout.visible_start == (0, 1, 1, 0, 0)
    assert split_segments(3, [(1, SegmentKind.SSEP)]) == [
        Segment(SegmentKind.LEADING, 0, 1, 0),
        Segment(SegmentKind.SSEP, 1, 3, 1),
    ]


def test_check_markers_applies_position_free_semantics_unless_told_otherwise():
    """Position-free mode is the engine's default (`CacheConfig.position_free`), and so it is `check_markers`'s:
    without the argument a block-aligned marker takes effect and a misplaced one is an error, not a token."""
    assert check_markers([10, 11, 12, 13, S, 14], CONTROL, B) == [(4, SegmentKind.SSEP)]
    with pytest.raises(ValueError, match="at index 2 is not at a KV block start"):
        check_markers([10, 11, P, 12], CONTROL, B)


def test_segments_and_layouts_are_immutable_values():
    """A layout is made once per prompt and shared (a `Prompt`, its requests, their cached `span_segments`), so
    neither it nor its segments can be changed in place; segments compare and hash by value."""
    layout = span_layout([10, 11, 12, PAD, S, 20], CONTROL, B)
    seg = layout.segments[1]
    with pytest.raises(dataclasses.FrozenInstanceError):
        seg.end = 99
    with pytest.raises(dataclasses.FrozenInstanceError):
        layout.segments = ()  # NOTE: visible_start is derived from them
    assert {seg, Segment(SegmentKind.SSEP, 4, 6, 1)} == {seg}
