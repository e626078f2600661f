"""Penalties (repetition, presence, frequency) and min-p: the sampler's pure functions against transformers' logits
processors and a plain loop of OpenAI's formula; the engine's greedy tokens with a penalty against transformers'
generate() on the real SmolLM2 weights (fp32, CPU), also where a burst counts its own tokens on the device."""

import pytest
import torch

import minipic_lite as mp
from minipic_lite.sampler import Penalties, Sampler, apply_min_p, warp

VOCAB = 50
CPU = torch.device("cpu")


def histories_and_logits(seed: int = 0):
    """Three rows: token ids with repeats in the prompt and the output, logits of both signs (and a zero)."""
    gen = torch.Generator().manual_seed(seed)
    histories = [([1, 2, 2, 3, 40], 3), ([7, 7, 7], 3), ([5, 6, 9, 9, 9, 5, 0], 2)]
    logits = torch.randn(3, VOCAB, generator=gen) * 3
    logits[0, 2] = 0.0
    return histories, logits


@pytest.mark.parametrize("penalty", [1.3, 0.7, 2.0])
def test_the_repetition_penalty_is_transformers_processor_over_prompt_and_output(penalty):
    from transformers import RepetitionPenaltyLogitsProcessor

    histories, logits = histories_and_logits()
    params = [mp.SamplingParams(repetition_penalty=penalty)] * 3
    ours = Penalties.build(params, histories, VOCAB, CPU)(logits.clone())
    hf = RepetitionPenaltyLogitsProcessor(penalty)
    for row, (token_ids, _) in enumerate(histories):
        expected = hf(torch.tensor([token_ids]), logits[row : row + 1].clone())[0]
        assert torch.equal(ours[row], expected), row
    assert not torch.equal(ours, logits)


def openai_penalties(logits: list[float], output: list[int], presence: float, frequency: float) -> list[float]:
    """OpenAI's formula, token by token: logit - count * frequency - (count > 0) * presence, over the output."""
    out = list(logits)
    for token in set(output):
        count = output.count(token)
        out[token] -= count * frequency + presence
    return out


def test_presence_and_frequency_penalties_follow_openais_formula_over_the_output_alone():
    histories, logits = histories_and_logits(1)
    params = [
        mp.SamplingParams(presence_penalty=0.5),
        mp.SamplingParams(frequency_penalty=0.25),
        mp.SamplingParams(presence_penalty=-1.0, frequency_penalty=1.5),
    ]
    ours = Penalties.build(params, histories, VOCAB, CPU)(logits.clone())
    for row, ((token_ids, num_prompt), p) in enumerate(zip(histories, params, strict=True)):
        expected = openai_penalties(logits[row].tolist(), token_ids[num_prompt:], p.presence_penalty,
                                    p.frequency_penalty)  # fmt: skip
        torch.testing.assert_close(ours[row], torch.tensor(expected), rtol=0, atol=1e-6)
    assert ours[0, 1] == logits[0, 1], "a prompt token takes no presence penalty"
    assert ours[1, 7] == logits[1, 7], "the whole row is prompt: nothing penalized"


def test_a_neutral_row_is_left_exactly_as_it_is_beside_penalized_rows():
    histories, logits = histories_and_logits(2)
    params = [mp.SamplingParams(), mp.SamplingParams(repetition_penalty=1.5, frequency_penalty=1.0),
              mp.SamplingParams(temperature=0.0)]  # fmt: skip
    penalties = Penalties.build(params, histories, VOCAB, CPU)
    ours = penalties(logits.clone())
    assert torch.equal(ours[0], logits[0]) and torch.equal(ours[2], logits[2])
    assert not torch.equal(ours[1], logits[1])
    assert not penalties.prompt_mask[0].any() and not penalties.output_counts[2].any(), "neutral rows count nothing"


def test_counting_a_sampled_token_penalizes_it_at_the_next_step():
    histories = [([1, 2], 2), ([3], 1)]
    params = [mp.SamplingParams(frequency_penalty=1.0)] * 2
    penalties = Penalties.build(params, histories, VOCAB, CPU)
    penalties.count(torch.tensor([4, 4]))
    penalties.count(torch.tensor([4, 9]))
    assert penalties.output_counts[0, 4] == 2 and penalties.output_counts[1, 4] == 1
    assert penalties.output_counts[1, 9] == 1 and penalties.output_counts.sum() == 4
    logits = torch.zeros(2, VOCAB)
    assert penalties(logits)[:, [4, 9]].tolist() == [[-2.0, 0.0], [-1.0, -1.0]]


