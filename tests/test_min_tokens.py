"""`min_tokens` (no stop before so many new tokens: the sampler blocks the stop tokens on the device, the engine looks
for no stop string in their text) and `include_stop_str_in_output`, on the sampler alone and on SmolLM2 (fp32, CPU)
against transformers' `min_new_tokens` and a plain stop-token processor in its generate()."""

import pytest
import torch

import minipic_lite as mp
from minipic_lite.sampler import MinTokens, Sampler

CPU = torch.device("cpu")
VOCAB = 12
EOS = (2,)


def test_min_tokens_blocks_each_rows_stop_tokens_until_it_has_sampled_enough():
    params = [
        mp.SamplingParams(min_tokens=3),  # eos blocked for three samples
        mp.SamplingParams(),  # never blocked
        mp.SamplingParams(min_tokens=2, ignore_eos=True, stop_token_ids=[5, 5, 7]),  # 5 and 7, not eos
        mp.SamplingParams(min_tokens=2, stop_token_ids=[5]),  # it has two tokens already
    ]
    blocker = MinTokens.build(params, [0, 0, 0, 2], EOS, CPU)
    logits = torch.arange(4 * VOCAB, dtype=torch.float32).reshape(4, VOCAB)
    before = logits.clone()
    blocked = []
    for _ in range(4):
        out = blocker(logits)
        blocked.append([sorted(torch.nonzero(row == -torch.inf).flatten().tolist()) for row in out])
        assert torch.equal(out[out.isfinite()], logits[out.isfinite()])
    assert torch.equal(logits, before), "the logits given (a graph's output buffer) must stay as they are"
    assert blocked == [[[2], [], [5, 7], []], [[2], [], [5, 7], []], [[2], [], [], []], [[], [], [], []]]


def test_the_sampler_blocks_stop_tokens_over_the_graphs_argmax_and_reads_the_rows_progress():
    sampler = Sampler(CPU)
    logits = torch.zeros(2, VOCAB)
    logits[:, 2] = 5.0  # eos is the argmax of both rows
    params = [mp.SamplingParams(temperature=0.0, min_tokens=2), mp.SamplingParams(temperature=0.0, min_tokens=2)]
    batch = sampler.prepare(["a", "b"], params, [([9, 9], 2), ([9, 9, 4, 4], 2)], VOCAB, EOS)
    assert batch.min_tokens.remaining.tolist() == [2, 0]
    assert sampler(logits, batch, greedy_tokens=torch.tensor([2, 2])).tolist() == [0, 2]
    done = sampler.prepare(["b"], params[1:], [([9, 9, 4, 4], 2)], VOCAB, EOS)
    assert done.min_tokens is None, "a row past its min_tokens needs no blocking"
    with pytest.raises(ValueError, match="min_tokens needs each row's token ids"):
        sampler.prepare(["a"], params[:1])


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(min_tokens=-1), ValueError, "min_tokens must be in \\[0, max_tokens=64\\]"),
        (dict(min_tokens=65), ValueError, "min_tokens must be in \\[0, max_tokens=64\\]"),
        (dict(min_tokens=2.0), TypeError, "min_tokens must be an integer >= 0"),
        (dict(min_tokens=True), TypeError, "min_tokens must be an integer >= 0"),
        (dict(include_stop_str_in_output="yes"), TypeError, "include_stop_str_in_output must be a bool"),
    ],
)
def test_bad_min_tokens_and_include_stop_str_are_errors_naming_the_field(kwargs, error, match):
    with pytest.raises(error, match=match):
        mp.SamplingParams(**kwargs)


# -- the engine on SmolLM2 --------------------------------------------------------------------------------------

STORY = "Tell me a story."  # plain text: greedy, the instruct model ends it at once


def hf_greedy(hf_model, llm, prompt, max_new_tokens, **kwargs) -> list[int]:
    ids = torch.tensor([llm.encode(prompt)[0]])
    with torch.no_grad():
        out = hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                do_sample=False, pad_token_id=0, **kwargs)  # fmt: skip
    return out[0, ids.shape[1] :].tolist()


