"""SpanHashMemo's block budget at its edges, and which prompts it remembers."""

from minipic_lite.config import ControlTokens
from minipic_lite.hashing import chain_hashes_bytes, root_hash, token_bytes
from minipic_lite.spans import SpanHashMemo, block_hashes, span_layout

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


def test_a_prompt_without_markers_is_hashed_without_the_memo():
    memo, prompt = SpanHashMemo(), list(range(10, 30))
    layout = span_layout(prompt, CONTROL, B)
    hashes, _ = block_hashes(prompt, B, ROOT, layout.marker_blocks, memo=memo)
    assert len(hashes) == 5 and len(memo) == 0  # one run, seldom met again whole: not remembered
    span_prompt = [10, 11, 12, PAD, S, 20, 21, 22, 23, 24, 25, 26, P, 30]
    block_hashes(span_prompt, B, ROOT, span_layout(span_prompt, CONTROL, B).marker_blocks, memo=memo)
    assert len(memo) == 1  # the two-block span is
