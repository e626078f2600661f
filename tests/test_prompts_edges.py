"""Edges of the prompt composer (prompts.py) on a character tokenizer: empty pieces, padding without a pad id,
markers in the first piece, the chat frame's switches, and epic documents that fit in their link block."""

import pytest

from minipic_lite.config import ControlTokens
from minipic_lite.prompts import Piece, PromptComposer
from minipic_lite.spans import SegmentKind

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
