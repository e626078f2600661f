"""The per-request cache report (cache_report.py) on a scheduler with exact block ids (no model)."""

from minipic_lite.cache_report import BlockReport, block_segments, build_cache_report, format_report, report_totals
from minipic_lite.config import ControlTokens, SchedulerConfig
from minipic_lite.hashing import root_hash
from minipic_lite.kv_cache_manager import KVCacheManager
from minipic_lite.request import Request
from minipic_lite.sampling_params import SamplingParams
from minipic_lite.scheduler import Scheduler
from minipic_lite.spans import Segment, SegmentKind, span_layout

B = 4
S, P, PAD = 1, 2, 3
CONTROL = ControlTokens(ssep_id=S, pdep_id=P, pad_id=PAD)
ROOT = root_hash("test-cache-report")
DOC = [S, 30, 31, 32, 33, 34, PAD, PAD]  # an SSEP span of two blocks
LEAD, LEAD_B, QUESTION = [20, 21, 22, PAD], [25, 26, 27, PAD], [P, 60, 61]


def admit(sched, request_id, token_ids, labels=()):
    req = Request(request_id, token_ids, SamplingParams(max_tokens=1), B, ROOT, span_layout(token_ids, CONTROL, B))
    sched.add(req)
    sched.schedule()  # the report is read right after the step that admits the request is scheduled
    report = build_cache_report(req, sched.kv.pool, req.layout.segments, labels)
    sched.finish(req, "stop")
    sched.kv.check_integrity()
    return req, report


def test_a_cached_span_at_another_offset_reports_hits_with_the_same_hashes():
    sched = Scheduler(SchedulerConfig(4, 256, 1024), KVCacheManager(16))
    first, r1 = admit(sched, "a", LEAD + DOC + QUESTION, ("system", "doc", "question"))
    assert [(b.index, b.start, b.end, b.block_id, b.status, b.ref_cnt) for b in r1] == [
        (0, 0, 4, 0, "computed", 1),
        (1, 4, 8, 1, "computed", 1),
        (2, 8, 12, 2, "computed", 1),
        (3, 12, 15, 3, "computed", 1),  # the partial last block: never cached, no hash
    ]
    assert [(b.kind, b.span_id, b.label) for b in r1] == [
        (SegmentKind.LEADING, 0, "system"),
        (SegmentKind.SSEP, 1, "doc"),
        (SegmentKind.SSEP, 1, "doc"),
        (SegmentKind.PDEP, 2, "question"),
    ]
    assert [b.hash for b in r1] == [h.hex() for h in first.block_hashes[:3]] + [None]
    assert r1[0].short_hash == r1[0].hash[:12] and r1[3].short_hash is None
    # the same document after another leading segment: its two blocks hit, at the same physical blocks
    _, r2 = admit(sched, "b", LEAD_B + DOC + QUESTION)
    assert [(b.block_id, b.status) for b in r2] == [(4, "computed"), (1, "hit"), (2, "hit"), (5, "computed")]
    assert [b.hash for b in r2[1:3]] == [b.hash for b in r1[1:3]]
    assert all(b.label is None for b in r2)  # no labels given
    assert report_totals(r2) == {
        "num_blocks": 4,
        "num_hit_blocks": 2,
        "num_computed_blocks": 2,
        "num_shared_blocks": 0,
        "hit_rate": 0.5,
    }


def test_a_block_held_by_another_running_request_is_reported_shared():
    sched = Scheduler(SchedulerConfig(4, 256, 1024), KVCacheManager(16))
    a = Request("a", LEAD + DOC + QUESTION, SamplingParams(), B, ROOT, span_layout(LEAD + DOC + QUESTION, CONTROL, B))
    sched.add(a)
    sched.schedule()  # a keeps running: its blocks stay referenced
    _, report = admit(sched, "b", LEAD_B + DOC + QUESTION)
    assert [(b.status, b.ref_cnt, b.is_shared) for b in report] == [
        ("computed", 1, False),
        ("hit", 2, True),
        ("hit", 2, True),
        ("computed", 1, False),
    ]
    assert report_totals(report)["num_shared_blocks"] == 2