def test_the_samplers_kept_prompt_rows_give_the_penalties_built_from_the_histories(monkeypatch):
    """A request's prompt row is built at its first step and kept: later steps (longer outputs, other neighbours)
    give what a build from the histories gives, and a forgotten id takes its new prompt's row."""
    sampler, built = Sampler(CPU), []
    monkeypatch.setattr(torch, "zeros", lambda *a, **k: built.append(a) or zeros(*a, **k))
    params = [mp.SamplingParams(repetition_penalty=1.5), mp.SamplingParams(), mp.SamplingParams(frequency_penalty=1)]
    steps = [
        (["a", "b", "c"], [([1, 2, 3], 3), ([4, 5], 2), ([6, 7, 8], 2)]),
        (["c", "a", "b"], [([6, 7, 8, 9], 2), ([1, 2, 3, 10], 3), ([4, 5, 11], 2)]),  # reordered, one token more
    ]
    for ids, histories in steps:
        rows = [params[ord(i) - ord("a")] for i in ids]
        ours = sampler.prepare(ids, rows, histories, VOCAB).penalties
        expected = Penalties.build(rows, histories, VOCAB, CPU)
        assert torch.equal(ours.prompt_mask, expected.prompt_mask)
        assert torch.equal(ours.output_counts, expected.output_counts)
    assert sorted(sampler.prompt_masks) == ["a", "c"], "a neutral row keeps no row"
    assert sum(shape == (VOCAB,) for shape in built) == 2 + 2, "a and c's rows once; a neutral row per step"
    sampler.forget("a")
    other = sampler.prepare(["a"], [params[0]], [([20, 21], 2)], VOCAB).penalties
    assert other.prompt_mask[0].nonzero()[:, 0].tolist() == [20, 21]


zeros = torch.zeros


@pytest.mark.parametrize("min_p", [0.05, 0.3, 1.0])
def test_min_p_keeps_what_transformers_min_p_warper_keeps(min_p):
    from transformers import MinPLogitsWarper

    logits = torch.randn(6, 500, generator=torch.Generator().manual_seed(3)) * 2
    ours = apply_min_p(logits, torch.full((6,), min_p))
    expected = MinPLogitsWarper(min_p)(torch.zeros(6, 1, dtype=torch.long), logits.clone())
    assert torch.equal(ours.isfinite(), expected.isfinite())
    assert torch.equal(ours[ours.isfinite()], logits[ours.isfinite()])
    assert ours.isfinite().sum(dim=-1).min() >= 1


def test_the_warpers_run_in_transformers_order_temperature_top_k_top_p_min_p():
    """Each sampled row's logits after `warp` are those of HF's Temperature, TopK, TopP and MinP warpers in turn (the
    order matters: top-p after min-p would renormalize over fewer tokens)."""
    from transformers import (
        LogitsProcessorList,
        MinPLogitsWarper,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    logits = torch.randn(4, 300, generator=torch.Generator().manual_seed(4)) * 2
    params = [
        mp.SamplingParams(temperature=0.7, top_p=0.8, min_p=0.1),
        mp.SamplingParams(temperature=1.3, top_k=40, min_p=0.02),
        mp.SamplingParams(temperature=1.0, top_k=100, top_p=0.95, min_p=0.2),
        mp.SamplingParams(temperature=0.9),
    ]
    batch = Sampler(CPU).prepare(["a", "b", "c", "d"], params)
    ours = warp(logits, batch)
    for row, p in enumerate(params):
        chain = LogitsProcessorList([TemperatureLogitsWarper(p.temperature)])
        if p.top_k:
            chain.append(TopKLogitsWarper(p.top_k))
        if p.top_p < 1.0:
            chain.append(TopPLogitsWarper(p.top_p))
        if p.min_p:
            chain.append(MinPLogitsWarper(p.min_p))
        expected = chain(torch.zeros(1, 1, dtype=torch.long), logits[row : row + 1].clone())[0]
        assert torch.equal(ours[row].isfinite(), expected.isfinite()), row
        torch.testing.assert_close(ours[row][expected.isfinite()], expected[expected.isfinite()])


def test_a_greedy_row_with_a_penalty_takes_the_argmax_after_it_not_the_graphs():
    """A CUDA graph hands the sampler its argmax of the raw logits: a penalized row must not take it."""
    logits = torch.zeros(2, VOCAB)
    logits[:, 5] = 2.0  # the raw argmax, token 5, is in both prompts
    logits[:, 8] = 1.8
    params = [mp.SamplingParams(temperature=0.0, repetition_penalty=1.5), mp.SamplingParams(temperature=0.0)]
    sampler = Sampler(CPU)
    batch = sampler.prepare(["a", "b"], params, [([5, 1], 2), ([5, 1], 2)], VOCAB)
    assert sampler(logits, batch, greedy_tokens=torch.tensor([5, 5])).tolist() == [8, 5]
    assert batch.penalties.output_counts[0, 8] == 1


def test_a_penalty_without_the_rows_tokens_is_refused():
    with pytest.raises(ValueError, match="token ids"):
        Sampler(CPU).prepare(["a"], [mp.SamplingParams(presence_penalty=0.1)])


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"repetition_penalty": 0.0}, ValueError, "repetition_penalty must be a finite number > 0"),
        ({"repetition_penalty": float("inf")}, ValueError, "repetition_penalty"),
        ({"repetition_penalty": float("nan")}, ValueError, "repetition_penalty"),
        ({"presence_penalty": 2.5}, ValueError, r"presence_penalty must be in \[-2, 2\]"),
        ({"frequency_penalty": -2.01}, ValueError, "frequency_penalty"),
        ({"frequency_penalty": float("nan")}, ValueError, "frequency_penalty"),
        ({"min_p": 1.5}, ValueError, r"min_p must be in \[0, 1\]"),
        ({"min_p": -0.1}, ValueError, "min_p"),
        ({"min_p": "0.1"}, TypeError, "min_p must be a number"),
        ({"repetition_penalty": True}, TypeError, "repetition_penalty must be a number"),
    ],
)
def test_bad_penalties_and_min_p_are_errors_naming_the_field(kwargs, error, match):
    with pytest.raises(error, match=match):
        mp.SamplingParams(**kwargs)


