"""Edges of the public API (llm.py) that test_api leaves open, on a tiny random Llama (no tokenizer) or none at all:
prompts and params in tuples, token ids in a tuple, a lone chat message in a batch, an empty batch, options the
caller gives, composed prompts' markers and labels, device names, the module-level generate's keywords, the options
LLM's docstring names, and stream() given a batch; and, with a real tokenizer that adds a BOS, the token ids of a text
and a chat prompt."""

from types import SimpleNamespace

import pytest
import torch

import minipic_lite as mp
import minipic_lite.llm as llm_module
from minipic_lite.config import ControlTokens
from minipic_lite.llm import checked_device
from minipic_lite.prompts import Prompt
from tests.conftest import BOS_VOCAB, bos_tokenizer, save_tiny_llama

CONTROL = ControlTokens(ssep_id=1, pdep_id=2, pad_id=3)
SPAN_PROMPT = (20, 21, 22, 3, 1, 30, 31, 32, 2, 40)  # block size 4: [20 21 22 PAD] [SSEP 30 31 32] [PDEP 40]


def greedy(max_tokens: int) -> mp.SamplingParams:
    return mp.SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, detokenize=False)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("tiny_llama"))


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    llm = mp.LLM(str(tiny_dir), device="cpu", max_model_len=128, num_blocks=64, block_size=4, control_tokens=CONTROL)
    yield llm
    llm.close()


def test_prompts_and_params_in_tuples_pair_up_and_come_back_in_the_prompts_order(tiny):
    """The first prompt runs longer (it finishes last) and still comes first; token ids give no prompt text."""
    outs = tiny.generate(([5, 6, 7], [8, 9]), (greedy(5), greedy(2)), use_tqdm=False)
    assert [(o.prompt_token_ids, len(o.token_ids), o.prompt) for o in outs] == [([5, 6, 7], 5, None), ([8, 9], 2, None)]


def test_an_empty_batch_generates_nothing(tiny):
    assert tiny.generate([], greedy(2), use_tqdm=False) == []


def test_the_options_the_caller_gives_are_kept(tiny_dir, tiny):
    assert tiny.config.control == CONTROL
    llm = mp.LLM(str(tiny_dir), device="cpu", max_model_len=128, num_blocks=16, checkpoint_turn_start_id=7)
    assert llm.config.cache.checkpoint_turn_start_id == 7 and llm.config.control == ControlTokens()
    llm.close()


def test_a_composed_prompt_carries_its_labels_and_its_markers_are_checked(tiny_dir, tiny):
    prompt = Prompt(SPAN_PROMPT, 4, CONTROL, ("sys", "doc", "q"))
    (out,) = tiny.generate(prompt, greedy(2), use_tqdm=False)
    assert [block.label for block in out.cache_report] == ["sys", "doc", "q"]
    for other in (Prompt(SPAN_PROMPT, 8, CONTROL), Prompt(SPAN_PROMPT, 4, ControlTokens(1, 2, 4))):
        with pytest.raises(ValueError, match=f"composed for block_size {other.block_size} and .*llm.composer"):
            tiny.generate(other, greedy(2), use_tqdm=False)
    rotated = mp.LLM(str(tiny_dir), device="cpu", max_model_len=128, num_blocks=64, block_size=4,
                     control_tokens=CONTROL, position_free=False)  # fmt: skip
    with pytest.raises(ValueError, match="prompt 0: span marker SSEP at index 4: span semantics need position_free"):
        rotated.generate(prompt, greedy(2), use_tqdm=False)  # a composed prompt asks for spans: not ignored
    rotated.close()


def test_a_composed_prompts_text_and_ids_come_back_in_its_output(tiny):
    """A composed prompt goes to the engine whole: its output carries the prompt's decoded text and its ids."""
    prompt = Prompt(SPAN_PROMPT, 4, CONTROL, ("sys", "doc", "q"), text="the decoded prompt")
    (out,) = tiny.generate(prompt, greedy(2), use_tqdm=False)
    assert (out.prompt, out.prompt_token_ids, len(out.token_ids)) == ("the decoded prompt", list(SPAN_PROMPT), 2)


def test_a_device_name_is_cpu_cuda_or_cuda_and_a_number():
    with pytest.raises(ValueError, match="device must be 'cpu', 'cuda' or 'cuda:N' .*got 'cuda:'"):
        checked_device("cuda:")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="device='cuda:1' was asked for, but torch sees no CUDA device"):
            checked_device("cuda:1")


class RecordingLLM:
    """Stands in for the default LLM: records what the module-level generate passes, one output per prompt."""

    def __init__(self):
        self.calls = []

    def generate(self, prompts, params, use_tqdm):
        self.calls.append((prompts, params, use_tqdm))
        return [f"output of {p}" for p in llm_module.normalize_prompts(prompts)]


