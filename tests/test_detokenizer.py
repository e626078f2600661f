"""The text of a request's output decoded a token at a time, held to the tokenizer's full decode of the same tokens
(less an incomplete character at the end), on SmolLM2's real tokenizer and on two built offline."""

import random
from itertools import pairwise

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from tokenizers.decoders import DecodeStream
from transformers import PreTrainedTokenizerFast

import minipic_lite as mp
from minipic_lite.checkpoints.streams import load_essays
from minipic_lite.detokenizer import CONTEXT_TOKENS, Detokenizer
from minipic_lite.engine import find_stop
from minipic_lite.models.loader import load_tokenizer
from tests.conftest import bos_tokenizer

MIXED = "Zürich, São Paulo and 東京: naïve café prices ≈ 3 € 🙂🚀, said the résumé's “author”.\n\tThe end."


def byte_fallback_tokenizer():
    """A SentencePiece-like tokenizer (Llama 2's decoder: '▁' for spaces, byte tokens for what the vocabulary lacks,
    the first space stripped), built offline; its byte tokens split a character over several tokens."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{i:02X}>": 3 + i for i in range(256)}}
    for piece in ("▁", "▁The", "▁end", "ö", "ü", "字", "▁caf", "é", "e", "n", "d", "h", "r"):
        vocab[piece] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


@pytest.fixture(scope="module")
def smollm2(model_dir):
    return load_tokenizer(model_dir)


@pytest.fixture(scope="module")
def essay():
    return next(iter(load_essays().values()))[:3_000]


def tokenizer_named(name, smollm2):
    return {"smollm2": smollm2, "word_level": bos_tokenizer(), "byte_fallback": byte_fallback_tokenizer()}[name]


def with_special_tokens(tokenizer, ids: list[int]) -> list[int]:
    """`ids` with the end-of-sequence token at two places, one of them at the start."""
    eos = tokenizer.eos_token_id
    return [eos, *ids[: len(ids) // 2], eos, *ids[len(ids) // 2 :]]


def assert_follows_the_full_decode(tokenizer, ids: list[int], skip: bool, burst: int, first: int = 0):
    """After each read the text is the full decode of the tokens so far, less an incomplete character at the end.

    Byte-fallback decoders are held to less where a character is incomplete: they decode a run of byte tokens
    together, and a run that is no UTF-8 becomes a '\ufffd' per byte, the complete ones before it too ('t' and the
    first byte of '—' decode as '\ufffd\ufffd'). There the text must lead to the next whole character's text."""
    detokenizer = Detokenizer(tokenizer, skip, first=first)
    exact = not isinstance(tokenizer.backend_tokenizer.decoder, decoders.Sequence)
    assert detokenizer.is_incremental
    pending, before = [], ""
    for n in range(first, len(ids) + 1, burst):
        text, full = detokenizer.update(ids[:n]), tokenizer.decode(ids[first:n], skip_special_tokens=skip)
        assert text.startswith(before) and detokenizer.num_kept == len(before)  # what a stop search may skip
        before = text
        if exact or not full.endswith("\ufffd"):
            assert text == full.rstrip("\ufffd"), (n, ids[first:n])
            assert all(full.startswith(t) for t in pending), (n, pending, full)
            pending = []
        else:
            pending.append(text)
    assert detokenizer.is_incremental  # never fell back to full decodes


@pytest.mark.parametrize("name", ["smollm2", "word_level", "byte_fallback"])
@pytest.mark.parametrize("skip", [True, False])
@pytest.mark.parametrize("burst", [1, 3])
def test_the_text_after_each_token_is_the_full_decodes(name, skip, burst, smollm2, essay):
    """Real text (an essay; accents, CJK and emoji split over byte tokens) with special tokens inside, read a token
    or a burst of 3 at a time: after each read the text is the full decode of the tokens so far."""
    tokenizer = tokenizer_named(name, smollm2)
    for text in (essay, MIXED):
        ids = with_special_tokens(tokenizer, tokenizer.encode(text, add_special_tokens=False))
        assert_follows_the_full_decode(tokenizer, ids, skip, burst)


