"""From the form's fields to a composed prompt: documents as text, their order, the input bounds.

The documents box holds one document per section, sections separated by a line of three dashes:

    Paul Graham wrote ...
    ---
    The second document ...

For `prompt_cache`, each section is a `Module` (an SSEP span), or a `Param` (a PDEP segment) when it starts
with "param:". Every bound is checked before anything is tokenized or queued, and a broken one raises
`InputError` with the message the app shows.
"""

from __future__ import annotations

import re

from minipic_lite.prompts import RECIPES, Module, Param, Prompt, PromptComposer, first_marker

SEPARATOR = "---"
PARAM_PREFIX = "param:"
MAX_DOCUMENTS = 8
MAX_DOCUMENT_CHARS = 4_000
MAX_SYSTEM_CHARS = 4_000
MAX_QUESTION_CHARS = 1_000
MAX_NEW_TOKENS = 256
MAX_REPETITION_PENALTY = 2.0  # the slider's range is 1 (none) to this
HYBRID_RECIPES = ("prefix",)  # the engine refuses span markers on a hybrid model
OPENING_CHARS = 30  # of a document named in a message
MAX_PROMPT_TOKENS = 4_096  # a 2-core CPU prefills 3,800 tokens of SmolLM2 in ~27 s (ui/__main__.py): keep it there

_SEPARATOR_LINE = re.compile(rf"^\s*{SEPARATOR}\s*$", re.MULTILINE)


class InputError(ValueError):
    """Input outside the app's bounds: the message is shown to the user as it is."""


def split_documents(text: str) -> list[str]:
    return [doc.strip() for doc in _SEPARATOR_LINE.split(text or "") if doc.strip()]


def join_documents(documents: list[str]) -> str:
    return f"\n{SEPARATOR}\n".join(documents)


def reverse_documents(text: str) -> str:
    return join_documents(split_documents(text)[::-1])


def rotate_documents(text: str) -> str:
    """The last document first: every document moves to another offset."""
    docs = split_documents(text)
    return join_documents(docs[-1:] + docs[:-1])


def check_inputs(recipe: str, system: str, documents: list[str], question: str, max_tokens) -> None:
    if recipe not in RECIPES:
        raise InputError(f"Unknown recipe {recipe!r}: choose one of {', '.join(RECIPES)}.")
    if not question.strip():
        raise InputError("Write a question.")
    if len(documents) > MAX_DOCUMENTS:
        raise InputError(f"Too many documents: {len(documents)} (at most {MAX_DOCUMENTS}).")
    for i, doc in enumerate(documents):
        if len(doc) > MAX_DOCUMENT_CHARS:
            # NOTE: named by its opening words too: the grid counts segments from 0 (doc 0, module 0, ...)
            raise InputError(
                f"Document {i + 1} of {len(documents)} ({opening(doc)}) is too long: {len(doc):,} characters "
                f"(at most {MAX_DOCUMENT_CHARS:,})."
            )
    if len(system) > MAX_SYSTEM_CHARS:
        raise InputError(f"The system prompt is too long: {len(system):,} characters (at most {MAX_SYSTEM_CHARS:,}).")
    if len(question) > MAX_QUESTION_CHARS:
        raise InputError(f"The question is too long: {len(question):,} characters (at most {MAX_QUESTION_CHARS:,}).")
    if (
        not isinstance(max_tokens, int | float)
        or not 1 <= max_tokens <= MAX_NEW_TOKENS
        or max_tokens != int(max_tokens)
    ):
        raise InputError(f"Max new tokens must be a whole number from 1 to {MAX_NEW_TOKENS}, got {max_tokens!r}.")


def check_repetition_penalty(value) -> float:
    """The slider's repetition penalty as a float, from 1 (none) to MAX_REPETITION_PENALTY; else an InputError."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 1 <= value <= MAX_REPETITION_PENALTY:
        raise InputError(f"Repetition penalty must be a number from 1 to {MAX_REPETITION_PENALTY:g}, got {value!r}.")
    return float(value)


def opening(text: str, num_chars: int = OPENING_CHARS) -> str:
    """The first words of `text`, quoted: enough for a user to tell which document a message means."""
    text = " ".join(text.split())
    return repr(text if len(text) <= num_chars else text[:num_chars].rstrip() + "…")


def check_marker_texts(composer: PromptComposer, system: str, documents: list[str], question: str) -> None:
    """A span marker's text in a field (SmolLM2's `<repo_name>`, `<reponame>`) tokenizes as the marker itself, which
    the composer refuses in a piece ("piece 1 (doc 0) contains the SSEP control token"): said here in the form's
    words, naming the field. Found as the composer finds it, in the field's tokens."""
    fields = [("The system prompt", system)]
    fields += [(f"Document {i + 1} of {len(documents)} ({opening(d)})", d) for i, d in enumerate(documents)]
    for name, text in [*fields, ("The question", question)]:
        found = first_marker(composer.tokenizer, composer.encode(text), composer.control)
        if found:
            _, marker, kind = found
            raise InputError(
                f"{name} holds {marker!r}, the text of this model's {kind.name} span marker, which a field may not "
                "hold: remove it."
            )


def check_recipe_for_model(recipe: str, is_hybrid: bool) -> None:
    """A hybrid's recurrent layers see every token: only `prefix` (no span markers) runs on it."""
    if is_hybrid and recipe in RECIPES and recipe not in HYBRID_RECIPES:
        raise InputError(
            f"This model is a hybrid: its recurrent layers see every token, so a span recipe ({recipe}) cannot run "
            f"on it. Use {' or '.join(HYBRID_RECIPES)}: a shared prefix resumes from a saved recurrent state."
        )


def schema(documents: list[str]) -> list[Module | Param]:
    """prompt_cache's schema: a section starting with "param:" is a parameter, any other a module."""
    return [
        Param(d[len(PARAM_PREFIX) :].strip()) if d.lower().startswith(PARAM_PREFIX) else Module(d) for d in documents
    ]


def build_prompt(
    composer: PromptComposer,
    recipe: str,
    system: str,
    documents: list[str],
    question: str,
    max_tokens: int,
    max_model_len: int,
) -> Prompt:
    """The recipe's prompt, checked against the bounds (and the model's context, with room for the answer)."""
    check_inputs(recipe, system, documents, question, max_tokens)
    check_marker_texts(composer, system, documents, question)
    items = schema(documents) if recipe == "prompt_cache" else documents
    prompt = composer.recipe(recipe, system.strip() or None, items, question.strip())
    limit = min(MAX_PROMPT_TOKENS, max_model_len - int(max_tokens))
    if len(prompt) > limit:
        raise InputError(
            f"The prompt is too long: {len(prompt):,} tokens (at most {limit:,} here). Use fewer or shorter documents."
        )
    return prompt
