"""Edges of the prompt composer (prompts.py) on a character tokenizer: empty pieces, padding without a pad id,
markers in the first piece (and the first of two), the chat frame's switches, epic documents that fit in their link
block, the composer `for_llm` builds, and recipe inputs of the wrong type (documents given as one string, a document,
question or system that is no string, schema items and pieces of no text, each error naming what it got); which
values are token ids; prompts, pieces and schema items as frozen values; the composer's short repr; and, on a real
Hugging Face tokenizer that adds a BOS, a recipe with none in the middle."""

import copy
import dataclasses
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import minipic_lite as mp
from minipic_lite.config import CacheConfig, ControlTokens
from minipic_lite.prompts import Piece, PromptComposer, is_token_id
from minipic_lite.spans import SegmentKind
from tests.conftest import bos_tokenizer

S, P, PAD = 1, 2, 3
CONTROL = ControlTokens(ssep_id=S, pdep_id=P, pad_id=PAD)
BOS = 7


class CharTokenizer:
    """One token per character; a BOS token when special tokens are asked for; a chat template when given one."""

    def __init__(self, chat_template=None):
        self.chat_template = chat_template
        self.rendered = []

    def encode(self, text, add_special_tokens=True):
        return [BOS] * add_special_tokens + [ord(c) for c in text]

    def decode(self, token_ids, skip_special_tokens=False):
        return "".join("|" if t in (S, P, PAD) else chr(t) for t in token_ids)

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        self.rendered.append(messages)
        system = messages[0]["content"] if messages[0]["role"] == "system" else "default"
        return f"<{system}>[{messages[-1]['content']}]"


def composer(tokenizer=None, control=CONTROL, chat=True) -> PromptComposer:
    return PromptComposer(tokenizer or CharTokenizer(), control, block_size=4, chat=chat)


def test_pieces_are_tokenized_without_special_tokens():
    assert composer().encode("ab") == (ord("a"), ord("b"))
    assert composer().compose([Piece("ab")]).token_ids == (ord("a"), ord("b"))


def test_a_document_of_bytes_that_are_not_utf8_is_refused_saying_where():
    """On a real tokenizer (a char tokenizer takes anything): a document read with surrogateescape from bytes that
    are no UTF-8 is a ValueError naming the character, not the tokenizer's TypeError about its input types."""
    pieces = composer(bos_tokenizer())
    with pytest.raises(ValueError, match=r"the text holds '\\udce9' at character 9, which is no Unicode character"):
        pieces.compose([Piece("hello caf\udce9")])
    with pytest.raises(TypeError, match="TextEncodeInput"):  # NOTE: what the guard stands in front of
        bos_tokenizer().encode("caf\udce9")
    assert pieces.encode("hello world") == tuple(bos_tokenizer().encode("hello world", add_special_tokens=False))


def test_an_empty_last_piece_leaves_a_prompt_that_is_not_empty():
    assert composer().compose([Piece("ab"), Piece("")]).token_ids == (ord("a"), ord("b"))


def test_a_marker_inside_the_first_piece_is_refused():
    with pytest.raises(ValueError, match=r"piece 0 \(lead\) contains the PDEP control token at offset 1"):
        composer().compose([Piece((50, P, 51), label="lead")])


def test_a_prompt_that_needs_no_padding_needs_no_pad_id():
    no_pad = composer(control=ControlTokens(ssep_id=S, pdep_id=P))
    assert no_pad.compose([Piece("abcd")], pad_end=True).token_ids == tuple(map(ord, "abcd"))
    assert no_pad.compose([Piece("abc")]).token_ids == tuple(map(ord, "abc"))


def test_chat_false_ignores_the_tokenizers_chat_template():
    tokenizer = CharTokenizer(chat_template="chatml")
    assert composer(tokenizer, chat=False).chat_frame("sys") == ("sys\n", "")
    assert tokenizer.rendered == []
    assert composer(tokenizer).chat_frame("sys") == ("<sys>[", "]")


def test_an_empty_system_text_is_a_system_turn_and_none_is_the_templates_default():
    tokenizer = CharTokenizer(chat_template="chatml")
    assert composer(tokenizer).chat_frame("") == ("<>[", "]")
    assert composer(tokenizer).chat_frame(None) == ("<default>[", "]")


def test_an_epic_document_that_fits_its_link_block_has_no_ssep_rest():
    # B = 4: "a\n\n" is 3 tokens, all of the link block (marker + B - 1 tokens)
    prompt = composer(chat=False).epic(None, ["a"], "q")
    assert prompt.text == "|a\n\n" + "|q"
    assert prompt.labels == ("link 0", "question")
    assert [s.kind for s in prompt.segments] == [SegmentKind.PDEP, SegmentKind.PDEP]


