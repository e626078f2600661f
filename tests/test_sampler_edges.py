"""Edges of the sampler (sampler.py) that the main tests leave open: the temperature's effect on a seeded draw,
top-p alone in a batch, top-p over the top-k renormalized mass, the top-p boundary, top-k 1 alone, and the tensors
of a batch in which no row cuts. Seeded rows draw their noise from `torch.Generator().manual_seed(seed)`, so a draw
is recomputed here exactly."""

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


def test_a_seeded_row_draws_the_noise_of_its_own_seed():
    """Over equally likely tokens the draw is decided by the noise alone: each seed gives the token its own
    generator's noise picks (the seeds here give several different tokens, so another seed's noise would show)."""
    logits = torch.zeros(1, VOCAB)
    tokens = [draw(logits, [SamplingParams(temperature=1.0, seed=seed)])[0] for seed in range(10)]
    assert tokens == [exponential_race(torch.full((VOCAB,), 1 / VOCAB), seed) for seed in range(10)]
    assert len(set(tokens)) > 5


def test_an_unseeded_row_samples_every_likely_token_and_nothing_else():
    """Without a seed a row still samples: two equally likely tokens both come up over 40 draws, the rest never."""
    logits = torch.full((1, VOCAB), float("-inf"))
    logits[0, [3, 9]] = 0.0
    with torch.random.fork_rng():
        torch.manual_seed(0)  # NOTE: unseeded rows draw from torch's global generator; fixed here, not leaked
        tokens = {draw(logits, [SamplingParams(temperature=1.0)])[0] for _ in range(40)}
    assert tokens == {3, 9}


def test_top_k_alone_keeps_exactly_the_k_largest_whatever_the_rounding_of_their_mass():
    """top-k with top-p 1 keeps each row's k largest logits, unchanged, and masks the rest, also where the float32 sum
    of the k renormalized probabilities rounds below 1 (many of these rows)."""
    logits = torch.randn(200, 16, generator=torch.Generator().manual_seed(0))
    top_k = torch.tensor([1, 2, 3, 5, 8] * 40)
    masked = apply_top_k_top_p(logits, top_k, torch.ones(200))
    for row in range(200):
        expected = set(logits[row].topk(int(top_k[row])).indices.tolist())
        assert set(torch.isfinite(masked[row]).nonzero().flatten().tolist()) == expected
        assert torch.equal(masked[row, list(expected)], logits[row, list(expected)])


def test_a_temperature_too_small_to_divide_by_is_greedy_and_a_huge_top_k_cuts_nothing():
    """temperature 1e-38 would overflow every logit (the softmax NaN, token 0 drawn): below 1e-5 a row is greedy, as
    vLLM's are; top_k past what a long holds (2**63) is accepted and, like any k past the vocabulary, cuts nothing."""
    logits = torch.tensor([[1.0, 5.0, 2.0, 3.0], [1.0, 5.0, 2.0, 3.0]])
    sampler = Sampler(torch.device("cpu"))
    tiny = [SamplingParams(temperature=t, seed=s) for t, s in ((1e-38, 1), (1e-30, 2))]
    assert all(p.is_greedy for p in tiny) and not SamplingParams(temperature=1e-5).is_greedy
    assert sampler(logits, sampler.prepare(["a", "b"], tiny)).tolist() == [1, 1]
    huge = [SamplingParams(top_k=2**63, seed=3), SamplingParams(top_k=0, seed=3)]
    batch = sampler.prepare(["c", "d"], huge)
    assert batch.top_k.tolist() == [2**31 - 1, 0]
    assert apply_top_k_top_p(logits, batch.top_k, batch.top_p).isfinite().all(), "a huge k drops no token"


def test_top_k_of_one_alone_keeps_only_the_most_likely_token():
    """top_k=1 with no top-p cut is a cut of its own: every seed draws the argmax, never one of the 63 others that
    hold ~83% of the mass together."""
    logits = torch.zeros(1, VOCAB)
    logits[0, 5] = 1.0
    assert [draw(logits, [SamplingParams(temperature=1.0, top_k=1, seed=seed)])[0] for seed in range(10)] == [5] * 10


def test_a_batch_in_which_no_row_cuts_has_no_top_k_or_top_p_tensors():
    """The sort of the vocabulary that top-k and top-p need is skipped unless a row cuts: top_k 0 (or -1) and top_p 1
    build no tensors; one row with top-p below 1 builds them for the batch."""
    sampler = Sampler(torch.device("cpu"))
    no_cut = sampler.prepare(["a", "b"], [SamplingParams(temperature=1.0), SamplingParams(temperature=0.5, top_k=-1)])
    assert no_cut.top_k is None and no_cut.top_p is None
    cut = sampler.prepare(["a", "b"], [SamplingParams(temperature=1.0), SamplingParams(temperature=1.0, top_p=0.9)])
    assert cut.top_k.tolist() == [0, 0] and torch.equal(cut.top_p, torch.tensor([1.0, 0.9]))


def test_a_greedy_row_with_a_seed_takes_no_generator():
    """A seed on a greedy row (temperature 0) draws nothing: no generator is kept for it, beside a seeded row that
    samples (a helper's mutation test: with one, a greedy row drew a vocabulary of noise every step, thrown away)."""
    sampler = Sampler(torch.device("cpu"))
    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(0))
    params = [SamplingParams(temperature=0.0, seed=3), SamplingParams(temperature=1.0, seed=3)]
    tokens = sampler(logits, sampler.prepare(["greedy", "sampled"], params))
    assert tokens[0] == logits[0].argmax() and set(sampler.generators) == {"sampled"}
