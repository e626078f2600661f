"""Edges of the sampler (sampler.py) that the main tests leave open: the temperature's effect on a seeded draw,
top-p alone in a batch, top-p over the top-k renormalized mass, and the top-p boundary. Seeded rows draw their
noise from `torch.Generator().manual_seed(seed)`, so a draw is recomputed here exactly."""

import torch

from minipic_lite.sampler import Sampler, apply_top_k_top_p
from minipic_lite.sampling_params import SamplingParams

VOCAB = 64


def draw(logits: torch.Tensor, params: list[SamplingParams]) -> list[int]:
    sampler = Sampler(torch.device("cpu"))
    return sampler(logits, sampler.prepare([str(i) for i in range(len(params))], params)).tolist()


def exponential_race(probs: torch.Tensor, seed: int) -> int:
    """The token a seeded row draws from `probs`: argmax(probs / E), E ~ Exponential(1) from the row's generator."""
    noise = torch.empty(probs.shape[-1]).exponential_(generator=torch.Generator().manual_seed(seed))
    return int((probs / noise).argmax())


def test_a_seeded_row_samples_from_the_softmax_of_its_logits_over_its_temperature():
    logits = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(0))
    for seed in range(10):
        params = [SamplingParams(temperature=0.3, seed=seed)]
        assert draw(logits, params) == [exponential_race((logits[0] / 0.3).softmax(-1), seed)]


def test_top_p_alone_cuts_its_row_in_a_batch_with_a_greedy_row():
    logits = torch.zeros(2, VOCAB)
    logits[:, 5] = 5.0  # token 5 holds ~70% of the mass: top-p 0.5 keeps it alone
    for seed in range(20):
        params = [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, top_p=0.5, seed=seed)]
        assert draw(logits, params) == [5, 5]


def test_top_p_reads_the_mass_that_top_k_leaves():
    logits = torch.tensor([[0.4, 0.3, 0.2, 0.1]]).log()
    # top-k 2 leaves 0.4 and 0.3, i.e. 4/7 and 3/7: the mass before the second (4/7) is past top-p 0.5
    masked = apply_top_k_top_p(logits, torch.tensor([2]), torch.tensor([0.5]))
    assert torch.isfinite(masked).tolist() == [[True, False, False, False]]


def test_top_p_drops_a_token_once_the_mass_before_it_reaches_top_p():
    logits = torch.zeros(1, 2)  # probabilities 0.5 and 0.5, exactly
    assert torch.isfinite(apply_top_k_top_p(logits, torch.tensor([0]), torch.tensor([0.5]))).tolist() == [[True, False]]
    assert torch.isfinite(apply_top_k_top_p(logits, torch.tensor([0]), torch.tensor([0.75]))).tolist() == [[True, True]]
