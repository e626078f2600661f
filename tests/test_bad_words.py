"""`SamplingParams.bad_words` (vLLM's): the sampler's `BadWords` on small logits (a word's last token blocked where the
output ends with its tokens before it), the words' spellings through SmolLM2's tokenizer, and the engine's greedy
tokens against transformers' `generate(bad_words_ids=...)` on the real weights (fp32, CPU)."""

import math

import numpy as np
import pytest
import torch

import minipic_lite as mp
from minipic_lite.engine import bad_word_ids
from minipic_lite.sampler import BadWords, Sampler
from tests.conftest import save_tiny_llama

CPU = torch.device("cpu")
CHAT = [{"role": "user", "content": "Tell me a short story about a brave mouse."}]


def blocked(bad: BadWords, vocab: int = 10) -> list[list[int]]:
    logits = bad(torch.zeros(bad.recent.shape[0], vocab))
    return [[t for t in range(vocab) if logits[row, t] == -math.inf] for row in range(len(logits))]


def test_a_words_last_token_is_blocked_where_the_output_ends_with_the_rest():
    params = [mp.SamplingParams(bad_words_token_ids=[[4], [1, 2, 3], [7, 3]]), mp.SamplingParams(),
              mp.SamplingParams(bad_words_token_ids=[[1, 2, 3]])]  # fmt: skip
    histories = [([5, 1, 2], 1), ([1, 2], 0), ([1, 2], 2)]  # row 2: [1, 2] is its prompt, not its output
    bad = BadWords.build(params, histories, CPU)
    assert blocked(bad) == [[3, 4], [], []], "vLLM matches the output alone"
    bad.advance(torch.tensor([7, 1, 1]))  # row 0's output now ends [..., 2, 7]; row 2's [1]
    assert blocked(bad) == [[3, 4], [], []], "row 0: the word [7, 3] blocks 3 (and [1, 2, 3] no longer does)"
    bad.advance(torch.tensor([0, 0, 2]))
    assert blocked(bad) == [[4], [], [3]]


def test_a_token_two_words_end_with_is_blocked_if_either_matches():
    """Words [1, 3] and [2, 3]: the output ends with 2, so 3 is blocked although [1, 3] does not match."""
    bad = BadWords.build([mp.SamplingParams(bad_words_token_ids=[[1, 3], [2, 3]])], [([2], 0)], CPU)
    assert blocked(bad) == [[3]]


def test_the_sampler_never_draws_a_blocked_token_and_counts_its_own_samples():
    """Sampled rows through `Sampler`: the word [5, 6] can never be completed, over many draws and steps."""
    sampler = Sampler(CPU)
    params = [mp.SamplingParams(temperature=1.0, seed=s, bad_words_token_ids=[[5, 6], [9]]) for s in range(8)]
    batch = sampler.prepare([str(s) for s in range(8)], params, [([1], 1)] * 8, 10)
    logits = torch.zeros(8, 10)
    logits[:, [5, 6, 9]] = 3.0  # the likeliest tokens
    drawn = torch.stack([sampler(logits, batch) for _ in range(40)], dim=1)  # (8, 40)
    assert not (drawn == 9).any()
    assert not ((drawn[:, :-1] == 5) & (drawn[:, 1:] == 6)).any() and (drawn == 5).any() and (drawn == 6).any()


def test_bad_words_without_the_rows_token_ids_are_an_error():
    with pytest.raises(ValueError, match="bad words need each row's token ids"):
        Sampler(CPU).prepare(["0"], [mp.SamplingParams(bad_words_token_ids=[[5]])], None, 10)


def test_each_word_is_blocked_as_spelled_alone_and_after_a_space(llm):
    tok = llm.tokenizer
    ids = bad_word_ids(tok, ("Red", " blue moon"))
    spellings = ["Red", " Red", "blue moon", " blue moon"]
    assert set(ids) == {tuple(tok.encode(s, add_special_tokens=False)) for s in spellings}
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"bad_words": [""]}, "bad_words must be non-empty words"),
        ({"bad_words": []}, "bad_words must be non-empty words"),
        ({"bad_words_token_ids": [[]]}, "bad_words_token_ids must hold non-empty sequences"),
        ({"bad_words_token_ids": [[1, -2]]}, "bad_words_token_ids must hold non-negative int token ids"),
        ({"bad_words": 5}, "bad_words must be a sequence"),
        ({"bad_words": ["ok", " "]}, "bad_words must be non-empty words"),
        ({"bad_words": ["ok", 5]}, "bad_words must be non-empty words"),
    ],
)
def test_bad_words_that_are_not_words_are_an_error_naming_the_field(kwargs, error):
    with pytest.raises((ValueError, TypeError), match=error):
        mp.SamplingParams(**kwargs)


def test_bad_words_come_back_as_tuples_and_one_string_is_one_word():
    """A string is one word (not its letters); the words and the token id sequences are kept as tuples of str / int."""
    assert mp.SamplingParams(bad_words="Red").bad_words == ("Red",)
    assert mp.SamplingParams(bad_words=["Red", " blue"]).bad_words == ("Red", " blue")
    params = mp.SamplingParams(bad_words_token_ids=[[1, 2], (np.int64(3),)])
    assert params.bad_words_token_ids == ((1, 2), (3,)) and type(params.bad_words_token_ids[1][0]) is int


def test_a_word_given_twice_or_with_its_space_is_one_spelling_each(llm):
    tok = llm.tokenizer
    spelled = [tuple(tok.encode(s, add_special_tokens=False)) for s in ("Red", " Red")]
    assert bad_word_ids(tok, ("Red", " Red", "Red")) == tuple(spelled)


