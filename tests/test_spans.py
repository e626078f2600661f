"""Span semantics as pure functions (segments, visible_start, the two hash chains, validation) and per-block
reuse of spans in the scheduler (no model). The composer that writes span prompts: test_prompts.py."""

import hashlib
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minipic_lite.config import ControlTokens, SchedulerConfig
from minipic_lite.hashing import chain_hashes, chain_hashes_bytes, hash_block_bytes, root_hash, token_bytes
from minipic_lite.kv_cache_manager import KVCacheManager
from minipic_lite.request import Request
from minipic_lite.sampling_params import SamplingParams
from minipic_lite.scheduler import Scheduler
from minipic_lite.spans import (
    HashState,
    SegmentKind,
    SpanHashMemo,
    VisibleStarts,
    block_hashes,
    check_markers,
    find_markers,
    indices_of,
    marker_runs,
    next_block_hash,
    prompt_block_hashes,
    run_chain,
    span_layout,
    visible_starts,
)
from tests import span_oracle

B = 4
S, P, PAD = 1, 2, 3  # control token ids in these tests
CONTROL = ControlTokens(ssep_id=S, pdep_id=P, pad_id=PAD)
ROOT = root_hash("test-spans")


def hashes(token_ids, position_free=True):
    return prompt_block_hashes(token_ids, CONTROL, B, ROOT, position_free)


def span(marker, *tokens):
    """One block-aligned span: marker + tokens, padded to a multiple of B."""
    ids = [marker, *tokens]
    return ids + [PAD] * (-len(ids) % B)


# -- strategies ----------------------------------------------------------------------------------------------

plain_tokens = st.integers(10, 14)  # a tiny alphabet: equal blocks (and equal contexts) happen often


@st.composite
def span_prompts(draw, max_blocks=8):
    """Token ids whose blocks each start with SSEP, PDEP or a plain token, plus a partial tail."""
    token_ids = []
    for _ in range(draw(st.integers(0, max_blocks))):
        first = draw(st.sampled_from([S, P, 10, 11]))
        token_ids += [first, *draw(st.lists(plain_tokens, min_size=B - 1, max_size=B - 1))]
    tail = draw(st.lists(plain_tokens, max_size=B - 1))
    return token_ids + tail or [10]


def context_key(token_ids, b):
    """What block b's KV is a function of: the tokens it can see (whose markers are block aligned), from its
    segment's visible start to the block's end (by DESIGN §2 as tests/span_oracle.py restates it)."""
    return span_oracle.block_contexts(token_ids, span_oracle.visible_starts(token_ids, S, P), B)[b]


# -- segments and visible_start ------------------------------------------------------------------------------


@given(span_prompts())
def test_segments_partition_the_prompt_and_visible_start_follows_them(token_ids):
    layout = span_layout(token_ids, CONTROL, B)
    segments = layout.segments
    assert segments[0].start == 0 and segments[-1].end == len(token_ids)
    assert all(a.end == b.start for a, b in zip(segments, segments[1:], strict=False))
    assert [s.index for s in segments] == list(range(len(segments)))
    for seg in segments:
        assert seg.start < seg.end
        first = token_ids[seg.start]
        assert (seg.kind is SegmentKind.LEADING) == (first not in (S, P))
        assert seg.kind is SegmentKind.LEADING or seg.start % B == 0
        inner = token_ids[seg.start + 1 : seg.end]
        assert S not in inner and P not in inner  # a marker always opens a segment
        expected = seg.start if seg.kind is SegmentKind.SSEP else 0
        assert layout.visible_start[seg.start : seg.end] == (expected,) * (seg.end - seg.start)
    assert all(v <= i for i, v in enumerate(layout.visible_start))
    assert list(layout.visible_start) == span_oracle.visible_starts(token_ids, S, P)  # DESIGN §2, restated
    assert layout.has_spans == any(t in (S, P) for t in token_ids)