def test_the_report_is_read_at_admission_and_built_when_first_read():
    sched = Scheduler(SchedulerConfig(4, 256, 1024), KVCacheManager(16))
    admit(sched, "a", LEAD + DOC + QUESTION)
    b = Request(
        "b", LEAD_B + DOC + QUESTION, SamplingParams(), B, ROOT, span_layout(LEAD_B + DOC + QUESTION, CONTROL, B)
    )
    sched.add(b)
    sched.schedule()
    report = build_cache_report(b, sched.kv.pool, b.layout.segments)
    sched.preempt(b)  # its blocks, hits and refs change after admission: the report keeps what it read then
    assert report._blocks is None and len(report) == 4 and report.num_hit_blocks == 2  # nothing built yet
    assert [(blk.block_id, blk.status, blk.ref_cnt) for blk in report] == [(4, "computed", 1), (1, "hit", 1),
                                                                         (2, "hit", 1), (5, "computed", 1)]  # fmt: skip
    assert report[-1] is report.blocks[-1] and repr(report) == repr(report.blocks)
    assert report == report.blocks and report != tuple(report.blocks)
    sched.kv.check_integrity()


def test_format_report_is_one_fixed_width_line_per_block_with_shared_marked():
    report = [
        BlockReport(0, 0, 4, 7, "3fa2c1d09b7e" + "0" * 52, "computed", 1, SegmentKind.LEADING, 0, "system"),
        BlockReport(1, 4, 8, 9, "9c04e1aa52d3" + "f" * 52, "hit", 2, SegmentKind.SSEP, 1, "doc 0"),
        BlockReport(2, 8, 10, 3, None, "computed", 1, SegmentKind.PDEP, 2),
    ]
    assert format_report(report).splitlines() == [
        "block  tokens      hash          status    ref  kind     span  label",
        "    0  [0, 4)      3fa2c1d09b7e  computed  1    leading  0     system",
        "    1  [4, 8)      9c04e1aa52d3  hit       2*   ssep     1     doc 0",
        "    2  [8, 10)     -             computed  1    pdep     2     ",
    ]
    assert report_totals([]) == {
        "num_blocks": 0,
        "num_hit_blocks": 0,
        "num_computed_blocks": 0,
        "num_shared_blocks": 0,
        "hit_rate": 0.0,
    }


def test_each_block_belongs_to_the_segment_of_its_first_token():
    lead, doc, question = (Segment(SegmentKind.LEADING, 0, 4, 0), Segment(SegmentKind.SSEP, 4, 12, 1),
                           Segment(SegmentKind.PDEP, 12, 15, 2))  # fmt: skip
    assert block_segments([lead, doc, question], B) == [lead, doc, doc, question]  # the partial last block too
    assert block_segments([Segment(SegmentKind.LEADING, 0, 9, 0)], B) == [Segment(SegmentKind.LEADING, 0, 9, 0)] * 3


def test_a_readmission_with_outputs_reports_only_the_prompt_blocks_hits():
    """A request preempted after it generated is admitted again with its outputs: hits past the prompt are not in
    its report (the plain statement: the cached blocks within the prompt's)."""
    kv = KVCacheManager(16)
    req = Request("r", [10, 11, 12, 13, 14, 15, 16], SamplingParams(), B, ROOT)
    for token in (17, 18, 19, 20, 21):
        req.append_token(token)
    req.block_table, req.cached_block_ids = [3, 4, 5], {0, 1, 2}
    report = build_cache_report(req, kv.pool, [Segment(SegmentKind.LEADING, 0, 7, 0)])
    assert len(report) == 2 and report.admission.hit_blocks == frozenset({0, 1, 2}).intersection(range(2))
