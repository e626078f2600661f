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


def test_greedy_rows_read_the_logits_dtype_as_it_is_and_sampled_rows_draw_in_float32():
    from minipic_lite.sampler import Sampler
    from minipic_lite.sampling_params import SamplingParams

    logits = torch.randn(3, 4096, generator=torch.Generator().manual_seed(1)).bfloat16()
    logits[0, [10, 4000]] = logits.max() + 1  # a tie: the first index, as in float32
    sampler = Sampler(torch.device("cpu"))
    greedy = sampler(logits, sampler.prepare(["a", "b", "c"], [SamplingParams(temperature=0.0)] * 3))
    assert torch.equal(greedy, logits.float().argmax(dim=-1)) and greedy[0] == 10
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, seed=5), SamplingParams(top_k=3, seed=5)]
    mixed = sampler(logits, sampler.prepare(["a", "b", "c"], params))
    assert mixed[0] == greedy[0] and mixed[2] in logits[2].float().topk(3).indices


def test_a_compiled_argmax_serves_every_call_and_is_warmed_up_for_each_row_count_and_dtype():
    from minipic_lite.sampler import Sampler
    from minipic_lite.sampling_params import SamplingParams

    calls = []

    def recording(fn):
        def wrapper(x):
            calls.append((x.shape[0], x.dtype))
            return fn(x)

        return wrapper

    sampler = Sampler(torch.device("cpu"), recording)
    sampler.warm_up(64, torch.bfloat16)
    assert calls == [(1, torch.bfloat16), (2, torch.bfloat16), (1, torch.float32), (2, torch.float32)]
    calls.clear()
    logits = torch.randn(2, 64).bfloat16()
    sampler(logits, sampler.prepare(["a", "b"], [SamplingParams(temperature=0.0), SamplingParams(seed=1)]))
    assert calls == [(2, torch.bfloat16), (2, torch.float32)]  # the greedy rows, then the sampled draw
