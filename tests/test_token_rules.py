"""`logit_bias` and `allowed_token_ids` (OpenAI's and vLLM's): the sampler's rules on their own, their checks, and the
engine on SmolLM2 (fp32, CPU) against transformers' `sequence_bias` and `prefix_allowed_tokens_fn` in generate()."""

import pytest
import torch

import minipic_lite as mp
from minipic_lite.sampler import Sampler, TokenRules

CPU = torch.device("cpu")
VOCAB = 10


def test_each_row_gets_its_bias_added_and_its_allowed_set_alone():
    params = [
        mp.SamplingParams(logit_bias={3: 2.5, 1: -1.0}),
        mp.SamplingParams(),  # no rules: left as it is
        mp.SamplingParams(allowed_token_ids=[4, 7], logit_bias={7: 100}),
    ]
    rules = TokenRules.build(params, VOCAB, CPU)
    logits = torch.arange(3 * VOCAB, dtype=torch.float32).reshape(3, VOCAB)
    before = logits.clone()
    out = rules(logits)
    expected = before.clone()
    expected[0, 3] += 2.5
    expected[0, 1] -= 1.0
    expected[2] = -torch.inf
    expected[2, 4], expected[2, 7] = before[2, 4], before[2, 7] + 100
    assert torch.equal(out, expected)
    assert torch.equal(logits, before), "the logits given (a graph's output buffer) must stay as they are"


def test_the_rules_come_before_the_graphs_argmax():
    sampler = Sampler(CPU)
    logits = torch.zeros(2, VOCAB)
    logits[:, 5] = 3.0  # the raw argmax of both rows
    params = [mp.SamplingParams(temperature=0.0, logit_bias={5: -10}), mp.SamplingParams(temperature=0.0)]
    batch = sampler.prepare(["a", "b"], params, vocab=VOCAB)
    assert sampler(logits, batch, greedy_tokens=torch.tensor([5, 5])).tolist() == [0, 5]
    allowed = [mp.SamplingParams(temperature=0.0, allowed_token_ids=[8, 2])]
    assert sampler(logits[:1], sampler.prepare(["c"], allowed, vocab=VOCAB), torch.tensor([5])).tolist() == [2]
    with pytest.raises(ValueError, match="vocabulary's size"):
        sampler.prepare(["a"], params[:1])


def test_a_batch_applies_the_rules_of_rows_after_one_without_any():
    sampler = Sampler(CPU)
    logits = torch.zeros(2, VOCAB)
    logits[:, 5] = 3.0
    params = [mp.SamplingParams(temperature=0.0), mp.SamplingParams(temperature=0.0, allowed_token_ids=[8])]
    assert sampler(logits, sampler.prepare(["a", "b"], params, vocab=VOCAB)).tolist() == [5, 8]


def test_the_bias_comes_before_the_penalties():
    """vLLM's order: the repetition penalty divides the biased logit of a token seen, (1 - 0.3) / 2 = 0.35, which beats
    token 1's 0.3; penalized first, 1 / 2 - 0.3 = 0.2 would lose to it."""
    sampler = Sampler(CPU)
    logits = torch.zeros(1, VOCAB)
    logits[0, 0], logits[0, 1] = 1.0, 0.3
    params = [mp.SamplingParams(temperature=0.0, logit_bias={0: -0.3}, repetition_penalty=2.0)]
    batch = sampler.prepare(["a"], params, histories=[([0, 2], 2)], vocab=VOCAB)
    assert sampler(logits, batch).tolist() == [0]


def test_the_bias_is_kept_as_sorted_pairs_and_children_keep_it():
    params = mp.SamplingParams(logit_bias={9: 1, 2: -3.5}, allowed_token_ids=(5, 2), n=2, seed=1)
    assert params.logit_bias == ((2, -3.5), (9, 1.0)) and params.allowed_token_ids == (5, 2)
    assert params.child(1).logit_bias == params.logit_bias and params.child(1).allowed_token_ids == (5, 2)
    assert params.has_token_rules and not mp.SamplingParams().has_token_rules


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(logit_bias={1: 101}), ValueError, "logit_bias values must be numbers in \\[-100, 100\\]"),
        (dict(logit_bias={1: float("nan")}), ValueError, "logit_bias values must be numbers"),
        (dict(logit_bias={1: True}), ValueError, "logit_bias values must be numbers"),
        (dict(logit_bias={"a": 1.0}), TypeError, "logit_bias must hold non-negative int token ids"),
        (dict(logit_bias={-1: 1.0}), TypeError, "logit_bias must hold non-negative int token ids"),
        (dict(logit_bias={True: 1.0}), TypeError, "logit_bias must hold non-negative int token ids"),
        (dict(allowed_token_ids=[3, False]), TypeError, "allowed_token_ids must hold non-negative int token ids"),
        (dict(logit_bias=[1, 2]), TypeError, "logit_bias must map token ids to biases"),
        (dict(allowed_token_ids=[]), ValueError, "allowed_token_ids must name at least one token"),
        (dict(allowed_token_ids=[1, 2.0]), TypeError, "allowed_token_ids must hold non-negative int token ids"),
        (dict(allowed_token_ids="12"), TypeError, "allowed_token_ids must be a sequence"),
    ],
)
def test_bad_rules_are_errors_naming_the_field(kwargs, error, match):
    with pytest.raises(error, match=match):
        mp.SamplingParams(**kwargs)


