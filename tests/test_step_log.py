"""The step log's counts: prompt tokens inside SSEP spans, the rest of the prompt, decode tokens (x the burst) and
answer tokens recomputed after a preemption."""

from minipic_lite.chunks import ScheduledSeq, SchedulerOutput
from minipic_lite.config import ControlTokens
from minipic_lite.request import Request
from minipic_lite.sampling_params import SamplingParams
from minipic_lite.spans import span_layout
from minipic_lite.step_log import StepLog, count_tokens
from tests.sched_factory import ROOT

B = 4
CONTROL = ControlTokens(ssep_id=1, pdep_id=2, pad_id=3)


def span_request(request_id: str = "a") -> Request:
    """[10 11 12 13] [S 20 21 3] [S 30 3 3] [P 40 41]: leading 4, two SSEP spans of 4, a PDEP segment of 3."""
    token_ids = [10, 11, 12, 13, 1, 20, 21, 3, 1, 30, 3, 3, 2, 40, 41]
    layout = span_layout(token_ids, CONTROL, B, True)
    return Request(request_id, token_ids, SamplingParams(), B, ROOT, layout)


def test_prefill_chunks_with_holes_split_into_span_and_final_tokens():
    req = span_request()
    out = SchedulerOutput([ScheduledSeq(req, [(0, 6), (8, 15)], 15, do_sample=True)])  # block 1 is a hit (hole)
    assert count_tokens(out) == (2 + 4, 4 + 3, 0, 0)  # span: 4..6 and 8..12; final: 0..4 and 12..15


def test_decode_tokens_count_every_step_of_a_burst():
    req = span_request()
    req.append_token(50)
    out = SchedulerOutput([ScheduledSeq(req, [(15, 16)], 16, do_sample=True)], num_steps=4)
    assert count_tokens(out) == (0, 0, 4, 0)


def test_plain_prompts_have_no_span_tokens_and_the_log_is_bounded():
    plain = Request("p", list(range(10, 20)), SamplingParams(), B, ROOT)
    log = StepLog(maxlen=3)
    for _ in range(5):
        log.record(SchedulerOutput([ScheduledSeq(plain, [(0, 10)], 10, do_sample=True)]), now=0.0)
    records = log.records()
    assert [r.index for r in records] == [2, 3, 4] and [r.index for r in log.records(since=4)] == [4]
    assert (records[0].num_span_prefill_tokens, records[0].num_final_prefill_tokens) == (0, 10)
