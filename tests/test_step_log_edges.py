"""Edges of the step log (step_log.py) that test_step_log leaves open: a decode past the prompt counts no prompt
tokens, a record counts the step's sequences, a recompute's answer tokens count apart from its new one (in a chunk
with a hole too), and a prompt may open with a span."""

from minipic_lite.chunks import ScheduledSeq, SchedulerOutput
from minipic_lite.config import ControlTokens
from minipic_lite.request import Request
from minipic_lite.sampling_params import SamplingParams
from minipic_lite.spans import span_layout
from minipic_lite.step_log import StepLog, count_tokens
from tests.sched_factory import ROOT

B = 4


def request(request_id: str, num_outputs: int = 0) -> Request:
    req = Request(request_id, list(range(10, 25)), SamplingParams(), B, ROOT)  # 15 prompt tokens
    for token in range(num_outputs):
        req.append_token(50 + token)
    return req


def test_a_decode_past_the_prompt_counts_no_prompt_tokens():
    req = request("a", num_outputs=2)
    out = SchedulerOutput([ScheduledSeq(req, [(16, 17)], 17, do_sample=True)])
    assert count_tokens(out) == (0, 0, 1, 0)


def test_a_record_counts_the_steps_sequences():
    a, b = request("a", 1), request("b", 1)
    log = StepLog()
    decodes = [ScheduledSeq(a, [(15, 16)], 16, do_sample=True), ScheduledSeq(b, [(15, 16)], 16, do_sample=True)]
    log.record(SchedulerOutput(decodes, num_steps=3), now=1.5)
    (record,) = log.records()
    assert (record.num_steps, record.num_seqs, record.num_decode_tokens, record.time) == (3, 2, 6, 1.5)
    assert record.num_recompute_tokens == 0


def test_a_recompute_counts_the_answer_tokens_computed_before_apart_from_the_new_one():
    """After a preemption one chunk recomputes the prompt and the answer so far: the answer's last token (sampled,
    never computed) is the decode that samples the next; the one before it had been computed once already."""
    req = request("a", num_outputs=2)
    out = SchedulerOutput([ScheduledSeq(req, [(0, 17)], 17, do_sample=True)])
    assert count_tokens(out) == (0, 15, 1, 1)


def test_a_recompute_in_chunks_counts_no_decode_until_its_last_chunk():
    """Past cached blocks (a hit up to 12) and in two chunks: the first samples nothing, so its answer tokens are
    all recomputed; the last samples, so its last token is the decode."""
    req = request("a", num_outputs=5)  # 20 tokens: 15 prompt, 5 answer
    first = SchedulerOutput([ScheduledSeq(req, [(12, 17)], 17, do_sample=False)])
    last = SchedulerOutput([ScheduledSeq(req, [(17, 20)], 20, do_sample=True)])
    assert count_tokens(first) == (0, 3, 0, 2) and count_tokens(last) == (0, 0, 1, 2)


def test_a_prompt_that_opens_with_an_ssep_span_counts_it_as_span_prefill():
    """A warm-up span prompt ([S doc pad] [P question]) has no leading segment: its first segment is a span."""
    token_ids = [1, 20, 21, 3, 2, 40, 41]
    layout = span_layout(token_ids, ControlTokens(ssep_id=1, pdep_id=2, pad_id=3), B, True)
    req = Request("s", token_ids, SamplingParams(), B, ROOT, layout)
    assert count_tokens(SchedulerOutput([ScheduledSeq(req, [(0, 7)], 7, do_sample=True)])) == (4, 3, 0, 0)


def test_a_recompute_with_a_hole_counts_its_decode_at_the_end_of_its_last_range():
    """A recompute chunk that skips a cached block: its last range ends at the token it samples from (the decode),
    the answer token before it was computed once already; the range before the hole holds no answer token."""
    req = request("a", num_outputs=2)  # 17 tokens: 15 prompt, 2 answer
    out = SchedulerOutput([ScheduledSeq(req, [(0, 4), (8, 17)], 17, do_sample=True)])  # block 1 is a hit
    assert count_tokens(out) == (0, 4 + 7, 1, 1)


def test_a_recompute_whose_answer_blocks_hit_counts_no_decode_before_its_hole():
    """Answer blocks hash as prompt blocks do, so a re-admission may hit one of them: the range before that hole
    ends past the prompt but is not the chunk's last, so its answer token was computed once already (a recompute);
    only the last range's last token is the decode."""
    req = request("a", num_outputs=9)  # 24 tokens: 15 prompt, 9 answer; block 4 ([16, 20)) is a hit
    out = SchedulerOutput([ScheduledSeq(req, [(0, 16), (20, 24)], 24, do_sample=True)])
    assert count_tokens(out) == (0, 15, 1, 1 + 3)
