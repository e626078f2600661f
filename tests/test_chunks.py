"""SchedulerOutput.is_decode_only: one query token is a decode only when it samples."""

from minipic_lite.chunks import ScheduledSeq, SchedulerOutput
from minipic_lite.hashing import root_hash
from minipic_lite.request import Request
from minipic_lite.sampling_params import SamplingParams

ROOT = root_hash("test-chunks-edges")


def test_a_one_token_chunk_that_samples_nothing_is_no_decode():
    seq = Request("a", list(range(10, 19)), SamplingParams(), 4, ROOT)
    prefill_tail = ScheduledSeq(seq, [(7, 8)], 8, do_sample=False)  # a chunk cut by the budget, one token short
    decode = ScheduledSeq(seq, [(8, 9)], 9, do_sample=True)
    assert SchedulerOutput([decode]).is_decode_only
    assert not SchedulerOutput([prefill_tail]).is_decode_only
    assert not SchedulerOutput([decode, prefill_tail]).is_decode_only
    assert not SchedulerOutput([]).is_decode_only