def test_the_bias_may_be_the_bounds_themselves():
    assert mp.SamplingParams(logit_bias={0: -100, 1: 100.0}).logit_bias == ((0, -100.0), (1, 100.0))


# -- the engine on SmolLM2 --------------------------------------------------------------------------------------

PROMPTS = ["The capital of France is", "def fibonacci(n):"]


def hf_greedy(hf_model, llm, prompt, **kwargs) -> list[int]:
    ids = torch.tensor([llm.encode(prompt)[0]])
    with torch.no_grad():
        out = hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=10, do_sample=False,
                                eos_token_id=None, pad_token_id=0, **kwargs)  # fmt: skip
    return out[0, ids.shape[1] :].tolist()


def test_a_logit_bias_gives_transformers_sequence_bias(llm, hf_model):
    greedy = mp.SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    plain = llm.generate(PROMPTS, greedy, use_tqdm=False)
    for prompt, out in zip(PROMPTS, plain, strict=True):
        bias = {out.token_ids[0]: -100.0, out.token_ids[2]: 4.0}  # ban the first answer's start, push a later token
        params = mp.SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True, logit_bias=bias)
        biased = llm.generate(prompt, params, use_tqdm=False)[0]
        assert biased.token_ids == hf_greedy(hf_model, llm, prompt, sequence_bias={(t,): b for t, b in bias.items()})
        assert biased.token_ids[0] != out.token_ids[0]


def test_allowed_token_ids_give_transformers_prefix_allowed_tokens(llm, hf_model):
    prompt = PROMPTS[0]
    allowed = [260, 216, 30, 7042]  # ' the', ' ', '.', ' Paris'
    params = mp.SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True, allowed_token_ids=allowed)
    out = llm.generate(prompt, params, use_tqdm=False)[0]
    assert out.token_ids == hf_greedy(hf_model, llm, prompt, prefix_allowed_tokens_fn=lambda batch, ids: allowed)
    sampled = mp.SamplingParams(max_tokens=30, temperature=1.5, seed=4, ignore_eos=True, allowed_token_ids=allowed)
    drawn = llm.generate(prompt, sampled, use_tqdm=False)[0].token_ids
    assert set(drawn) <= set(allowed) and len(set(drawn)) > 1


def test_rules_through_bursts_give_one_step_a_visits_tokens(model_dir, llm):
    """Four decode steps a burst, the next queued ahead: the rules hold at every step of it."""
    params = mp.SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, logit_bias={30: -100, 28: 3.0},
                               allowed_token_ids=list(range(200, 400)) + [28])  # fmt: skip
    burst = mp.LLM(str(model_dir), device="cpu", dtype="float32", max_model_len=512, num_scheduler_steps=4,
                   async_scheduling=True)  # fmt: skip
    try:
        outs = burst.generate(PROMPTS, params, use_tqdm=False)
        assert burst.engine.stats.num_continuations > 0, "no burst was continued on the device"
    finally:
        burst.close()
    assert [o.token_ids for o in outs] == [o.token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]
    assert all(set(o.token_ids) <= set(range(200, 400)) | {28} for o in outs)


def test_token_ids_outside_the_vocabulary_are_refused_naming_the_field(llm):
    vocab = llm.config.model.vocab_size
    for kwargs, name in (
        (dict(logit_bias={vocab: 1.0}), "logit_bias"),
        (dict(allowed_token_ids=[5, vocab]), "allowed"),
    ):
        with pytest.raises(ValueError, match=f"prompt 0: {name}.* names token id {vocab}, outside the vocabulary"):
            llm.generate("Hi", mp.SamplingParams(max_tokens=1, **kwargs), use_tqdm=False)