def test_neutral_values_are_no_penalty_and_the_bounds_are_taken():
    assert not mp.SamplingParams(repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0).has_penalties
    assert mp.SamplingParams(presence_penalty=-2.0).has_penalties and mp.SamplingParams(min_p=1.0).min_p == 1.0


# -- the engine against transformers -------------------------------------------------------------------------------

PROMPTS = [
    "<|im_start|>user\nWrite a short story about a cat who learns to fly.<|im_end|>\n<|im_start|>assistant\n",
    "The mitochondria is the powerhouse of the cell. " * 3 + "In summary,",
    "1, 1, 2, 3, 5, 8, 13,",
]
NEW_TOKENS = 40


class OpenAIPenalties:
    """A logits processor for transformers' generate(): OpenAI's presence and frequency penalties by a plain loop
    over the tokens generated so far (transformers has none of its own)."""

    def __init__(self, num_prompt: int, presence: float, frequency: float):
        self.num_prompt, self.presence, self.frequency = num_prompt, presence, frequency

    def __call__(self, input_ids, scores):
        row = openai_penalties(scores[0].tolist(), input_ids[0, self.num_prompt :].tolist(), self.presence,
                               self.frequency)  # fmt: skip
        return torch.tensor([row], dtype=scores.dtype)


def hf_tokens(hf_model, llm, prompt: str, **kwargs) -> list[int]:
    ids = torch.tensor([llm.encode(prompt)[0]])
    eos = hf_model.generation_config.eos_token_id
    hf_model.generation_config.eos_token_id = None
    try:
        with torch.no_grad():
            out = hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                                    do_sample=False, **kwargs)  # fmt: skip
    finally:
        hf_model.generation_config.eos_token_id = eos
    return out[0, ids.shape[1] :].tolist()


def test_greedy_with_a_repetition_penalty_equals_transformers_token_for_token(llm, hf_model):
    params = mp.SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, repetition_penalty=1.3, ignore_eos=True)
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    plain = llm.generate(PROMPTS, mp.SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True),
                         use_tqdm=False)  # fmt: skip
    for prompt, out in zip(PROMPTS, outs, strict=True):
        assert out.token_ids == hf_tokens(hf_model, llm, prompt, repetition_penalty=1.3), prompt
    assert any(o.token_ids != b.token_ids for o, b in zip(outs, plain, strict=True)), "the penalty changed nothing"


def test_bursts_count_their_own_tokens_on_the_device(model_dir, hf_model, llm):
    """Four decode steps a burst and the next burst queued before the last one's tokens are read: the frequency
    penalty at each step sees every token before it (the counts grow on the device), as transformers' loop does."""
    burst = mp.LLM(str(model_dir), device="cpu", dtype="float32", max_model_len=512, num_scheduler_steps=4,
                   async_scheduling=True)  # fmt: skip
    try:
        params = mp.SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, frequency_penalty=0.8,
                                   presence_penalty=0.3, ignore_eos=True)  # fmt: skip
        outs = burst.generate(PROMPTS, params, use_tqdm=False)
        assert burst.engine.stats.num_continuations > 0, "no burst was continued on the device"
    finally:
        burst.close()
    for prompt, out in zip(PROMPTS, outs, strict=True):
        num_prompt = len(llm.encode(prompt)[0])
        processor = OpenAIPenalties(num_prompt, presence=0.3, frequency=0.8)
        assert out.token_ids == hf_tokens(hf_model, llm, prompt, logits_processor=[processor]), prompt