def test_min_tokens_gives_transformers_min_new_tokens(llm, hf_model):
    prompts = [STORY, "The capital of France is", [{"role": "user", "content": "Say hi."}]]
    plain = llm.generate(STORY, mp.SamplingParams(max_tokens=40, temperature=0.0), use_tqdm=False)[0]
    assert plain.token_ids == list(llm.config.model.eos_token_ids[:1]), "the story prompt no longer ends at once"
    outs = llm.generate(prompts, mp.SamplingParams(max_tokens=40, temperature=0.0, min_tokens=6), use_tqdm=False)
    for prompt, out in zip(prompts, outs, strict=True):
        chat = not isinstance(prompt, str)
        text = llm.tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True) if chat else prompt
        want = hf_greedy(hf_model, llm, text, 40, min_new_tokens=6)
        assert out.token_ids == want, prompt
        assert len(out.token_ids) > 6 and not set(out.token_ids[:6]) & set(llm.config.model.eos_token_ids)


class BlockUntil:
    """A logits processor for transformers' generate(): `stop_ids` at -inf until `min_tokens` new tokens."""

    def __init__(self, num_prompt: int, min_tokens: int, stop_ids: list[int]):
        self.num_prompt, self.min_tokens, self.stop_ids = num_prompt, min_tokens, stop_ids

    def __call__(self, input_ids, scores):
        if input_ids.shape[1] - self.num_prompt < self.min_tokens:
            scores = scores.clone()
            scores[:, self.stop_ids] = -torch.inf
        return scores


def test_stop_token_ids_wait_for_min_tokens_through_bursts(model_dir, llm, hf_model):
    """A stop token the greedy answer says early is blocked for the first min_tokens tokens, in bursts of four
    queued ahead (the count down runs on the device), and ends the answer where it comes after them."""
    prompt = "a, b, c, d,"  # greedy: " e," and on; with no comma for five tokens, another after 23
    comma = llm.tokenizer.convert_tokens_to_ids(",")
    plain = llm.generate(prompt, mp.SamplingParams(max_tokens=3, temperature=0.0), use_tqdm=False)[0].token_ids
    assert comma in plain, "the greedy answer no longer says a comma early"
    params = mp.SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, min_tokens=5, stop_token_ids=[comma])
    burst = mp.LLM(str(model_dir), device="cpu", dtype="float32", max_model_len=512, num_scheduler_steps=4,
                   async_scheduling=True)  # fmt: skip
    try:
        out = burst.generate(prompt, params, use_tqdm=False)[0]
        assert burst.engine.stats.num_continuations > 0, "no burst was continued on the device"
    finally:
        burst.close()
    want = hf_greedy(hf_model, llm, prompt, 24, logits_processor=[BlockUntil(len(llm.encode(prompt)[0]), 5, [comma])])
    want = want[: want.index(comma, 5) + 1]  # NOTE: transformers runs on; ours stops at the first one it may take
    assert out.token_ids == want and out.stop_reason == comma and len(want) > 5
    assert llm.generate(prompt, params, use_tqdm=False)[0].token_ids == want  # one step a visit: the same


def test_a_stop_token_right_after_the_first_min_tokens_ends_the_answer(llm):
    """The stop token is blocked for exactly min_tokens samples: the runner counts the row's tokens past its prompt."""
    prompt = "a, b, c, d,"
    comma = llm.tokenizer.convert_tokens_to_ids(",")
    greedy = mp.SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    plain = llm.generate(prompt, greedy, use_tqdm=False)[0].token_ids
    at = plain.index(comma)  # the greedy answer's first comma: token at + 1
    assert at >= 1, "the greedy answer no longer starts with a token before its comma"
    params = mp.SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, min_tokens=at, stop_token_ids=[comma])
    out = llm.generate(prompt, params, use_tqdm=False)[0]
    assert (out.token_ids, out.finish_reason, out.stop_reason) == (plain[: at + 1], "stop", comma)


class NoDecodeStream:
    """`tokenizers`' DecodeStream failing as it does on bytes that are no UTF-8: the detokenizer decodes the whole
    output at every token instead (and tells no kept text)."""

    def __init__(self, **kwargs):
        pass

    def step(self, *args):
        raise RuntimeError("Invalid prefix")


