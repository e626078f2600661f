"""Edges of the cache report (cache_report.py) that test_cache_report leaves open: a partial prompt block that
outputs completed later has no hash, and `*` marks a shared block, not a hit."""

from minipic_lite.cache_report import Admission, BlockReport, block_reports, format_report
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