def test_module_level_generate_takes_keywords_as_params_and_gives_a_list_for_a_list(monkeypatch):
    recorder = RecordingLLM()
    monkeypatch.setattr(llm_module, "get_default_llm", lambda: recorder)
    assert mp.generate("a", max_tokens=3, temperature=0.5, top_k=2) == "output of a"
    assert mp.generate(["b"]) == ["output of b"]  # a list of one prompt is a list
    assert recorder.calls == [
        ("a", mp.SamplingParams(max_tokens=3, temperature=0.5, top_k=2), False),
        (["b"], mp.SamplingParams(temperature=0.0), False),  # greedy unless told
    ]


def test_module_level_generate_passes_the_callers_sampling_params_as_they_are(monkeypatch):
    """Given sampling_params (and no keywords), the module-level generate hands that object on: its temperature 1.0
    is not made greedy, as the keyword form's default is."""
    recorder = RecordingLLM()
    monkeypatch.setattr(llm_module, "get_default_llm", lambda: recorder)
    params = mp.SamplingParams(max_tokens=5, seed=3)
    assert mp.generate(["a", "b"], params) == ["output of a", "output of b"]
    ((prompts, passed, use_tqdm),) = recorder.calls
    assert (prompts, use_tqdm) == (["a", "b"], False) and passed is params and passed.temperature == 1.0


@pytest.mark.parametrize("message", [{"content": "hi"}, {"role": 1, "content": "hi"}, {"role": "user", "content": 2}])
def test_a_chat_message_needs_a_role_string_and_a_content_string(message):
    with pytest.raises(ValueError, match=r'message 1 must have a "role" and a "content" string'):
        llm_module._check_messages([{"role": "system", "content": "Be brief."}, message])


def test_token_ids_in_a_tuple_are_one_prompt(tiny):
    """A tuple of ints is one token-id prompt, as a list is: one output, its ids as a list."""
    (out,) = tiny.generate((5, 6, 7), greedy(2), use_tqdm=False)
    assert (out.prompt_token_ids, len(out.token_ids)) == ([5, 6, 7], 2)


def test_numpy_and_torch_integers_are_one_token_id_prompt_and_a_bool_is_not_a_token_id(tiny):
    """A single prompt of numpy's or torch's integers is one prompt, as in a batch; a bool among ints is not a token
    id, so [True, 6] is a batch whose prompt 0 names its type."""
    import numpy as np

    for ids in (list(np.array([5, 6, 7])), list(torch.tensor([5, 6, 7]))):
        (out,) = tiny.generate(ids, greedy(2), use_tqdm=False)
        assert (out.prompt_token_ids, len(out.token_ids)) == ([5, 6, 7], 2)
    with pytest.raises(
        TypeError, match="^prompt 0: a prompt must be text, token ids, chat messages or a Prompt, got bool$"
    ):
        tiny.generate([True, 6], greedy(2), use_tqdm=False)
    assert not tiny.engine.has_unfinished()


def test_a_list_mixing_a_chat_message_and_another_prompt_is_a_batch_whose_bad_prompt_names_itself(tiny):
    """Only a list of nothing but messages is a chat: a lone message dict in a batch is prompt 0 of the wrong type."""
    message = "^prompt 0: a prompt must be text, token ids, chat messages or a Prompt, got dict$"
    with pytest.raises(TypeError, match=message):
        tiny.generate([{"role": "user", "content": "hi"}, [5, 6]], greedy(2), use_tqdm=False)
    assert not tiny.engine.has_unfinished()


def test_stats_are_read_on_the_engine_loop_thread(tiny, monkeypatch):
    """stats() runs between the loop's steps (on its thread), never on the caller's while a step runs."""
    import threading

    from minipic_lite.engine import LLMEngine

    threads, real = [], LLMEngine.cache_stats

    def recorded(engine):
        threads.append(threading.current_thread())
        return real(engine)

    monkeypatch.setattr(LLMEngine, "cache_stats", recorded)
    stats = tiny.stats()
    assert isinstance(stats, dict) and stats == real(tiny.engine)
    assert len(threads) == 1 and threads[0] is not threading.current_thread()


def test_text_and_chat_prompts_get_no_bos_of_the_tokenizers_own(tmp_path):
    """Prompts are tokenized without special tokens: with a tokenizer that adds a BOS (Llama 2's kind; SmolLM2's adds
    none) a text prompt starts at its first word, and a chat gets the one BOS its template writes, not a second."""
    bos_tokenizer().save_pretrained(save_tiny_llama(tmp_path, vocab_size=len(BOS_VOCAB)))
    llm = mp.LLM(str(tmp_path), device="cpu", max_model_len=128, num_blocks=16)

    def ids(words: str) -> list[int]:
        return llm.tokenizer.convert_tokens_to_ids(words.split())

    assert llm.tokenizer.encode("hello world") == ids("<s> hello world")  # the tokenizer's own default adds it
    chat = [{"role": "user", "content": "hello"}]
    outs = llm.generate(["hello world", chat], greedy(1), use_tqdm=False)
    assert [o.prompt_token_ids for o in outs] == [
        ids("hello world"),
        ids("<s> <|im_start|> user hello <|im_end|> <|im_start|> assistant"),
    ]
    llm.close()


