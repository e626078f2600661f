"""Edges of the engine's stop checks (engine.py `_stops` / `_output`) that test_stop_strings and test_api leave
open: the stop reason of a stop token and of EOS, a stop string met twice in one token, the context limit, and
the seeded generators a finished request leaves behind."""

import minipic_lite as mp
from tests.conftest import save_tiny_llama

PROMPT = "The capital of France is"


def greedy(max_tokens: int = 12, **kwargs) -> mp.SamplingParams:
    return mp.SamplingParams(max_tokens=max_tokens, temperature=0.0, **kwargs)


def test_a_stop_token_and_eos_are_the_stop_reason(llm):
    base = llm.generate(PROMPT, greedy(ignore_eos=True), use_tqdm=False)[0]
    stop_id = base.token_ids[3]
    by_token = llm.generate(PROMPT, greedy(ignore_eos=True, stop_token_ids=[stop_id]), use_tqdm=False)[0]
    assert (by_token.finish_reason, by_token.stop_reason) == ("stop", stop_id)
    assert by_token.token_ids == base.token_ids[: base.token_ids.index(stop_id) + 1]
    chat = [{"role": "user", "content": "Say hi."}]
    by_eos = llm.generate(chat, greedy(64), use_tqdm=False)[0]
    assert (by_eos.finish_reason, by_eos.stop_reason, by_eos.token_ids[-1]) == ("stop", 2, 2)  # <|im_end|>
    by_length = llm.generate(PROMPT, greedy(3, ignore_eos=True), use_tqdm=False)[0]
    assert (by_length.finish_reason, by_length.stop_reason) == ("length", None)


def test_a_stop_string_that_one_token_brings_twice_cuts_the_text_at_its_first_occurrence(llm):
    prompt = "The river that runs through New Orleans is the"
    out = llm.generate(prompt, greedy(ignore_eos=True, stop=["ss"]), use_tqdm=False)[0]
    assert llm.tokenizer.decode(out.token_ids) == " Mississippi"  # one token brings "ss" twice
    assert (out.finish_reason, out.stop_reason, out.text) == ("stop", "ss", " Mi")


def test_a_request_stops_for_length_at_the_models_context(tmp_path):
    llm = mp.LLM(str(save_tiny_llama(tmp_path)), device="cpu", max_model_len=32, num_blocks=16)
    params = greedy(100, ignore_eos=True, detokenize=False)
    (out,) = llm.generate([list(range(5, 25))], params, use_tqdm=False)
    assert (out.finish_reason, len(out.prompt_token_ids) + len(out.token_ids)) == ("length", 32)
    llm.close()


def test_a_finished_request_leaves_no_seeded_generator_behind(llm):
    generators = llm.engine.runner.sampler.generators
    before = set(generators)
    params = mp.SamplingParams(max_tokens=3, temperature=1.0, seed=5, ignore_eos=True)
    llm.generate([PROMPT, PROMPT], [params, params], use_tqdm=False)
    assert set(generators) == before


def test_special_tokens_are_left_out_of_the_text_unless_asked_for(llm):
    chat = [{"role": "user", "content": "Say hi."}]
    params = [greedy(64, skip_special_tokens=False), greedy(64)]
    kept, skipped = llm.generate([chat, chat], params, use_tqdm=False)
    assert kept.token_ids == skipped.token_ids and kept.token_ids[-1] == 2  # <|im_end|>
    assert kept.text == skipped.text + "<|im_end|>"
    assert skipped.text == llm.tokenizer.decode(skipped.token_ids, skip_special_tokens=True)


def test_detokenize_false_leaves_the_text_empty(llm):
    out = llm.generate(PROMPT, greedy(3, detokenize=False), use_tqdm=False)[0]
    assert len(out.token_ids) == 3 and out.text == ""