def test_a_graphs_argmax_of_a_blocked_token_is_not_taken():
    """A greedy row given its argmax (a CUDA graph's, of the logits before the words were blocked) draws the next."""
    sampler = Sampler(CPU)
    batch = sampler.prepare(["0"], [mp.SamplingParams(temperature=0.0, bad_words_token_ids=[[4]])], [([1], 1)], 10)
    logits = torch.zeros(1, 10)
    logits[0, 4], logits[0, 7] = 5.0, 3.0
    assert sampler(logits, batch, greedy_tokens=torch.tensor([4])).tolist() == [7]


def test_bad_word_ids_outside_the_vocabulary_are_an_error(llm):
    vocab = llm.config.model.vocab_size
    with pytest.raises(ValueError, match=f"bad_words_token_ids names token id {vocab}, outside the vocabulary"):
        llm.generate("Hi", mp.SamplingParams(bad_words_token_ids=[[1, vocab]]), use_tqdm=False)


def test_a_bad_words_first_token_outside_the_vocabulary_is_an_error_too(llm):
    """Every token of a word is checked, not its last alone."""
    vocab = llm.config.model.vocab_size
    with pytest.raises(ValueError, match=f"bad_words_token_ids names token id {vocab}, outside the vocabulary"):
        llm.generate("Hi", mp.SamplingParams(bad_words_token_ids=[[vocab, 1]]), use_tqdm=False)


def test_bad_words_without_a_tokenizer_are_an_error_and_token_ids_work(tmp_path):
    tiny = mp.LLM(str(save_tiny_llama(tmp_path, vocab_size=64)), device="cpu", dtype="float32", max_model_len=64)
    try:
        with pytest.raises(ValueError, match="bad_words need the model's tokenizer: give bad_words_token_ids"):
            tiny.generate([[5, 6, 7]], mp.SamplingParams(bad_words=["x"]), use_tqdm=False)
        greedy = mp.SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
        (plain,) = tiny.generate([[5, 6, 7]], greedy, use_tqdm=False)
        first = plain.token_ids[0]
        banned = mp.SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, bad_words_token_ids=[[first]])
        (out,) = tiny.generate([[5, 6, 7]], banned, use_tqdm=False)
        assert first not in out.token_ids
    finally:
        tiny.close()


@pytest.fixture(scope="module")
def story(llm, hf_model):
    """transformers' greedy story and a two-token word inside it (whose first token the prompt does not end with:
    transformers matches a word's start against the prompt too, vLLM against the output alone)."""
    (out,) = llm.generate(CHAT, mp.SamplingParams(max_tokens=40, temperature=0.0), use_tqdm=False)
    ids = out.token_ids
    i = next(i for i in range(1, len(ids) - 1) if ids[i] != out.prompt_token_ids[-1] and ids[i] != ids[i + 1])
    return out, (ids[i], ids[i + 1])


def hf_greedy(hf_model, prompt_ids: list[int], bad_words_ids: list[list[int]], max_tokens: int) -> list[int]:
    ids = hf_model.generate(torch.tensor([prompt_ids]), max_new_tokens=max_tokens, do_sample=False,
                            bad_words_ids=bad_words_ids, pad_token_id=0)[0, len(prompt_ids):]  # fmt: skip
    eos = hf_model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    cut = next((j + 1 for j, t in enumerate(ids.tolist()) if t in eos), len(ids))
    return ids[:cut].tolist()


def test_greedy_tokens_are_transformers_with_the_same_bad_words(llm, hf_model, story):
    out, word = story
    words = [list(word), [out.token_ids[0]]]  # a two-token word and the story's first token
    params = mp.SamplingParams(max_tokens=40, temperature=0.0, bad_words_token_ids=words)
    (ours,) = llm.generate(CHAT, params, use_tqdm=False)
    assert ours.token_ids != out.token_ids and out.token_ids[0] not in ours.token_ids
    assert ours.token_ids == hf_greedy(hf_model, out.prompt_token_ids, words, 40)


def test_a_words_text_is_never_generated_also_beside_given_token_ids(llm, story):
    """`bad_words` alone, and beside `bad_words_token_ids` (both blocked: the words were once dropped there)."""
    out, _ = story
    word = out.text.split()[2].strip(".,!?\"'")
    for given in (None, [[5]]):
        params = mp.SamplingParams(max_tokens=40, temperature=0.0, bad_words=[word], bad_words_token_ids=given)
        (ours,) = llm.generate(CHAT, params, use_tqdm=False)
        assert word in out.text and f" {word}" not in ours.text and not ours.text.startswith(word)


def test_each_of_n_completions_keeps_its_own_recent_tokens(llm, story):
    """Greedy n = 3 beside a plain request: every row matches the word against its own output (the completions
    equal the request alone, which the test above holds to transformers)."""
    out, word = story
    greedy = mp.SamplingParams(max_tokens=40, temperature=0.0, bad_words_token_ids=[list(word)])
    (alone,) = llm.generate(CHAT, greedy, use_tqdm=False)
    assert alone.token_ids != out.token_ids, "the word is no longer in the story"
    params = [mp.SamplingParams(max_tokens=40, temperature=0.0, n=3, bad_words_token_ids=[list(word)]),
              mp.SamplingParams(max_tokens=40, temperature=0.0)]  # fmt: skip
    many, plain = llm.generate([CHAT, CHAT], params, use_tqdm=False)
    assert [c.token_ids for c in many.outputs] == [alone.token_ids] * 3 and plain.token_ids == out.token_ids