def test_a_piece_with_two_markers_is_refused_naming_the_first():
    """The error points at the first marker in the content, where the user's text first went wrong."""
    with pytest.raises(ValueError, match=r"piece 0 \(doc\) contains the PDEP control token at offset 1"):
        composer().compose([Piece((50, P, 51, S), label="doc")])


def test_without_a_chat_template_an_empty_system_text_adds_no_line():
    """No template: a system text leads with its newline, but an empty one adds nothing (as None does)."""
    assert composer(chat=False).chat_frame("") == ("", "") == composer(chat=False).chat_frame(None)
    assert composer(chat=False).block_attention("", ["d"], "q").text == "|d\n\n" + "|q"


def test_for_llm_takes_the_llms_tokenizer_markers_block_size_and_chat_switch():
    """llm.composer composes for the engine's own block size and markers; no tokenizer is an error naming the model."""
    tokenizer = CharTokenizer(chat_template="chatml")
    config = SimpleNamespace(model_dir=Path("tiny-model"), control=CONTROL, cache=CacheConfig(block_size=8))
    llm = SimpleNamespace(tokenizer=tokenizer, config=config)
    plain = PromptComposer.for_llm(llm, chat=False)
    assert (plain.tokenizer, plain.control, plain.block_size, plain.chat) == (tokenizer, CONTROL, 8, False)
    assert PromptComposer.for_llm(llm).chat
    with pytest.raises(ValueError, match="tiny-model has no tokenizer: compose pieces from token ids"):
        PromptComposer.for_llm(SimpleNamespace(tokenizer=None, config=config))


class _CountingTokenizer:
    """One token a character; counts the texts it was asked to encode."""

    chat_template = None

    def __init__(self):
        self.calls = 0

    def encode(self, text, add_special_tokens=False):
        self.calls += 1
        return [ord(c) for c in text]


def test_the_token_memo_keeps_the_texts_used_last_and_forgets_the_oldest(monkeypatch):
    """A long-lived composer (the app's, an LLM's) sees endless questions: its memo holds TOKEN_CACHE_ENTRIES texts,
    dropping the one used longest ago; a text used again is young again and still served from the memo."""
    from minipic_lite import prompts

    monkeypatch.setattr(prompts, "TOKEN_CACHE_ENTRIES", 3)
    tokenizer = _CountingTokenizer()
    composer = prompts.PromptComposer(tokenizer, ControlTokens())
    for text in ("a", "b", "c", "a", "d"):  # "a" used again before "d" arrives: "b" is the oldest then
        assert composer.encode(text) == tuple(ord(c) for c in text)
    assert tokenizer.calls == 4 and list(composer._token_cache) == ["c", "a", "d"]
    composer.encode("a")
    assert tokenizer.calls == 4, "a remembered text is not encoded again"


class _TwoSlotTemplate(_CountingTokenizer):
    chat_template = "repeats the user's text"

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        user = messages[-1]["content"]
        return f"<user>{user}</user><echo>{user}</echo><assistant>"


def test_a_chat_template_that_repeats_the_users_text_is_refused_by_name():
    """The chat frame is the template rendered around the user's text once: a template that renders it twice (or
    drops it) cannot frame a prompt, and the error says so and how to compose without it."""
    from minipic_lite.prompts import PromptComposer

    with pytest.raises(ValueError, match=r"rendered the user's text 2 times, not once: compose with chat=False"):
        PromptComposer(_TwoSlotTemplate(), ControlTokens()).chat_frame("be brief")
    assert PromptComposer(_TwoSlotTemplate(), ControlTokens(), chat=False).chat_frame("be brief") == ("be brief\n", "")


def test_a_real_tokenizer_that_adds_a_bos_puts_none_into_a_composed_prompt():
    """Every piece is tokenized without special tokens: a Hugging Face tokenizer that adds a BOS to each encode (Llama
    2's kind) leaves the one BOS its chat template writes, at the start, and none before each document or the
    question."""
    tokenizer = bos_tokenizer()

    def ids(words: str) -> tuple[int, ...]:
        return tuple(tokenizer.convert_tokens_to_ids(words.split()))

    assert tokenizer.encode("foo bar") == list(ids("<s> foo bar"))  # the tokenizer's own default adds it
    ssep, pdep, pad = ids("<ssep> <pdep> <pad>")
    real = PromptComposer(tokenizer, ControlTokens(ssep_id=ssep, pdep_id=pdep, pad_id=pad), block_size=4)
    prompt = real.block_attention(None, ["foo bar", "bar"], "hello")
    blocks = ["<s> <|im_start|> user <pad>", "<ssep> foo bar <pad>", "<ssep> bar <pad> <pad>",
              "<pdep> hello <|im_end|> <|im_start|>", "assistant"]  # fmt: skip
    assert prompt.token_ids == ids(" ".join(blocks))


