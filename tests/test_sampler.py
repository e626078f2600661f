"""sampler.argmax_rows: torch.argmax's answer, the first index of the maximum, from its two-pass form."""

import pytest
import torch

from minipic_lite.sampler import argmax_rows


@pytest.mark.parametrize("vocab", [49152, 128256, 1000, 96, 7])  # SmolLM2, Llama-3; groups of 8, 32; one pass
def test_argmax_rows_equals_torch_argmax_with_ties_infinities_and_nans(vocab):
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(9, vocab, generator=gen)
    top = logits.max().item() + 1.0
    logits[1, [3, vocab - 1]] = top  # a tie across groups: the first index wins
    logits[2, [vocab // 2, vocab // 2 + 1]] = top  # a tie inside one group
    logits[3] = float("-inf")  # nothing finite: index 0
    logits[4, [vocab - 2, 5 % vocab]] = float("nan")  # NaN counts as the maximum; the first one
    logits[5, :] = 0.5  # all equal
    logits[6, -1] = float("inf")
    logits[7] = logits[7].round()  # many ties among small integers
    logits[8, 0] = top  # the very first index
    torch.testing.assert_close(argmax_rows(logits), logits.argmax(dim=-1), rtol=0, atol=0)


def test_argmax_rows_reads_a_strided_view():
    logits = torch.randn(4, 2 * 512)[:, ::2]  # (4, 512), not contiguous
    torch.testing.assert_close(argmax_rows(logits), logits.argmax(dim=-1), rtol=0, atol=0)
