"""Edges of the request record (request.py) that the main tests leave open: what a preemption resets, which SSEP
spans a prompt may compute ahead (a span prefill takes their hashes, hashing nothing again), and the visible start
of generated tokens."""

import pytest

from minipic_lite.config import ControlTokens
from minipic_lite.hashing import root_hash, token_bytes
from minipic_lite.request import Request, RequestStatus
from minipic_lite.sampling_params import SamplingParams
from minipic_lite.spans import span_layout

ROOT = root_hash("test_request_edges")
CONTROL = ControlTokens(ssep_id=1, pdep_id=2, pad_id=3)
B = 4


def test_reset_for_recompute_forgets_waiting_and_published_blocks_and_keeps_the_outputs():
    req = Request("r", [10, 11, 12, 13, 14], SamplingParams(max_tokens=4), B, ROOT)
    req.append_token(9)
    req.block_table, req.waiting_blocks, req.num_published_blocks = [4, 5], {1}, 1
    req.status = RequestStatus.RUNNING
    req.reset_for_recompute()
    assert req.waiting_blocks == set() and req.num_published_blocks == 0
    assert req.num_output_tokens == 1 and req.output_token_ids == [9]


def test_an_ssep_span_that_ends_the_prompt_is_not_computed_ahead():
    # [20 21 22 PAD] [S 30 31 32]: the span holds the last prompt token, which the request itself must compute
    prompt = [20, 21, 22, 3, 1, 30, 31, 32]
    req = Request("r", prompt, SamplingParams(), B, ROOT, span_layout(prompt, CONTROL, B))
    assert req.span_segments() == ()
    longer = prompt + [2, 40]  # a PDEP question after it: now the span can be computed ahead
    req = Request("s", longer, SamplingParams(), B, ROOT, span_layout(longer, CONTROL, B))
    assert [(s.start, s.end) for s in req.span_segments()] == [(4, 8)]


def test_a_preempted_running_request_waits_again():
    """A running request that is preempted goes back to waiting (the scheduler readmits only waiting requests)."""
    req = Request("r", [10, 11, 12], SamplingParams(), B, ROOT)
    req.status = RequestStatus.RUNNING
    req.reset_for_recompute()
    assert req.status == RequestStatus.WAITING and not req.is_finished and req.num_preemptions == 1


def test_packed_prompt_bytes_of_more_tokens_than_the_prompt_are_refused():
    """Packed bytes must be the prompt's own: 3 tokens' worth for a 2-token prompt is refused, not hashed."""
    with pytest.raises(ValueError, match="prompt_bytes holds 24 bytes, not 2 tokens$"):
        Request("r", [10, 11], SamplingParams(), B, ROOT, prompt_bytes=token_bytes([10, 11, 12]))


def test_a_token_generated_after_a_prompt_that_ends_on_its_ssep_marker_continues_that_span():
    """Generated tokens continue the last segment, also when the prompt's last token is the marker that opens it:
    [20 21 22 PAD] [S] sees from 4 on, and so does every token generated after it."""
    prompt = [20, 21, 22, 3, 1]
    req = Request("r", prompt, SamplingParams(), B, ROOT, span_layout(prompt, CONTROL, B))
    assert req.visible_start == [0, 0, 0, 0, 4]
    req.append_token(9)
    req.append_token(8)
    assert req.visible_start == [0, 0, 0, 0, 4, 4, 4]


def test_a_span_prefill_hashes_nothing_again(monkeypatch):
    """A span prefill takes its prompt's hashes of its spans' blocks: the spans are hashed once, with the prompt."""
    prompt = [20, 21, 22, 3, 1, 30, 31, 32, 1, 40, 41, 42, 2, 50]  # [head] [S doc1] [S doc2] [P 50]
    req = Request("r", prompt, SamplingParams(), B, ROOT, span_layout(prompt, CONTROL, B))
    _, doc2 = req.span_segments()

    def hash_again(*args, **kwargs):
        raise AssertionError("a span prefill hashed its blocks again")

    monkeypatch.setattr("minipic_lite.request.block_hashes", hash_again)
    unit = req.span_prefill([doc2])
    assert unit.token_ids == [1, 40, 41, 42] and unit.block_hashes == req.block_hashes[2:3]