def test_the_llm_docstring_names_every_option_llm_takes():
    """`help(mp.LLM)` is where a newcomer looks for the knobs: each option `from_options` routes is named there."""
    from dataclasses import fields

    from minipic_lite.config import ENGINE_OPTIONS, CacheConfig, SchedulerConfig

    options = {f.name for c in (CacheConfig, SchedulerConfig) for f in fields(c)} | ENGINE_OPTIONS
    assert sorted(o for o in options if o not in mp.LLM.__doc__) == []


def test_stream_given_a_batch_says_it_takes_one_prompt(tiny):
    """A list of prompts (vLLM's generate() habit) was read as one prompt of token ids: 'token id [5, 6] is not an
    integer'. It is a TypeError that points to generate()."""
    with pytest.raises(TypeError, match=r"stream\(\) takes one prompt, got a list of 2 prompts: LLM.generate\(\)"):
        tiny.stream([[5, 6], [7, 8]], greedy(2))
    (out,) = list(tiny.stream([5, 6], greedy(2)))[-1:]  # one prompt of token ids still streams
    assert out.finished and len(out.token_ids) == 2


def test_a_batch_of_one_prompt_is_named_in_the_singular_and_one_prompt_with_a_bad_id_is_no_batch():
    from minipic_lite.llm import check_one_prompt

    with pytest.raises(TypeError, match=r"^stream\(\) takes one prompt, got a list of 1 prompt: LLM.generate\(\)"):
        check_one_prompt([[5, 6]], "stream()")
    check_one_prompt([5, 6], "stream()")  # one prompt of token ids
    check_one_prompt([5, "7"], "stream()")  # one prompt with a bad id: no batch (the ids' check names the id)


class StubLLM:
    """Stands in for LLM() in get_default_llm: counts the engines built (slowly, so that callers overlap)."""

    built = 0

    def __init__(self):
        import time

        time.sleep(0.05)
        StubLLM.built += 1
        self._loop = SimpleNamespace(closed=False)

    def close(self):
        self._loop.closed = True


def test_the_default_llm_is_built_once_for_many_threads_and_again_once_closed(monkeypatch):
    """Callers of mp.generate from several threads at first use each built an engine (seconds and ~2 GB each); after
    `mp.get_default_llm().close()`, every mp.generate failed with "the engine loop is closed"."""
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.setattr(llm_module, "LLM", StubLLM)
    monkeypatch.setattr(llm_module, "_default_llm", None)
    monkeypatch.setattr(StubLLM, "built", 0)
    with ThreadPoolExecutor(4) as pool:
        engines = list(pool.map(lambda _: mp.get_default_llm(), range(4)))
    assert StubLLM.built == 1 and all(e is engines[0] for e in engines)
    engines[0].close()
    assert mp.get_default_llm() is not engines[0] and StubLLM.built == 2


def test_float16_on_the_cpu_has_no_decode_route_and_gives_transformers_tokens(tiny_dir):
    """float16 on the CPU is allowed (config.py warns that it is slow): neither oneDNN's packing nor the C loop takes
    it, so the runner times no routes, the model follows no route, and every matmul is F.linear in float16. Its
    greedy tokens are transformers' in float16 (the tiny model's wide lm_head keeps rounding from flipping one)."""
    from transformers import AutoModelForCausalLM

    llm = mp.LLM(str(tiny_dir), device="cpu", dtype="float16", max_model_len=64, num_blocks=32, block_size=4)
    runner = llm.engine.runner
    assert runner.decode_routes == {} and runner.model.matmul_route is None and runner.dtype == torch.float16
    prompts = [[5, 6, 7, 8, 9], [10, 11, 12]]
    params = mp.SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, detokenize=False)
    outs = llm.generate(prompts, params, use_tqdm=False)
    llm.close()
    hf = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float16).eval()
    for token_ids, out in zip(prompts, outs, strict=True):
        mask = torch.ones(1, len(token_ids), dtype=torch.long)
        with torch.no_grad():
            expected = hf.generate(torch.tensor([token_ids]), attention_mask=mask, max_new_tokens=6, do_sample=False,
                                   eos_token_id=None, pad_token_id=0)  # fmt: skip
        assert out.token_ids == expected[0, len(token_ids) :].tolist()
