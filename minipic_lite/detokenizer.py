"""A request's output text, decoded as its tokens come.

Stop strings and streams need the text after every token. Decoding the whole output again each time costs O(length)
per token, O(length²) per answer: on SmolLM2's tokenizer 0.54 ms for 2,000 tokens and 2.3 ms for 8,000, per request
and step, more than a GPU decode step at batch 64. `Detokenizer` feeds each new token to the `tokenizers` library's
`DecodeStream`, which returns the text that token completes (None while a character's bytes are still incomplete), so
a step costs the same at any length. Its text is the full decode's less an incomplete character at the end, which
is what a stream shows anyway (`engine.shown_text`); a finished request's text is one full decode.
`tests/test_detokenizer.py` holds it to `tokenizer.decode`.

Where a stream cannot give the full decode's text (a slow tokenizer, one that cleans up spaces after decoding, or
a byte-fallback decoder fed bytes that are no UTF-8, where `DecodeStream` raises), `Detokenizer` decodes the whole
output each time, as before. A byte-fallback decoder fed such bytes without raising may also show a different count
of '\ufffd' than its full decode (which turns a run of byte tokens that is no UTF-8 into one '\ufffd' a byte, the
valid ones before it too); the finished text is the full decode's.
"""

from __future__ import annotations

from tokenizers.decoders import DecodeStream

CONTEXT_TOKENS = 4  # tokens decoded before the ones a stream holds, for their context (a leading space)


class Detokenizer:
    """The text of `ids[first:]` for a list of token ids that only grows; each `update` reads the ids added since."""

    def __init__(self, tokenizer, skip_special_tokens: bool, first: int = 0):
        self.tokenizer, self.skip_special_tokens = tokenizer, skip_special_tokens
        self.backend = getattr(tokenizer, "backend_tokenizer", None)
        self.is_incremental = self.backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", 0)
        self.stream = DecodeStream(skip_special_tokens=skip_special_tokens)
        self.first = self.num_read = self.num_streamed = first  # ids[first:num_streamed] made `streamed`
        self.streamed = ""  # the stream's text: up to the last token that ended a character
        self.text = ""
        self.num_kept = 0  # characters of `text` that were its text before the last update, unchanged

    def update(self, ids: list[int]) -> str:
        """The text of `ids[first:]`, less the bytes of an incomplete character at the end."""
        start, self.num_read = self.num_read, len(ids)
        if start == len(ids):
            return self.text
        if self.is_incremental:
            try:
                chunk = self.stream.step(self.backend, ids[start:])
            except Exception:  # NOTE: a byte-fallback decoder's bytes that are no UTF-8 ("Invalid prefix")
                self.is_incremental = False
            else:
                if chunk is not None:
                    self.streamed, self.num_streamed = self.streamed + chunk, len(ids)
                self.num_kept, self.text = len(self.text), self.streamed + self.held_text(ids)
                return self.text
        # NOTE: a full decode may change earlier text (a clean-up joins " ." to the word before it)
        self.num_kept, self.text = 0, self.decode(ids[self.first :]).rstrip("\ufffd")
        return self.text

    def held_text(self, ids: list[int]) -> str:
        """The whole characters of the tokens the stream holds back (the last of them ends inside a character:
        ' 東' split as ' \\xe6' and '\\x9d\\xb1'), decoded after a few tokens before them for their context."""
        if self.num_streamed == len(ids):
            return ""
        context = max(self.first, self.num_streamed - CONTEXT_TOKENS)
        head, tail = self.decode(ids[context : self.num_streamed]), self.decode(ids[context:])
        return tail[len(head) :].rstrip("\ufffd") if tail.startswith(head) else ""

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)
