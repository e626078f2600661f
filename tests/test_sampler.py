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


def test_the_sampler_draws_from_bf16_logits_what_it_draws_from_their_float32_copy():
    """Logits come in the model's dtype (the greedy argmax needs no float32 copy): greedy rows and seeded sampled rows
    (temperature, top-k, top-p) give the tokens of the same logits upcast first; a precomputed argmax is used as is."""
    from minipic_lite.sampler import Sampler
    from minipic_lite.sampling_params import SamplingParams

    logits = (torch.randn(4, 1000, generator=torch.Generator().manual_seed(0)) * 3).bfloat16()
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.8, seed=1),
        SamplingParams(temperature=1.2, top_k=20, seed=2),
        SamplingParams(temperature=0.7, top_p=0.9, seed=3),
    ]
    ids = ["a", "b", "c", "d"]

    def draw(x: torch.Tensor, greedy: torch.Tensor | None = None) -> list[int]:
        sampler = Sampler(torch.device("cpu"))  # NOTE: fresh generators: the same seeds draw the same noise
        return sampler(x, sampler.prepare(ids, params), greedy).tolist()

    tokens = draw(logits)
    assert tokens == draw(logits.float()) and tokens[0] == logits[0].float().argmax().item()
    assert tokens[1:] != logits[1:].float().argmax(dim=-1).tolist(), "the sampled rows did sample"
    marked = torch.tensor([7, 8, 9, 10])  # a precomputed argmax (a CUDA graph's): the greedy row takes it
    assert draw(logits, marked)[0] == 7 and draw(logits, marked)[1:] == tokens[1:]
