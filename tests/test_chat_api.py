"""`LLM.chat` (vLLM's): conversations through SmolLM2's chat template (transformers' `apply_chat_template` as the
oracle), the template's switches and keywords, and bad conversations refused by index before anything runs."""

import pytest

import minipic_lite as mp
from tests.conftest import save_tiny_llama

GREEDY = mp.SamplingParams(max_tokens=6, temperature=0.0)
ASK = [{"role": "user", "content": "Name a color."}]
STORY = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hello."}]


def template_ids(llm, messages, **kwargs) -> list[int]:
    text = llm.tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
    return llm.tokenizer.encode(text, add_special_tokens=False)


def test_a_conversation_is_its_template_then_generate(llm):
    (out,) = llm.chat(ASK, GREEDY, use_tqdm=False)
    assert out.prompt_token_ids == template_ids(llm, ASK, add_generation_prompt=True)
    (alone,) = llm.generate(ASK, GREEDY, use_tqdm=False)
    assert out.token_ids == alone.token_ids and out.prompt == alone.prompt
    assert llm.get_tokenizer() is llm.tokenizer


def test_several_conversations_come_back_in_order_with_their_own_params(llm):
    params = [GREEDY, mp.SamplingParams(max_tokens=2, temperature=0.0)]
    outs = llm.chat([STORY, ASK], params, use_tqdm=False)
    expected = [template_ids(llm, c, add_generation_prompt=True) for c in (STORY, ASK)]
    assert [o.prompt_token_ids for o in outs] == expected
    assert outs[1].token_ids == llm.generate(ASK, params[1], use_tqdm=False)[0].token_ids


def test_continue_final_message_continues_the_assistants_words(llm):
    started = [*ASK, {"role": "assistant", "content": "My favourite color is"}]
    (out,) = llm.chat(started, GREEDY, use_tqdm=False, add_generation_prompt=False, continue_final_message=True)
    expected = template_ids(llm, started, add_generation_prompt=False, continue_final_message=True)
    assert out.prompt_token_ids == expected and out.prompt.endswith("My favourite color is")
    (closed,) = llm.chat(started, GREEDY, use_tqdm=False, add_generation_prompt=False)
    assert closed.prompt_token_ids == template_ids(llm, started) != expected, "without it the turn is closed"


def test_chat_template_kwargs_reach_the_template(llm):
    own = "{% for m in messages %}<{{ m['role'] }}:{{ m['content'] }}>{% endfor %}"
    (out,) = llm.chat(ASK, GREEDY, use_tqdm=False, chat_template_kwargs={"chat_template": own})
    assert out.prompt == "<user:Name a color.>"


def test_a_bad_conversation_is_refused_by_index_and_nothing_runs(llm):
    before = llm.stats()["num_computed_tokens"]
    with pytest.raises(ValueError, match='conversation 1: message 0 must have a "role" and a "content" string'):
        llm.chat([ASK, [{"role": "user"}]], GREEDY, use_tqdm=False)
    with pytest.raises(TypeError, match="conversation 1: chat\\(\\) takes lists of message dicts"):
        llm.chat([ASK, "plain text"], GREEDY, use_tqdm=False)
    assert llm.stats()["num_computed_tokens"] == before


def test_chat_without_a_tokenizer_is_an_error_naming_the_template(tmp_path):
    tiny = mp.LLM(str(save_tiny_llama(tmp_path, vocab_size=64)), device="cpu", dtype="float32", max_model_len=64)
    try:
        assert tiny.get_tokenizer() is None
        with pytest.raises(ValueError, match="has no tokenizer: chat\\(\\) needs its chat template"):
            tiny.chat(ASK, GREEDY, use_tqdm=False)
    finally:
        tiny.close()