def test_the_text_starts_after_the_prompt(smollm2, essay):
    """`first`: the output's tokens start after the prompt's, which are never read."""
    ids = smollm2.encode(essay)
    assert_follows_the_full_decode(smollm2, ids, True, 1, first=len(ids) // 2)


def test_random_tokens_on_smollm2s_byte_level_tokenizer(smollm2):
    """Any tokens, even bytes that never make a character: SmolLM2's decoder maps each token to its own bytes, so
    the text after each token is still the full decode's."""
    rng = random.Random(0)
    for _ in range(50):
        ids = [rng.randrange(len(smollm2)) for _ in range(rng.randrange(1, 40))]
        assert_follows_the_full_decode(smollm2, ids, skip=rng.random() < 0.5, burst=rng.choice([1, 2]))


def test_bytes_that_are_no_utf8_fall_back_to_full_decodes():
    """A byte-fallback decoder fed a '$' byte, a lone lead byte and a word: `DecodeStream` raises ("Invalid
    prefix"); the detokenizer turns to full decodes, and its text is theirs."""
    tokenizer = byte_fallback_tokenizer()
    ids = tokenizer.convert_tokens_to_ids(["<0x24>", "<0xC3>", "▁end"])
    detokenizer = Detokenizer(tokenizer, skip_special_tokens=True)
    assert detokenizer.update(ids[:1]) == "$" and detokenizer.is_incremental
    assert detokenizer.update(ids) == tokenizer.decode(ids) == "\ufffd\ufffd end"
    assert not detokenizer.is_incremental
    assert detokenizer.update([*ids, ids[-1]]) == tokenizer.decode([*ids, ids[-1]])


def pieces_read(pieces: list[str], first: int, reads: list[int], skip: bool = True) -> tuple[list[str], list[str]]:
    """The byte-fallback tokenizer's pieces read up to each of `reads`: (the detokenizer's texts, the full decodes)."""
    tokenizer = byte_fallback_tokenizer()
    ids = tokenizer.convert_tokens_to_ids(pieces)
    detokenizer = Detokenizer(tokenizer, skip, first=first)
    texts = [detokenizer.update(ids[:n]) for n in reads]
    return texts, [tokenizer.decode(ids[first:n], skip_special_tokens=skip) for n in reads]


def test_held_text_is_decoded_from_the_output_only():
    """A held-back token's text is decoded after the output's tokens before it, never the prompt's: the decoder
    strips the output's first space, which a prompt token in front would keep (a stream would then show ' ' and
    take it back)."""
    texts, full = pieces_read(["▁The", "▁end", "<0x20>", "e"], first=2, reads=[3, 4])
    assert texts == full == ["", "e"]


def test_held_text_is_decoded_after_a_few_tokens_before_it():
    """A space and a lead byte read in one burst after a skipped special token: the space shows at once, decoded
    after the tokens before it (alone, the decoder would strip it as the text's first)."""
    texts, full = pieces_read(["▁The", "</s>", "▁", "<0xE6>", "<0x9D>", "<0xB1>"], first=0, reads=[2, 4, 6])
    assert texts == ["The", "The ", "The 東"] and full == ["The", "The \ufffd", "The 東"]


def test_held_text_keeps_a_replacement_character_before_its_whole_characters(smollm2):
    """A lone continuation byte (no UTF-8: '\ufffd' for good) then ' 東' split over byte tokens: the stream holds both
    back, and the held text keeps the '\ufffd' in front of the space, as the full decode does; only the end's go."""
    lone = smollm2.convert_tokens_to_ids("Ģ")  # byte 0x80 in the byte-level alphabet
    ids = [lone, *smollm2.encode(" 東", add_special_tokens=False)]
    assert smollm2.convert_ids_to_tokens(ids) == ["Ģ", "Ġæ", "Ŀ", "±"]
    detokenizer = Detokenizer(smollm2, skip_special_tokens=True)
    texts = [detokenizer.update(ids[:n]) for n in range(1, len(ids) + 1)]
    assert texts == ["", "\ufffd ", "\ufffd ", "\ufffd 東"] and detokenizer.is_incremental
    assert [smollm2.decode(ids[:n]) for n in (2, 4)] == ["\ufffd \ufffd", "\ufffd 東"]


def test_full_decodes_after_the_fallback_start_after_the_prompt_and_leave_out_an_incomplete_character():
    texts, full = pieces_read(["▁The", "<0x24>", "<0xC3>", "▁end", "<0xE6>"], first=1, reads=[2, 3, 4, 5])
    assert texts == ["$", "$", "\ufffd\ufffd end", "\ufffd\ufffd end"]  # the fallback from the 3rd read
    assert full[2:] == ["\ufffd\ufffd end", "\ufffd\ufffd end\ufffd"]


def test_a_tokenizer_that_cleans_up_spaces_decodes_in_full():
    """`clean_up_tokenization_spaces` rewrites text the stream has shown (" ," becomes ","): such a tokenizer is
    decoded in full each time, and its text is the full decode's."""
    words = Tokenizer(models.WordLevel({w: i for i, w in enumerate(["[UNK]", "hello", ",", "world", "."])}, "[UNK]"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=words, unk_token="[UNK]", clean_up_tokenization_spaces=True)
    ids = tokenizer.encode("hello , world .")
    detokenizer = Detokenizer(tokenizer, skip_special_tokens=True)
    assert not detokenizer.is_incremental
    texts = [detokenizer.update(ids[:n]) for n in range(1, len(ids) + 1)]
    assert texts == [tokenizer.decode(ids[:n], skip_special_tokens=True) for n in range(1, len(ids) + 1)]
    assert texts[-1].endswith("world.") and texts[1] == "hello,"  # not "hello ,"
    assert detokenizer.num_kept == 0  # the text may change anywhere: a stop string is looked for in all of it


def test_find_stop_exact_cases():
    assert find_stop("hello world", ("wor", "o")) == (6, "wor")  # the first stop string listed, not the first place
    assert find_stop("hello world", ("o",)) == (4, "o")  # its first place
    assert find_stop("hello world", ("xyz",)) is None
    assert find_stop("hello world", ("lo w",), searched=5) == (3, "lo w")  # it ends past what was searched
    assert find_stop("hello world", ("hel",), searched=5) is None  # wholly in the searched part
    assert find_stop("abc", ()) is None


def test_find_stop_over_growing_text_is_a_search_of_the_whole_text():
    """Text grown in random pieces, searched past what was searched before: the same stop, at the same place, at the
    same growth as searching the whole text each time."""
    rng = random.Random(1)
    for _ in range(500):
        stop = tuple({"".join(rng.choices("ab", k=rng.randint(1, 4))) for _ in range(rng.randint(1, 3))})
        text, searched, found, expected = "", 0, None, None
        while found is None and expected is None and len(text) < 30:
            text += "".join(rng.choices("abc", k=rng.randint(1, 3)))
            found = find_stop(text, stop, searched)
            hit = next((s for s in stop if s in text), None)  # the engine's search before this change
            expected = None if hit is None else (text.index(hit), hit)
            searched = len(text)
        assert found == expected, (stop, text)


def test_a_stop_string_over_several_tokens_stops_where_it_ends(llm):
    """A stop string whose first character lies three tokens before its last, beside a short one that never comes:
    the request stops at the token that completes it, its text cut just before it."""
    prompt, greedy = "The capital of France is", dict(max_tokens=12, temperature=0.0, ignore_eos=True)
    base = llm.generate(prompt, mp.SamplingParams(**greedy), use_tqdm=False)[0]
    texts = [llm.tokenizer.decode(base.token_ids[:n]) for n in range(1, 13)]
    start = len(texts[2]) - 1  # the last character of token 3
    stop = texts[5][start : len(texts[4]) + 1]  # ... to the first character of token 6
    assert stop not in texts[4] and len(stop) >= 3, (stop, texts)
    for stops in ([stop], ["\x00", stop]):
        out = llm.generate(prompt, mp.SamplingParams(**greedy, stop=stops), use_tqdm=False)[0]
        assert (out.finish_reason, out.stop_reason) == ("stop", stop)
        assert out.token_ids == base.token_ids[:6] and out.text == texts[5][: texts[5].index(stop)]


def test_a_stop_string_that_eos_completes_wins_over_eos(llm):
    """With special tokens kept in the text, the end-of-turn token completes the stop string "<|im_end|>": the
    request stops on the string (its text cut before it), not on the token, as the text is checked first."""
    greedy = dict(max_tokens=64, temperature=0.0, skip_special_tokens=False)
    chat = [{"role": "user", "content": "Say hi."}]
    base = llm.generate(chat, mp.SamplingParams(**greedy), use_tqdm=False)[0]
    assert base.finish_reason == "stop" and base.stop_reason == 2 and base.text.endswith("<|im_end|>")
    out = llm.generate(chat, mp.SamplingParams(**greedy, stop=["<|im_end|>"]), use_tqdm=False)[0]
    assert (out.finish_reason, out.stop_reason) == ("stop", "<|im_end|>")
    assert out.token_ids == base.token_ids and out.text == base.text.removesuffix("<|im_end|>")


def test_a_stream_without_detokenize_shows_no_text(llm):
    params = mp.SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, detokenize=False)
    outputs = list(llm.stream("The capital of France is", params))
    assert len(outputs) == 4 and all(out.text == "" for out in outputs) and len(outputs[-1].token_ids) == 4


class CountingTokenizer:
    """A tokenizer that counts its `decode` calls and their tokens."""

    def __init__(self, tokenizer):
        self.tokenizer, self.calls = tokenizer, []

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)

    def decode(self, ids, **kwargs):
        self.calls.append(len(ids))
        return self.tokenizer.decode(ids, **kwargs)


