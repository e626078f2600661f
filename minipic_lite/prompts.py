"""Composing span prompts: pieces, padding, markers, the chat template, and the four PIC recipes (DESIGN §2).

    llm = mp.LLM()
    c = llm.composer                                   # a PromptComposer bound to llm's tokenizer, markers, B
    prompt = c.block_attention(system, documents, question)
    out = llm.generate(prompt, mp.SamplingParams(max_tokens=32, temperature=0))[0]
    print(mp.format_report(out.cache_report))          # which blocks hit, which were computed

Each piece is tokenized on its own, so a document has the same tokens in every prompt, and is padded with
`pad_id` so that the next marker sits at a block start. Recipes (the tokens of one final prompt, B = block size;
`head` is the chat template up to the user's text, `tail` closes the user turn and opens the assistant's):

    prefix           [head doc_1 … doc_n question tail]                     no markers: plain prefix caching
    block_attention  [head] [S doc_1] … [S doc_n] [P question tail]        documents cached position-free
    epic             [head] ([P first B-1 tokens of doc_i] [S rest of doc_i])… [P question tail]
                     the link block (P) is recomputed with full context every time, the rest is reused
    prompt_cache     [head] [S module] / [P parameter] … in schema order, then [P question tail]

(S = SSEP, P = PDEP; each [...] is padded to a block boundary before the next marker.) `span_prompts` gives the
reusable spans alone ([S doc] with its padding), to warm the cache ahead of the final prompts; their blocks hash
exactly as inside a final prompt.
"""

from __future__ import annotations

import re
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field

from minipic_lite.config import DEFAULT_BLOCK_SIZE, ControlTokens
from minipic_lite.hashing import pack_token_ids
from minipic_lite.spans import Segment, SegmentKind, SpanLayout, find_markers, span_layout

RECIPES = ("prefix", "block_attention", "epic", "prompt_cache")
DOCUMENT_SEPARATOR = "\n\n"  # appended to every document's text before it is tokenized
_USER_SLOT = "\x00minipic-user-content\x00"  # stands in for the user's text when the chat template is rendered
TOKEN_CACHE_ENTRIES = 4096  # texts a composer keeps the tokens of (documents, questions, chat frames)


@dataclass(frozen=True)
class Prompt:
    """A composed prompt: token ids with span markers, ready for `LLM.generate` / `LLM.stream` / `mp.generate`.

    The engine re-derives segments, `visible_start` and hashes from `token_ids` and its control tokens; the
    prompt only adds what tokens cannot say: which block size and markers it was composed for (checked), that it
    asks for span semantics (an error where they cannot apply), and a label per segment for the cache report.

    Its ids are checked and packed once, as it is made (`hashing.pack_token_ids`: Python ints, a ValueError naming
    any other): every request made of it reads them from there, so a generate() of it does not check and pack them
    again (16.6k ids: ~0.2 ms on 2 CPU cores, in its time to first token).
    """

    token_ids: tuple[int, ...]
    block_size: int
    control: ControlTokens
    labels: tuple[str | None, ...] = ()  # one per segment, in order
    recipe: str | None = None
    text: str | None = None  # the decoded prompt (for display)
    _bytes: bytes | None = field(init=False, default=None, repr=False, compare=False)  # token_ids packed

    def __post_init__(self):
        token_ids, data = pack_token_ids(self.token_ids)
        object.__setattr__(self, "token_ids", tuple(token_ids))
        object.__setattr__(self, "_bytes", data)

    def __len__(self) -> int:
        return len(self.token_ids)

    def packed(self) -> tuple[list[int], bytes | None]:
        """`hashing.pack_token_ids` of its ids, made when it was: a new list of them, and their bytes."""
        return list(self.token_ids), self._bytes

    @property
    def layout(self) -> SpanLayout:
        return span_layout(self.token_ids, self.control, self.block_size, data=self._bytes)

    @property
    def segments(self) -> tuple[Segment, ...]:
        return self.layout.segments

    @property
    def visible_start(self) -> tuple[int, ...]:
        return self.layout.visible_start

    @property
    def has_markers(self) -> bool:
        return bool(find_markers(self.token_ids, self.control, self._bytes))


@dataclass(frozen=True)
class Piece:
    """One piece of a prompt: text (tokenized on its own) or token ids, and the marker that opens it.

    `marker` None continues the current segment (no padding before it); SSEP / PDEP open a new segment.
    """

    content: str | tuple[int, ...]
    marker: SegmentKind | None = None
    label: str | None = None

    def __post_init__(self):
        if isinstance(self.content, str):
            return
        token_ids = None
        try:
            token_ids = tuple(self.content)  # NOTE: any iterable of integers (a list, a numpy array, a generator)
            array("q", token_ids)  # NOTE: each an integer, checked in C: in Python 2,048 ids took 170 us a piece
        except (TypeError, OverflowError):
            raise TypeError(
                f"Piece.content must be a string or token ids, got {_describe(self.content, token_ids)}"
            ) from None
        object.__setattr__(self, "content", token_ids)