@pytest.mark.parametrize("full_decode", [False, True], ids=["incremental", "full-decode"])
def test_a_stop_string_is_not_looked_for_in_the_first_min_tokens_text(llm, monkeypatch, full_decode):
    if full_decode:
        monkeypatch.setattr("minipic_lite.detokenizer.DecodeStream", NoDecodeStream)
    prompt, stop = "1, 2, 3, 4,", ","
    plain = llm.generate(prompt, mp.SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True), use_tqdm=False)
    tokens = plain[0].token_ids
    full, early = llm.tokenizer.decode(tokens), len(llm.tokenizer.decode(tokens[:4]))
    expected = full[: full.index(stop, early)]  # the first stop string that ends past the first four tokens' text
    params = mp.SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True, min_tokens=4, stop=[stop])
    out = llm.generate(prompt, params, use_tqdm=False)[0]
    assert (out.text, out.finish_reason, out.stop_reason) == (expected, "stop", stop)
    assert out.text.count(stop) >= 1, "the stop string in the first tokens' text was taken"
    cut = llm.generate(prompt, mp.SamplingParams(max_tokens=16, temperature=0.0, stop=[stop]), use_tqdm=False)[0]
    assert cut.text == full[: full.index(stop)] != out.text


def test_include_stop_str_in_output_ends_the_text_with_it(llm):
    prompt, stop = "1, 2, 3, 4,", " 8"
    params = mp.SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True, stop=[stop])
    without = llm.generate(prompt, params, use_tqdm=False)[0]
    kept = mp.SamplingParams(
        max_tokens=16, temperature=0.0, ignore_eos=True, stop=[stop], include_stop_str_in_output=True
    )
    out = llm.generate(prompt, kept, use_tqdm=False)[0]
    assert out.text == without.text + stop and out.token_ids == without.token_ids and out.stop_reason == stop
    texts = [o.text for o in llm.stream(prompt, kept)]
    assert texts[-1] == out.text and all(b.startswith(a) for a, b in zip(texts, texts[1:], strict=False))


def test_min_tokens_may_equal_max_tokens_and_then_gives_them_all(llm):
    params = mp.SamplingParams(max_tokens=5, temperature=0.0, min_tokens=5)
    assert (params.min_tokens, params.max_tokens) == (5, 5)
    out = llm.generate(STORY, params, use_tqdm=False)[0]  # greedy, the story prompt ends at once without min_tokens
    assert len(out.token_ids) == 5 and out.finish_reason == "length"
    assert not set(out.token_ids) & set(llm.config.model.eos_token_ids)


@pytest.mark.parametrize("full_decode", [False, True], ids=["incremental", "full-decode"])
def test_a_stop_string_in_the_text_of_the_min_tokens_th_token_is_not_taken(llm, monkeypatch, full_decode):
    """As vLLM: the text is looked at from token min_tokens + 1 on (its new characters), not at token min_tokens;
    also where the detokenizer decodes in full and tells no kept text (the stop string ends the min_tokens' text)."""
    if full_decode:
        monkeypatch.setattr("minipic_lite.detokenizer.DecodeStream", NoDecodeStream)
    prompt, stop = "1, 2, 3, 4,", ","
    plain = llm.generate(prompt, mp.SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True), use_tqdm=False)
    tokens, decode = plain[0].token_ids, llm.tokenizer.decode
    min_tokens = next(i for i in range(1, len(tokens) + 1) if stop in decode(tokens[:i]))  # the first stop's token
    full, early = decode(tokens), len(decode(tokens[:min_tokens]))
    params = mp.SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True, min_tokens=min_tokens, stop=[stop])
    out = llm.generate(prompt, params, use_tqdm=False)[0]
    assert (out.text, out.finish_reason, out.stop_reason) == (full[: full.index(stop, early)], "stop", stop)
    assert out.text.count(stop) == decode(tokens[:min_tokens]).count(stop) >= 1
    assert decode(tokens[:min_tokens]).endswith(stop)  # what a search one character early would take


def test_the_engine_takes_no_stop_token_before_min_tokens_even_one_the_sampler_let_through(llm, monkeypatch):
    """The engine's own check: with the sampler's block of stop tokens patched out, EOS sampled at once still ends
    nothing before min_tokens (greedy, the story prompt ends at once without min_tokens)."""
    monkeypatch.setattr(MinTokens, "__call__", lambda self, logits: logits)
    plain = llm.generate(STORY, mp.SamplingParams(max_tokens=5, temperature=0.0), use_tqdm=False)[0]
    assert (len(plain.token_ids), plain.finish_reason) == (1, "stop")
    params = mp.SamplingParams(max_tokens=5, temperature=0.0, min_tokens=5)
    out = llm.generate(STORY, params, use_tqdm=False)[0]
    assert (len(out.token_ids), out.finish_reason, out.stop_reason) == (5, "length", None)
    assert out.token_ids[0] == plain.token_ids[0]  # the stop token came and was kept as a plain token