@given(span_prompts(), st.integers(0, 3 * B), st.data())
def test_visible_starts_read_by_ranges_equal_the_oracle_and_generated_tokens_continue_the_last_segment(
    token_ids, num_generated, data
):
    """The engine reads visible_start by ranges (a step's chunk), from the segments: each range, index and slice of
    `VisibleStarts` equals the oracle's list per token, also past the prompt, where generated tokens continue the
    last segment, and the view grows with the sequence."""
    segments = span_layout(token_ids, CONTROL, B).segments
    tokens = list(token_ids)
    view = VisibleStarts(segments, tokens)
    oracle = span_oracle.visible_starts(token_ids, S, P)
    tokens += [10] * num_generated
    expected = oracle + [oracle[-1]] * num_generated
    start = data.draw(st.integers(0, len(tokens)))
    end = data.draw(st.integers(start, len(tokens)))
    assert visible_starts(segments, start, end) == expected[start:end]
    assert len(view) == len(tokens) and view == expected and list(view) == expected
    assert view[start:end] == expected[start:end] and view[::2] == expected[::2] and view[end:start] == []
    index = data.draw(st.integers(-len(tokens), len(tokens) - 1))
    assert view[index] == expected[index]
    with pytest.raises(IndexError):
        view[len(tokens)]


def test_visible_starts_compare_as_the_list_they_stand_for_and_show_it():
    """`VisibleStarts` equals the list (or tuple) of its values and nothing else: not a list that differs in any
    value (the last too) or in its length, not a string, not what is no sequence; its repr shows the list."""
    token_ids = [20, 21, 22, PAD, *span(S, 30, 31, 32), P, 50]  # [leading] [SSEP span at 4] [PDEP at 8]
    view = VisibleStarts(span_layout(token_ids, CONTROL, B).segments, token_ids)
    expected = [0, 0, 0, 0, 4, 4, 4, 4, 0, 0]
    assert view == expected and view == tuple(expected)
    for other in ([0] * 10, expected[:-1] + [4], expected[:-1], [*expected, 0], "0000444400", 0, None):
        assert view != other
    assert repr(view) == f"VisibleStarts({expected!r})"


def test_segments_of_a_block_attention_prompt():
    token_ids = [20, 21, 22, PAD, *span(S, 30, 31, 32, 33), *span(S, 40), P, 50, 51]
    layout = span_layout(token_ids, CONTROL, B)
    assert [(s.kind.value, s.start, s.end) for s in layout.segments] == [
        ("leading", 0, 4),
        ("ssep", 4, 12),
        ("ssep", 12, 16),
        ("pdep", 16, 19),
    ]
    assert layout.visible_start == (0,) * 4 + (4,) * 8 + (12,) * 4 + (0,) * 3
    assert dict(layout.marker_blocks) == {1: SegmentKind.SSEP, 3: SegmentKind.SSEP, 4: SegmentKind.PDEP}


# -- validation ----------------------------------------------------------------------------------------------


@given(st.integers(0, 30).filter(lambda i: i % B), st.sampled_from([S, P]))
def test_a_marker_off_a_block_start_is_an_error_naming_its_index(index, marker):
    token_ids = [10] * 32
    token_ids[index] = marker
    with pytest.raises(ValueError, match=rf"at index {index} is not at a KV block start"):
        span_layout(token_ids, CONTROL, B)


def test_markers_without_position_free_mode():
    token_ids = [10, 11, 12, 13, S, 14, 15, 16]
    assert check_markers(token_ids, CONTROL, B, position_free=False) == []  # ordinary tokens
    with pytest.raises(ValueError, match="SSEP at index 4: span semantics need position_free=True"):
        check_markers(token_ids, CONTROL, B, position_free=False, require_spans=True)
    misplaced = [10, P, 11]  # not even at a block start: with position-free off it is still just a token
    assert span_layout(misplaced, CONTROL, B, position_free=False).visible_start == (0, 0, 0)


def test_markers_are_found_in_index_order_and_ssep_wins_when_both_ids_are_one():
    assert list(indices_of([7, 1, 7, 7], 7)) == [0, 2, 3] and list(indices_of((1, 2), 9)) == []
    assert find_markers([S, 10, P, S, S], CONTROL) == [
        (0, SegmentKind.SSEP),
        (2, SegmentKind.PDEP),
        (3, SegmentKind.SSEP),
        (4, SegmentKind.SSEP),
    ]
    assert find_markers([P, S], ControlTokens(ssep_id=P, pdep_id=P)) == [(0, SegmentKind.SSEP)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([S, P, 0, 256, S << 8, S << 16, P << 8, (S << 8) + 5, 7, 2**40]), max_size=40))
