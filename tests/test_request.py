"""The request record and the hashes it carries (pure: no model)."""

import hashlib

import numpy as np
import pytest
import torch

from minipic_lite.hashing import (
    TOKEN_BYTES,
    chain_hashes,
    chain_hashes_bytes,
    hash_block,
    hash_block_bytes,
    root_hash,
    token_bytes,
)
from minipic_lite.request import Request, RequestStatus
from minipic_lite.sampler import Sampler
from minipic_lite.sampling_params import SamplingParams

ROOT = root_hash("test_request")


def test_hash_block_is_sha256_of_parent_and_int64_tokens():
    expected = hashlib.sha256(ROOT + np.array([1, 2, 3], dtype="<i8").tobytes()).digest()
    assert hash_block(ROOT, [1, 2, 3]) == expected
    assert root_hash("a") != root_hash("b")
    h0 = hash_block(ROOT, [1, 2])
    assert chain_hashes(ROOT, [1, 2, 3, 4, 5], 2) == [h0, hash_block(h0, [3, 4])]  # the partial tail: none


def test_token_bytes_are_int64_little_endian_and_hash_as_the_tokens_do():
    assert token_bytes([1, 258]) == bytes([1, 0, 0, 0, 0, 0, 0, 0, 2, 1, 0, 0, 0, 0, 0, 0])
    data = token_bytes([1, 2, 3, 4])
    assert hash_block_bytes(ROOT, data[16:]) == hash_block(ROOT, [3, 4])


def test_chain_hashes_bytes_gives_a_partial_tail_no_hash():
    """The packed form hashes full blocks only, as `chain_hashes` does: a tail shorter than a block (here 1 of 2
    tokens) gets none, even when the caller passes its bytes (spans.block_hashes slices runs off packed prompts)."""
    width = 2 * TOKEN_BYTES
    h0 = hash_block(ROOT, [1, 2])
    assert chain_hashes_bytes(ROOT, token_bytes([1, 2, 3, 4, 5]), width) == [h0, hash_block(h0, [3, 4])]
    assert chain_hashes_bytes(ROOT, token_bytes([1]), width) == [] == chain_hashes_bytes(ROOT, b"", width)


def test_request_hashes_blocks_as_they_fill_and_resets_for_recompute():
    req = Request("r", [1, 2, 3], SamplingParams(max_tokens=4), 2, ROOT)
    assert len(req.block_hashes) == 1 and req.num_prompt_tokens == 3 and req.visible_start is None
    req.append_token(9)
    assert req.block_hashes == chain_hashes(ROOT, [1, 2, 3, 9], 2)
    assert req.output_token_ids == [9] and req.num_output_tokens == 1 and req.prompt_token_ids == [1, 2, 3]
    req.block_table, req.cached_block_ids, req.num_computed_tokens = [4, 5], {0}, 4
    req.reset_for_recompute()
    assert (req.block_table, req.cached_block_ids, req.num_computed_tokens) == ([], set(), 0)
    assert req.status == RequestStatus.WAITING and req.num_preemptions == 1 and req.token_ids == [1, 2, 3, 9]


def test_sampler_greedy_rows_and_per_request_seeds():
    sampler = Sampler(torch.device("cpu"))
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, seed=7), SamplingParams(seed=7)]
    batch = sampler.prepare(["g", "s1", "s2"], params)
    first = sampler(logits, batch)
    assert first[0] == logits[0].argmax()
    sampler.forget("s1")  # a fresh generator for s1 replays its seed; s2's stream moved on
    again = sampler(logits, sampler.prepare(["g", "s1", "s2"], params))
    assert again[0] == first[0] and again[1] == first[1]
    draws = [sampler(logits, sampler.prepare(["g", "s1", "s2"], params))[2].item() for _ in range(20)]
    assert len(set(draws)) > 1  # s2 keeps sampling from its own generator


def test_a_span_prefill_takes_its_prompts_hashes_of_its_spans_which_equal_them_hashed_alone():
    from minipic_lite.config import ControlTokens
    from minipic_lite.spans import span_layout

    control = ControlTokens(ssep_id=1, pdep_id=2, pad_id=3)
    doc1, doc2, doc3 = [1, 30, 31, 32, 33, 34, 35, 36], [1, 40, 41, 42], [1, 50, 51, 52]  # SSEP spans, blocks of 4
    prompt = [20, 21, 22, 3] + doc1 + doc2 + doc3 + [2, 60, 61]
    req = Request("r", prompt, SamplingParams(), 4, ROOT, span_layout(prompt, control, 4))
    first, second, third = req.span_segments()
    unit = req.span_prefill([first, third])  # doc2 left out: cached, or computed by another unit
    assert unit.token_ids == doc1 + doc3 and unit.request_id == "r/span1,3" and unit.is_span_prefill
    assert unit.visible_start == [0] * 8 + [8] * 4  # each span sees only itself, wherever it sits in the unit
    alone = Request("d", doc1 + doc3, SamplingParams(), 4, ROOT, span_layout(doc1 + doc3, control, 4))
    assert unit.block_hashes == req.block_hashes[1:3] + req.block_hashes[4:5] == alone.block_hashes
    assert unit.block_hashes is not req.block_hashes and unit.layout.marker_blocks == alone.layout.marker_blocks
    assert unit.layout.segments == alone.layout.segments


@pytest.mark.parametrize("num_tokens", [3, 9, 16], ids=["under-a-block", "a-block-and-more", "whole-blocks"])
def test_a_request_hashes_its_packed_prompt_as_its_tokens_also_after_it_grows(num_tokens):
    ids = list(range(40, 40 + num_tokens))
    packed = Request("a", list(ids), SamplingParams(), 4, b"root", prompt_bytes=token_bytes(ids))
    plain = Request("b", list(ids), SamplingParams(), 4, b"root")
    assert packed.block_hashes == plain.block_hashes and packed.prompt_bytes is None  # NOTE: dropped once hashed
    for token in range(7):
        packed.append_token(token)
        plain.append_token(token)
    assert packed.block_hashes == plain.block_hashes and len(plain.block_hashes) == (num_tokens + 7) // 4
    with pytest.raises(ValueError, match="prompt_bytes holds 8 bytes"):
        Request("c", list(ids), SamplingParams(), 4, b"root", prompt_bytes=token_bytes(ids[:1]))


@pytest.mark.parametrize(
    ("computed", "cached", "waiting", "expected"),
    [
        (0, set(), set(), 0),  # queued
        (0, {0, 1}, set(), 32),  # leading hits, before any chunk
        (16, {1, 3}, set(), 48),  # a document cached past the computed front counts at once
        (16, {1, 3}, {3}, 32),  # ... but not a block another request still computes
        (48, {1}, set(), 48),  # a cached block the chunks passed is in the front already
        (48, {3}, set(), 50),  # never past the prompt (50 tokens, a full block 3 of 16 cannot be: capped)
    ],
)
def test_prompt_tokens_in_cache_are_the_computed_front_and_the_cached_blocks_past_it(
    computed, cached, waiting, expected
):
    from minipic_lite.engine import prompt_tokens_in_cache

    req = Request("r", list(range(50)), SamplingParams(), 16, ROOT)
    req.num_computed_tokens, req.cached_block_ids, req.waiting_blocks = computed, set(cached), set(waiting)
    assert prompt_tokens_in_cache(req) == expected
