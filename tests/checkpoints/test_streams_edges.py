"""Edges of the request streams (checkpoints/streams.py) that test_streams leaves open: a spec needs a request and a
prefix, the length bounds of the loaded texts are inclusive, runs of blank lines fold to one, popularity is Zipf's
1 / rank, a span has as many words as drawn, a question about a word asks about a long one, more prefixes than texts
take every text, an unknown stream is named, and `chat` is SmolLM2's own chat template (its tokenizer the oracle)."""

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