def test_markers_found_in_the_packed_bytes_equal_those_found_in_the_list(token_ids):
    # NOTE: S << 8 followed by 0 or 256 packs S's 8-byte pattern across two tokens, one byte off: not a marker
    data = token_bytes(token_ids)
    assert find_markers(token_ids, CONTROL, data) == find_markers(token_ids, CONTROL)
    try:
        expected = span_layout(token_ids, CONTROL, B)
    except ValueError as e:  # a marker off a block start: the same error
        with pytest.raises(ValueError, match=re.escape(str(e))):
            span_layout(token_ids, CONTROL, B, data=data)
    else:
        assert span_layout(token_ids, CONTROL, B, data=data) == expected


def test_a_marker_pattern_across_two_tokens_is_not_a_marker():
    token_ids = [S << 8, 0, 5, S]  # bytes 1..8 spell S as an int64: a match one byte off the token grid
    assert token_bytes(token_ids).find(token_bytes([S])) == 1
    assert find_markers(token_ids, CONTROL, token_bytes(token_ids)) == [(3, SegmentKind.SSEP)]


def test_no_control_tokens_means_no_markers():
    assert span_layout([S, P, PAD, 10, S], ControlTokens(), B).has_spans is False


# -- hashes --------------------------------------------------------------------------------------------------


@given(st.lists(plain_tokens, max_size=40))
def test_without_markers_hashes_are_the_plain_prefix_chain(token_ids):
    assert hashes(token_ids) == chain_hashes(ROOT, token_ids, B)


@given(span_prompts())
def test_with_position_free_off_markers_hash_as_ordinary_tokens(token_ids):
    assert hashes(token_ids, position_free=False) == chain_hashes(ROOT, token_ids, B)


@given(span_prompts(), span_prompts(), st.lists(plain_tokens, min_size=1, max_size=9))
def test_an_ssep_span_hashes_the_same_after_any_prefix(prefix_a, prefix_b, body):
    doc = span(S, *body)
    pad = lambda ids: ids + [PAD] * (-len(ids) % B)  # noqa: E731
    a, b = pad(prefix_a) + doc, pad(prefix_b) + doc
    num = len(doc) // B
    assert hashes(a)[-num:] == hashes(b)[-num:] == hashes(doc)


def test_pdep_blocks_depend_on_every_earlier_token_even_inside_earlier_spans():
    A, B_, C = span(S, 30, 31, 32), span(S, 40, 41, 42, 43, 44), span(S, 50, 51, 52)
    q = [P, 60, 61, 62, 63]
    a, c = hashes(A + B_ + q), hashes(C + B_ + q)
    assert a[1:3] == c[1:3]  # the B span: same wherever it sits
    assert a[0] != c[0] and a[3] != c[3]  # ... but the PDEP block sees what came before
    inside = A[:2] + [39] + A[3:]  # change one token inside the first span
    assert hashes(inside + B_ + q)[3] != a[3]
    assert hashes(A + B_ + q)[3] == a[3]  # and nothing else changes it


def test_blocks_after_a_pdep_block_chain_from_it():
    base = span(S, 30, 31) + [P, 60, 61, 62, 63, 64, 65, 66]
    other = span(S, 30, 32) + [P, 60, 61, 62, 63, 64, 65, 66]
    assert hashes(base)[2] != hashes(other)[2]


@settings(max_examples=60)
@given(span_prompts(), span_prompts())
def test_two_blocks_share_a_hash_exactly_when_they_see_the_same_tokens(x, y):
    hx, hy = hashes(x), hashes(y)
    blocks = [(x, b, h) for b, h in enumerate(hx)] + [(y, b, h) for b, h in enumerate(hy)]
    for ids1, b1, h1 in blocks:
        for ids2, b2, h2 in blocks:
            assert (h1 == h2) == (context_key(ids1, b1) == context_key(ids2, b2))


