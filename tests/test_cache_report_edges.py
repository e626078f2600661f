"""Edges of the cache report (cache_report.py) that test_cache_report leaves open: a partial prompt block that
outputs completed later has no hash, `*` marks a shared block, not a hit, hits in the totals, a report's length and
hit count read without building it, and segments past the labels given."""

from minipic_lite.cache_report import Admission, BlockReport, CacheReport, block_reports, format_report, report_totals
from minipic_lite.spans import Segment, SegmentKind

B = 4


def test_a_partial_prompt_block_has_no_hash_even_once_outputs_filled_it():
    # a 6-token prompt re-admitted after 2 outputs: block 1 is full now and hashed, but holds outputs
    admission = Admission(
        num_prompt_tokens=6, block_size=B, block_table=(7, 8), ref_cnts=(1, 1), hit_blocks=frozenset({0}),
        block_hashes=(b"\x01" * 32, b"\x02" * 32), segments=(Segment(SegmentKind.LEADING, 0, 6, 0),), labels=(),
    )  # fmt: skip
    blocks = block_reports(admission)
    assert [(b.start, b.end, b.hash, b.status) for b in blocks] == [(0, 4, "01" * 32, "hit"), (4, 6, None, "computed")]


def test_format_report_marks_shared_blocks_and_not_unshared_hits():
    hit = BlockReport(0, 0, 4, 5, "ab" * 32, "hit", 1, SegmentKind.SSEP, 1)
    shared = BlockReport(1, 4, 8, 6, "cd" * 32, "computed", 2, SegmentKind.SSEP, 1)
    lines = format_report([hit, shared]).splitlines()
    assert lines[1].split()[5] == "1" and lines[2].split()[5] == "2*"  # block, [start, end), hash, status, ref


def two_block_admission(labels=()):
    """[0, 4) leading, hit; [4, 8) SSEP, computed."""
    return Admission(
        num_prompt_tokens=8, block_size=B, block_table=(7, 8), ref_cnts=(2, 1), hit_blocks=frozenset({0}),
        block_hashes=(b"\x01" * 32, b"\x02" * 32), labels=labels,
        segments=(Segment(SegmentKind.LEADING, 0, 4, 0), Segment(SegmentKind.SSEP, 4, 8, 1)),
    )  # fmt: skip


def test_hits_are_the_blocks_taken_from_the_cache_in_the_totals_too():
    blocks = [BlockReport(i, 4 * i, 4 * i + 4, i, None, "hit", 1, SegmentKind.SSEP, 1) for i in range(3)]
    blocks.append(BlockReport(3, 12, 14, 3, None, "computed", 2, SegmentKind.PDEP, 2))
    assert [b.is_hit for b in blocks] == [True, True, True, False]
    assert report_totals(blocks) == {
        "num_blocks": 4, "num_hit_blocks": 3, "num_computed_blocks": 1, "num_shared_blocks": 1, "hit_rate": 0.75,
    }  # fmt: skip


def test_the_length_and_hit_count_of_a_report_do_not_build_its_blocks():
    """The engine counts hits of every admission: that must not build the per-block report nobody reads."""
    report = CacheReport(two_block_admission())
    assert (len(report), report.num_hit_blocks) == (2, 1)
    assert report._blocks is None
    assert [(b.status, b.is_shared) for b in report] == [("hit", True), ("computed", False)]


def test_segments_past_the_labels_given_are_unlabelled():
    """A hand-made Prompt may label only its first segments: the rest report no label (not an IndexError)."""
    assert [b.label for b in block_reports(two_block_admission(labels=("system",)))] == ["system", None]