@pytest.mark.parametrize("recipe", ["prefix", "block_attention", "epic"])
def test_documents_given_as_one_string_are_refused_not_split_into_characters(recipe):
    """`block_attention(system, "a document", q)` made each character a document (an SSEP span a character)."""
    with pytest.raises(TypeError, match="documents must be a list of strings, got one str"):
        composer().recipe(recipe, "sys", "a document", "q")
    with pytest.raises(TypeError, match="documents must be a list of strings, got one str"):
        composer().span_prompts("block_attention", "a document")
    with pytest.raises(TypeError, match="documents must be a list of strings, got NoneType"):
        composer().recipe(recipe, "sys", None, "q")


@pytest.mark.parametrize("recipe", ["prefix", "block_attention", "epic"])
def test_a_document_or_question_that_is_no_string_names_itself(recipe):
    """None or a number among the documents was Python's "unsupported operand type(s) for +"."""
    with pytest.raises(TypeError, match="document 1 must be a string, got NoneType"):
        composer().recipe(recipe, "sys", ["ok", None], "q")
    with pytest.raises(TypeError, match="question must be a string, got int"):
        composer().recipe(recipe, "sys", ["ok"], 5)
    with pytest.raises(TypeError, match="system must be a string or None, got int"):
        composer().recipe(recipe, 5, ["ok"], "q")


def test_warming_the_spans_of_an_unknown_recipe_or_of_a_schema_without_modules_names_the_problem():
    with pytest.raises(ValueError, match="unknown recipe 'nope': expected one of prefix, block_attention"):
        composer().span_prompts("nope", ["d"])
    with pytest.raises(TypeError, match="schema item 0 must be a Module or a Param, got str"):
        composer().span_prompts("prompt_cache", ["d"])  # was: 'str' object has no attribute 'text'


@pytest.mark.parametrize(
    "make",
    [lambda: mp.Module(None), lambda: mp.Param(5), lambda: mp.Module("t", name=3)],
    ids=["Module-None", "Param-int", "name-int"],
)
def test_a_schema_item_of_no_text_is_refused_when_made(make):
    """`Module(None)` was taken and failed inside the tokenizer, once a prompt was composed."""
    with pytest.raises(TypeError, match=r"(Module|Param)\.(text must be a string|name must be a string or None)"):
        make()


@pytest.mark.parametrize(
    ("content", "described"),
    [(None, "NoneType"), (5, "int"), ([1, "a"], "a list of int, str"), ((2.5, 1), "a tuple of float, int")],
    ids=["None", "int", "list-with-a-str", "tuple-with-a-float"],
)
def test_a_piece_of_neither_text_nor_token_ids_is_refused_naming_what_it_got(content, described):
    """The error says what the content was: its type, and for an iterable the types of its items, sorted."""
    with pytest.raises(TypeError, match=rf"^Piece\.content must be a string or token ids, got {described}$"):
        Piece(content)


@pytest.mark.parametrize(
    ("t", "expected"),
    [(7, True), (np.int64(7), True), (torch.tensor(7), True), (True, False), (7.0, False), ("7", False)],
    ids=["int", "numpy-int64", "torch-scalar", "bool", "float", "str"],
)
def test_is_token_id_takes_integers_of_any_kind_but_no_bool(t, expected):
    """Token ids may be numpy's or torch's integers; a bool is no token id, nor is a float or a string."""
    assert is_token_id(t) is expected


def test_composed_prompts_pieces_and_schema_items_are_values_that_cannot_change():
    """A Prompt, a Piece and a Module are frozen: equal ones hash alike (usable as keys), and none can be changed
    after it is made (a prompt's tokens stay those it was composed and checked with)."""
    prompt = composer().compose([Piece("ab"), Piece("c", SegmentKind.SSEP)])
    again = composer().compose([Piece("ab"), Piece("c", SegmentKind.SSEP)])
    assert prompt == again and hash(prompt) == hash(again)
    for value, name in ((prompt, "token_ids"), (Piece((5, 6)), "content"), (mp.Module("m"), "text")):
        assert hash(value) == hash(copy.copy(value))
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(value, name, "changed")


def test_a_composers_repr_leaves_out_its_tokenizer_and_token_memo():
    """The repr of a composer stays one short line: the tokenizer and the memo of encoded texts are left out."""
    c = composer()
    c.encode("memo")
    assert repr(c) == "PromptComposer(control=ControlTokens(ssep_id=1, pdep_id=2, pad_id=3), block_size=4, chat=True)"