def test_a_streamed_request_with_stop_strings_decodes_its_whole_output_once(llm, monkeypatch):
    """A stream with a stop string needs its text at every token: each token is decoded once as it comes, and the
    whole output once, for the final text (before: the whole output at every token, and again for its output).
    The greedy answer holds a character split over two tokens: the tokens before it are decoded again, a few."""
    counting = CountingTokenizer(llm.engine.tokenizer)
    monkeypatch.setattr(llm.engine, "tokenizer", counting)
    params = mp.SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True, stop=["\x00"])
    outputs = list(llm.stream("Tell me about caches.", params))
    assert len(outputs) == 16 and outputs[-1].finished
    # NOTE: besides the final text's, only decodes of a few tokens: a character split over tokens (a stream holds
    # them) is decoded after CONTEXT_TOKENS before it
    assert counting.calls[-1] == 16 and all(n <= CONTEXT_TOKENS + 3 for n in counting.calls[:-1]), counting.calls
    assert all(b.text.startswith(a.text) for a, b in pairwise(outputs))
    assert outputs[-1].text == llm.tokenizer.decode(outputs[-1].token_ids, skip_special_tokens=True)


def test_a_request_keeps_one_decode_stream_and_feeds_it_each_output_token_once(llm, monkeypatch):
    """The engine keeps a request's detokenizer across steps: one `DecodeStream`, fed each new token once (a fresh
    one a step would read the whole output again, O(length²) per answer, with the same text)."""
    streams, fed = [], []

    class CountingDecodeStream:
        def __init__(self, **kwargs):
            self.stream = DecodeStream(**kwargs)
            streams.append(self)

        def step(self, backend, ids):
            fed.append(len(ids))
            return self.stream.step(backend, ids)

    monkeypatch.setattr("minipic_lite.detokenizer.DecodeStream", CountingDecodeStream)
    params = mp.SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True, stop=["\x00"])
    outputs = list(llm.stream("Tell me about caches.", params))
    assert len(outputs[-1].token_ids) == 16 and outputs[-1].finished
    assert (len(streams), fed) == (1, [1] * 16)
