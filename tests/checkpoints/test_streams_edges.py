"""Edges of the request streams (checkpoints/streams.py) that test_streams leaves open: a spec needs a request and a
prefix, the length bounds of the loaded texts are inclusive, runs of blank lines fold to one, popularity is Zipf's
1 / rank, a span has as many words as drawn, a question about a word asks about a long one, more prefixes than texts
take every text, an unknown stream is named, and `chat` is SmolLM2's own chat template (its tokenizer the oracle);
the bounds of every drawn span and count, and a long word's seven letters."""

import dataclasses
import random

import pytest

from minipic_lite.checkpoints import streams
from minipic_lite.checkpoints.streams import StreamSpec


@pytest.mark.parametrize("spec", [dict(num_requests=0), dict(num_prefixes=0)], ids=["no-request", "no-prefix"])
def test_a_spec_needs_a_request_and_a_prefix(spec):
    with pytest.raises(ValueError, match="a stream needs >= 1 request and prefix"):
        StreamSpec(**spec)


def test_the_length_bounds_of_the_texts_are_inclusive():
    essays = streams.load_essays()
    shortest = min(len(text) for text in essays.values())
    assert min(len(text) for text in streams.load_essays(min_chars=shortest).values()) == shortest
    prompts = streams.load_system_prompts(min_chars=0, max_chars=3_000)
    assert prompts and max(len(text) for text in prompts.values()) <= 3_000
    longest = max(len(text) for text in prompts.values())
    assert max(len(text) for text in streams.load_system_prompts(min_chars=longest, max_chars=longest).values()) == (
        longest
    )


def test_runs_of_blank_lines_fold_to_one_and_the_ends_are_stripped():
    assert streams._clean("\n  a\n\n\nb\n\n\n\nc\n\nd \n") == "a\n\nb\n\nc\n\nd"


class FirstChoices(random.Random):
    """Draws the smallest count and start, the last of a choice, and records the weights of `choices`."""

    def randint(self, a, b):
        return a

    def randrange(self, n):
        return 0

    def choice(self, seq):
        return seq[-1]

    def choices(self, population, weights=None, k=1):
        self.weights = weights
        return list(population)[:k]


def test_popularity_is_one_over_the_rank():
    rng = FirstChoices()
    streams._zipf_choices(rng, 4, StreamSpec(num_requests=2))
    assert rng.weights == [1.0, 1 / 2, 1 / 3, 1 / 4]


def test_a_span_has_the_drawn_number_of_words():
    words = [f"w{i}" for i in range(10)]
    assert streams._span(FirstChoices(), words, 4, 9) == "w0 w1 w2 w3"


def test_a_question_about_a_word_asks_about_a_long_one():
    """The last stem asks about a word; the words of 7 letters or more are its choices ("cat" is not one)."""
    question = streams._question(FirstChoices(), ["Alphabetical", "order", "cat"])
    assert question.startswith("Which of the following best describes the author's attitude towards Alphabetical?")


def test_more_prefixes_than_texts_take_every_text_and_an_unknown_stream_is_named():
    texts = streams.essay_question_texts(StreamSpec(num_requests=3, num_prefixes=10_000))
    assert len(texts) == 3
    with pytest.raises(ValueError, match="unknown stream 'nope'; choose from"):
        streams.stream_token_ids("nope", tokenizer=object())


def test_chat_is_the_default_models_chat_template():
    tokenizer = streams.load_tokenizer()
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    expected = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert streams.chat("Be brief.", "Hi!") == expected


class RecordingDraws(FirstChoices):
    """FirstChoices that also records the bounds of every count it draws."""

    def __init__(self):
        super().__init__(0)
        self.bounds = []

    def randint(self, a, b):
        self.bounds.append((a, b))
        return a


def test_a_question_and_a_user_turn_draw_their_spans_and_counts_within_their_bounds():
    """A question quotes 4..14 words and offers four options of 3..16; a user turn asks for 3..7 items, quotes 5..20
    words and pastes a passage of 30..160 (in that order)."""
    words = ["Alphabetical"] * 200
    rng = RecordingDraws()
    streams._question(rng, words)
    assert rng.bounds == [(4, 14)] + [(3, 16)] * 4
    rng = RecordingDraws()
    streams._user_turn(rng, words)
    assert rng.bounds == [(3, 7), (5, 20), (30, 160)]


def test_a_long_word_has_seven_letters_or_more():
    """The last stem asks about the last long word: "chapter" (7 letters) is one, "garden" (6) is not."""
    question = streams._question(FirstChoices(), ["Alphabetical", "chapter", "garden"])
    assert question.startswith("Which of the following best describes the author's attitude towards chapter?")


def test_a_spec_of_one_request_over_one_prefix_is_valid():
    spec = StreamSpec(num_requests=1, num_prefixes=1)
    assert (spec.num_requests, spec.num_prefixes) == (1, 1)


def test_a_spec_is_a_frozen_value():
    """A spec names a stream: equal specs are equal, and none can be changed once made."""
    spec = StreamSpec()
    assert spec == StreamSpec() and hash(spec) == hash(StreamSpec())
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.seed = 1


class MiddleStart(FirstChoices):
    def randrange(self, n):
        return n // 2


def test_a_span_starts_where_drawn_among_the_starts_that_leave_room_for_all_its_words():
    """10 words, a span of 4: the start is drawn from range(10 - 4) (the last start, 6, is never drawn); the middle
    draw, 3, gives words 3..6."""
    words = [f"w{i}" for i in range(10)]
    assert streams._span(MiddleStart(), words, 4, 9) == "w3 w4 w5 w6"


class Characters:
    """A stand-in tokenizer: one id per character; records whether special tokens were asked for."""

    def __init__(self):
        self.flags = []

    def encode(self, text, add_special_tokens):
        self.flags.append(add_special_tokens)
        return [ord(c) for c in text]


def test_a_named_stream_is_its_texts_tokenized_without_special_tokens():
    """The chat format already holds its special tokens: the tokenizer adds none."""
    spec, tokenizer = StreamSpec(num_requests=2, num_prefixes=1), Characters()
    token_ids = streams.stream_token_ids("system_prompts", spec, tokenizer=tokenizer)
    assert token_ids == [[ord(c) for c in text] for text in streams.system_prompt_texts(spec)]
    assert tokenizer.flags == [False, False]


def test_a_span_of_a_text_with_no_word_to_spare_starts_at_its_first_word():
    words = [f"w{i}" for i in range(5)]
    assert streams._span(MiddleStart(), words, 4, 9) == "w0 w1 w2 w3"  # one start leaves room for 4 words
    assert streams._span(random.Random(0), words[:4], 4, 4) == "w0 w1 w2 w3"