@given(span_prompts(max_blocks=5), st.lists(st.sampled_from([S, P, 10, 11]), max_size=14), st.integers(1, 8))
def test_sequence_hashes_incrementally_and_generated_tokens_continue_the_last_segment(prompt, generated, split):
    layout = span_layout(prompt, CONTROL, B)
    seq = Request(
        0,
        list(prompt),
        SamplingParams(),
        B,
        ROOT,
        layout=layout,
    )
    for t in generated:
        seq.append_token(t)
    full = prompt + generated
    assert seq.block_hashes == block_hashes(full, B, ROOT, layout.marker_blocks)[0]
    expected = list(layout.visible_start) + [layout.visible_start[-1]] * len(generated)
    assert seq.visible_start == (expected if layout.has_spans else None)  # None: every token sees from 0
    # a prompt without markers: exactly today's chained hashes, whatever it generates
    plain = Request(1, [10] * split, SamplingParams(), B, ROOT)
    for t in generated:
        plain.append_token(t)
    assert plain.block_hashes == chain_hashes(ROOT, [10] * split + generated, B)


def plain_block_hashes(token_ids, root, markers, state=None, first_block=0):
    """The plain statement: `next_block_hash` once per full block (what `block_hashes` computes chain by chain)."""
    state, hashes = state or HashState(root), []
    for i in range(len(token_ids) // B):
        block_bytes = token_bytes(token_ids[i * B : (i + 1) * B])
        block_hash, state = next_block_hash(state, root, block_bytes, markers.get(first_block + i))
        hashes.append(block_hash)
    return hashes, state


@given(span_prompts(max_blocks=10), st.lists(st.integers(0, 12), max_size=3), st.booleans())
def test_block_hashes_chain_by_chain_equal_the_plain_block_by_block_statement(prompt, cuts, with_memo):
    """Hashed whole or in pieces (a growing sequence), with or without the memo: exactly `next_block_hash`."""
    markers = span_layout(prompt, CONTROL, B).marker_blocks
    expected, expected_state = plain_block_hashes(prompt, ROOT, markers)
    memo = SpanHashMemo() if with_memo else None
    for _ in range(2):  # the second time, the memo has every span
        assert block_hashes(prompt, B, ROOT, markers, memo=memo) == (expected, expected_state)
    hashes, state, first = [], None, 0
    for cut in [*sorted(cuts), len(prompt) // B]:
        cut = max(first, min(cut, len(prompt) // B))
        new, state = block_hashes(prompt[first * B : cut * B], B, ROOT, markers, state, first, memo)
        hashes, first = hashes + new, cut
    assert hashes == expected and (not hashes or state == expected_state)


def test_block_hashes_of_a_known_prompt():
    """Spelled out for one prompt (B = 4): S at block 1 resets h, P at block 3 takes d, which after the SSEP
    segment is H(d before it, the segment's last h)."""
    prompt = [10, 11, 12, 13, *span(S, 5, 6, 7, 8, 9, 10), *span(P, 4)]
    x = [token_bytes(prompt[i : i + B]) for i in range(0, len(prompt), B)]
    H = hash_block_bytes
    h0 = H(ROOT, x[0])  # the leading segment: h chains from the root, and d == h
    h1 = H(ROOT, x[1])
    h2 = H(h1, x[2])
    d2 = hashlib.sha256(b"d" + h0 + h2).digest()
    expected = [h0, h1, h2, H(d2, x[3])]
    hashes, state = block_hashes(prompt, B, ROOT, span_layout(prompt, CONTROL, B).marker_blocks)
    assert hashes == expected and state == HashState(expected[3])
    assert marker_runs({1: SegmentKind.SSEP, 3: SegmentKind.PDEP}, 0, 4) == [
        (0, 1, None),
        (1, 3, SegmentKind.SSEP),
        (3, 4, SegmentKind.PDEP),
    ]
    assert marker_runs({1: SegmentKind.SSEP, 3: SegmentKind.PDEP}, 2, 3) == [(0, 1, None), (1, 3, SegmentKind.PDEP)]
    assert HashState(h2, h0).digest() == d2 != h2


def chains(memo: SpanHashMemo) -> list:
    """The chains a memo keeps, oldest first."""
    return [hashes for _, hashes in memo._chains.values()]


def test_span_hash_memo_keeps_the_most_recent_chains_up_to_its_block_budget():
    memo, width = SpanHashMemo(max_blocks=5), B * 8
    a, b, c = (token_bytes(list(range(start, start + 2 * B))) for start in (0, 100, 200))  # 2 blocks each

    def chain(parent, run):
        return memo.chain(parent, run, width)

    for data in (a, b, a, c):  # a is used again before c comes: b is the oldest when c needs room
        assert chain(ROOT, data) == chain_hashes_bytes(ROOT, data, width)
    assert len(memo) == 2 and memo.num_blocks == 4
    kept = chains(memo)
    assert chain(ROOT, a) is kept[0] and chains(memo) == kept[::-1]  # served, now the newest
    other = root_hash("other")  # the same run after another parent: another chain
    assert chain(other, a) == chain_hashes_bytes(other, a, width) != chain(ROOT, a)
    assert chain(ROOT, bytes(bytearray(a))) is kept[0]  # another bytes object of the same run: the same chain
    num_chains, d = len(memo), token_bytes(list(range(300, 300 + B)))
    assert run_chain(memo, ROOT, d, width) == chain_hashes_bytes(ROOT, d, width)
    assert len(memo) == num_chains  # one block: hashed, never remembered


def test_span_hash_memo_hashes_a_chain_longer_than_its_budget_and_keeps_what_it_had():
    """A run of more blocks than the memo holds is hashed (exactly) but not remembered: kept, it would have evicted
    every chain and then itself, leaving the memo empty."""
    memo, width = SpanHashMemo(max_blocks=5), B * 8
    a, c = (token_bytes(list(range(start, start + 2 * B))) for start in (0, 200))  # 2 blocks each
    long_run = token_bytes(list(range(500, 500 + 6 * B)))  # 6 blocks
    kept = [memo.chain(ROOT, data, width) for data in (a, c)]
    assert memo.chain(ROOT, long_run, width) == chain_hashes_bytes(ROOT, long_run, width)
    assert chains(memo) == kept and memo.num_blocks == 4


# -- per-block reuse of spans in the scheduler ---------------------------------------------------------------


def make_seq(seq_id, token_ids):
    layout = span_layout(token_ids, CONTROL, B)
    return Request(
        seq_id,
        list(token_ids),
        SamplingParams(max_tokens=4),
        B,
        ROOT,
        layout=layout,
    )


def run_step(sched):
    out = sched.schedule()
    sched.postprocess(out, [[7] if s.do_sample else [] for s in out.scheduled], lambda seq: False)
    sched.kv.check_integrity()
    return out


def test_a_span_computed_in_one_step_is_shared_at_another_offset_in_the_same_step():
    sched = Scheduler(SchedulerConfig(8, 256, 1024), KVCacheManager(32))
    pool = sched.kv.pool
    doc = span(S, 30, 31, 32, 33, 34)  # two blocks
    a = make_seq(0, [20, 21, 22, PAD] + doc + [P, 60, 61])  # doc at blocks 1-2
    b = make_seq(1, [25] * 8 + doc + [P, 60, 62])  # doc at blocks 2-3
    sched.add(a)
    sched.add(b)
    out = run_step(sched)
    assert a.block_table[1:3] == b.block_table[2:4]  # one physical copy, two offsets
    assert all(pool.blocks[i].ref_cnt == 2 for i in a.block_table[1:3])
    assert b.cached_block_ids == {2, 3}
    assert out.scheduled[1].query_ranges == [(0, 8), (16, 19)]  # b computes around the hole


def test_a_cached_span_after_a_missing_one_is_reused():
    sched = Scheduler(SchedulerConfig(8, 256, 1024), KVCacheManager(32))
    first, second = span(S, 30, 31, 32), span(S, 40, 41, 42)
    warm = make_seq(0, second)
    sched.add(warm)
    run_step(sched)
    sched.finish(warm, "stop")
    seq = make_seq(1, [20, 21, 22, 23] + first + second + [P, 50])
    sched.add(seq)
    out = run_step(sched)
    assert seq.cached_block_ids == {2}
    assert out.scheduled[0].query_ranges == [(0, 8), (12, 14)]