@dataclass(frozen=True)
class SchemaItem:
    """An item of a Prompt Cache schema: its text and an optional name for the cache report."""

    text: str
    name: str | None = None

    def __post_init__(self):
        kind = type(self).__name__
        if not isinstance(self.text, str):
            raise TypeError(f"{kind}.text must be a string, got {type(self.text).__name__}")
        if self.name is not None and not isinstance(self.name, str):
            raise TypeError(f"{kind}.name must be a string or None, got {type(self.name).__name__}")


class Module(SchemaItem):
    """A reusable prompt module (Prompt Cache): an SSEP span, cached wherever it appears."""


class Param(SchemaItem):
    """A user parameter (Prompt Cache): a PDEP segment, which sees and hashes everything before it."""


@dataclass
class PromptComposer:
    """Builds span prompts for one tokenizer, set of control tokens and block size.

    Args:
        tokenizer: a Hugging Face tokenizer (its chat template frames the recipes when `chat` is True).
        control: the span markers (`ControlTokens`); recipes with markers need ssep_id, pdep_id and pad_id.
        block_size: the engine's KV block size.
        chat: wrap the recipes in the chat template (system turn, user turn, assistant header).
    """

    tokenizer: object = field(repr=False)
    control: ControlTokens
    block_size: int = DEFAULT_BLOCK_SIZE
    chat: bool = True
    _token_cache: dict[str, tuple[int, ...]] = field(default_factory=dict, repr=False)

    @classmethod
    def for_llm(cls, llm, chat: bool = True) -> PromptComposer:
        if llm.tokenizer is None:
            raise ValueError(f"{llm.config.model_dir} has no tokenizer: compose pieces from token ids")
        return cls(llm.tokenizer, llm.config.control, llm.config.cache.block_size, chat)

    def encode(self, text: str) -> tuple[int, ...]:
        """The tokens of `text` alone (no special tokens added), memoized: a piece tokenizes the same everywhere.
        The memo keeps the TOKEN_CACHE_ENTRIES texts used last (a long-lived composer sees endless questions)."""
        tokens = self._token_cache.pop(text, None)
        if tokens is None:
            tokens = tuple(encode_text(self.tokenizer, text))
            if len(self._token_cache) >= TOKEN_CACHE_ENTRIES:
                del self._token_cache[next(iter(self._token_cache))]  # NOTE: dicts keep insertion order: the oldest
        self._token_cache[text] = tokens  # NOTE: re-inserted: the youngest
        return tokens

    # -- pieces -> prompt --------------------------------------------------------------------------------

    def compose(self, pieces: Sequence[Piece], recipe: str | None = None, pad_end: bool = False) -> Prompt:
        """Concatenate pieces, padding before each marker so it starts a block (`pad_end`: pad the end too)."""
        token_ids: list[int] = []
        labels: list[str | None] = []
        for i, piece in enumerate(pieces):
            tokens = self.encode(piece.content) if isinstance(piece.content, str) else tuple(piece.content)
            self._check_piece(i, piece, tokens)
            if piece.marker is not None:
                marker_id = self._marker_id(piece.marker)
                token_ids += self._padding(len(token_ids))
                token_ids.append(marker_id)
                labels.append(piece.label)
            elif not token_ids and tokens:
                labels.append(piece.label)  # the leading segment
            token_ids += tokens
        if pad_end:
            token_ids += self._padding(len(token_ids))
        if not token_ids:
            raise ValueError("the composed prompt is empty")
        text = self.tokenizer.decode(token_ids, skip_special_tokens=False) if self.tokenizer is not None else None
        return Prompt(tuple(token_ids), self.block_size, self.control, tuple(labels), recipe, text)

    def _check_piece(self, index: int, piece: Piece, tokens: tuple[int, ...]) -> None:
        inside = find_markers(tokens, self.control)
        if inside:
            offset, kind = inside[0]
            raise ValueError(
                f"piece {index} ({piece.label or 'unlabelled'}) contains the {kind.name} control token at offset "
                f"{offset}: span markers are placed by the composer, not written into the content"
            )

    def _padding(self, num_tokens: int) -> list[int]:
        num_pad = -num_tokens % self.block_size
        if num_pad and self.control.pad_id is None:
            raise ValueError("padding needs a pad_id in the control tokens")
        return [self.control.pad_id] * num_pad

    def _marker_id(self, kind: SegmentKind) -> int:
        marker_id = self.control.ssep_id if kind is SegmentKind.SSEP else self.control.pdep_id
        if marker_id is None or self.control.pad_id is None:
            raise ValueError(
                f"this model has no {kind.name} control token (ControlTokens {self.control}): pass "
                "LLM(control_tokens=ControlTokens(ssep_id=..., pdep_id=..., pad_id=...)) to use span recipes"
            )
        return marker_id

    # -- the chat frame ----------------------------------------------------------------------------------

    def chat_frame(self, system: str | None) -> tuple[str, str]:
        """(head, tail): the chat template rendered around the user's text, with `system` as the system turn.

        head = "<|im_start|>system\\n{system}<|im_end|>\\n<|im_start|>user\\n" and
        tail = "<|im_end|>\\n<|im_start|>assistant\\n" for SmolLM2 (its default system turn when system is None).
        """
        if not self.chat or getattr(self.tokenizer, "chat_template", None) is None:
            return (system + "\n" if system else ""), ""
        messages = [{"role": "user", "content": _USER_SLOT}]
        if system is not None:
            messages.insert(0, {"role": "system", "content": system})
        rendered = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        parts = rendered.split(_USER_SLOT)
        if len(parts) != 2:
            raise ValueError(
                f"the tokenizer's chat template rendered the user's text {len(parts) - 1} times, not once: compose "
                "with chat=False (PromptComposer(..., chat=False)) and frame the turns yourself"
            )
        return parts[0], parts[1]

    def _document(self, text: str) -> tuple[int, ...]:
        return self.encode(text + DOCUMENT_SEPARATOR)

    # -- recipes -----------------------------------------------------------------------------------------

    def prefix(self, system: str | None, documents: Sequence[str], question: str) -> Prompt:
        """No markers and no padding: the plain prompt, for prefix caching."""
        documents = _checked_recipe_texts(system, documents, question)
        head, tail = self.chat_frame(system)
        pieces = [Piece(head, label="prompt"), *(Piece(self._document(d)) for d in documents)]
        return self.compose([*pieces, Piece(question + tail)], "prefix")

    def block_attention(self, system: str | None, documents: Sequence[str], question: str) -> Prompt:
        """[system] [SSEP doc_1] … [SSEP doc_n] [PDEP question + answer header]."""
        documents = _checked_recipe_texts(system, documents, question)
        head, tail = self.chat_frame(system)
        docs = [Piece(self._document(d), SegmentKind.SSEP, f"doc {i}") for i, d in enumerate(documents)]
        question_piece = Piece(question + tail, SegmentKind.PDEP, "question")
        return self.compose([Piece(head, label="system"), *docs, question_piece], "block_attention")

    def epic(self, system: str | None, documents: Sequence[str], question: str) -> Prompt:
        """Per document [PDEP first B-1 tokens] [SSEP the rest]; then [PDEP question + answer header].

        The PDEP link block (marker + B-1 tokens: exactly one block) sees the whole prompt before it, so it is
        recomputed whenever that changes; the SSEP rest of the document is reused wherever it sits.
        """
        documents = _checked_recipe_texts(system, documents, question)
        head, tail = self.chat_frame(system)
        pieces = [Piece(head, label="system")]
        for i, doc in enumerate(documents):
            link, rest = self._epic_split(self._document(doc))
            pieces.append(Piece(link, SegmentKind.PDEP, f"link {i}"))
            if rest:
                pieces.append(Piece(rest, SegmentKind.SSEP, f"doc {i}"))
        pieces.append(Piece(question + tail, SegmentKind.PDEP, "question"))
        return self.compose(pieces, "epic")

    def _epic_split(self, tokens: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return tokens[: self.block_size - 1], tokens[self.block_size - 1 :]

    def prompt_cache(self, system: str | None, schema: Sequence[Module | Param], question: str) -> Prompt:
        """Modules as SSEP spans and parameters as PDEP segments, in schema order; then [PDEP question]."""
        _checked_recipe_texts(system, (), question)
        head, tail = self.chat_frame(system)
        pieces = [Piece(head, label="system")]
        for i, item in enumerate(_checked_schema(schema)):
            kind, default = (SegmentKind.SSEP, "module") if isinstance(item, Module) else (SegmentKind.PDEP, "param")
            pieces.append(Piece(item.text, kind, item.name or f"{default} {i}"))
        pieces.append(Piece(question + tail, SegmentKind.PDEP, "question"))
        return self.compose(pieces, "prompt_cache")

    def recipe(self, name: str, system: str | None, items: Sequence, question: str) -> Prompt:
        """The recipe called `name` (one of RECIPES); `items` are documents, or the schema for prompt_cache."""
        if name not in RECIPES:
            raise ValueError(f"unknown recipe {name!r}: expected one of {', '.join(RECIPES)}")
        return getattr(self, name)(system, items, question)

    def span_prompts(self, recipe: str, items: Sequence) -> list[Prompt]:
        """The reusable spans of a recipe as prompts of their own ([SSEP span + padding]), to warm the cache.

        Their blocks hash exactly as in a final prompt of the same recipe, so the final prompt hits all of them.
        """
        if recipe not in RECIPES:
            raise ValueError(f"unknown recipe {recipe!r}: expected one of {', '.join(RECIPES)}")
        if recipe in ("block_attention", "epic"):
            spans = []
            for i, doc in enumerate(_checked_documents(items)):
                tokens = self._document(doc)
                tokens = self._epic_split(tokens)[1] if recipe == "epic" else tokens
                if tokens:
                    spans.append(Piece(tokens, SegmentKind.SSEP, f"doc {i}"))
        elif recipe == "prompt_cache":
            items = _checked_schema(items)
            spans = [Piece(m.text, SegmentKind.SSEP, m.name or f"module {i}") for i, m in enumerate(items)]
            spans = [p for p, m in zip(spans, items, strict=True) if isinstance(m, Module)]
        else:
            raise ValueError(f"recipe {recipe!r} has no position-independent spans to warm")
        return [self.compose([piece], recipe, pad_end=True) for piece in spans]


def _checked_recipe_texts(system, documents, question) -> list[str]:
    """A recipe's texts, each a string (system may be None: the chat template's own): a TypeError names the one that
    is not, where Python would say "unsupported operand type(s) for +" or split one string into characters."""
    if system is not None and not isinstance(system, str):
        raise TypeError(f"system must be a string or None, got {type(system).__name__}")
    if not isinstance(question, str):
        raise TypeError(f"question must be a string, got {type(question).__name__}")
    return _checked_documents(documents)


def _checked_documents(documents) -> list[str]:
    if isinstance(documents, str) or not hasattr(documents, "__iter__"):
        got = "one str (one document is [text])" if isinstance(documents, str) else type(documents).__name__
        raise TypeError(f"documents must be a list of strings, got {got}")
    documents = list(documents)
    for i, doc in enumerate(documents):
        if not isinstance(doc, str):
            raise TypeError(f"document {i} must be a string, got {type(doc).__name__}")
    return documents


def _checked_schema(schema) -> list[Module | Param]:
    schema = list(schema)
    for i, item in enumerate(schema):
        if not isinstance(item, Module | Param):
            raise TypeError(f"schema item {i} must be a Module or a Param, got {type(item).__name__}")
    return schema


SURROGATE = re.compile("[\ud800-\udfff]")  # no Unicode character: what bytes that are no UTF-8 become in a str


def check_unicode(text: str, what: str = "the text") -> None:
    """A ValueError where `text` holds a lone surrogate (bytes that were no UTF-8, read with Python's
    surrogateescape, as standard input is in a C locale): tokenizers refuse it with a TypeError about input types."""
    if found := SURROGATE.search(text):
        raise ValueError(
            f"{what} holds {found.group()!r} at character {found.start()}, which is no Unicode character (bytes "
            "that are not UTF-8, read as text?)"
        )


def encode_text(tokenizer, text: str) -> list[int]:
    """`text`'s token ids, no special tokens added; text that is no Unicode is a ValueError that says where."""
    try:
        return tokenizer.encode(text, add_special_tokens=False)
    except TypeError:
        check_unicode(text)
        raise


def first_marker(tokenizer, token_ids: Sequence[int], control: ControlTokens) -> tuple[int, str, SegmentKind] | None:
    """The first span marker among `token_ids`: its index, its token's text and its kind (None: no marker), to name
    a marker's text back to whoever typed it."""
    found = find_markers(token_ids, control)
    if not found:
        return None
    index, kind = found[0]
    return index, tokenizer.convert_ids_to_tokens(token_ids[index]), kind


def is_token_id(t) -> bool:
    """An integer of any kind (numpy's, torch's: what the engine's `as_token_ids` takes), not a bool."""
    return hasattr(type(t), "__index__") and not isinstance(t, bool)


def _describe(content, items: tuple | None) -> str:
    """What a piece's content is: its type, and for an iterable the types of its items."""
    if items is None:
        return type(content).__name__
    return f"a {type(content).__name__} of {', '.join(sorted({type(t).__name__ for t in items}))}"
